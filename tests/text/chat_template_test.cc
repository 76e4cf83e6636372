// The chat-template renderer: exact outputs for the Jinja semantics chat templates rely
// on, errors that name line:column, and the limits that keep any template or input from
// crashing or hanging a render. tests/text/test_chat_template.py compares it with jinja2
// on real model families.
#include "slim/text/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "slim/core/error.h"

namespace slim::text {
namespace {

const std::vector<ChatMessage> kChat = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};

std::string render(const std::string& source, const std::vector<ChatMessage>& messages = kChat,
                   ChatTemplateContext ctx = {"<s>", "</s>", true}) {
  return ChatTemplate(source).render(messages, ctx);
}

// The message of the Error a template gives when parsed (render = false) or rendered.
std::string error_of(const std::string& source, bool at_render = true) {
  try {
    ChatTemplate t(source);
    if (!at_render) {
      ADD_FAILURE() << "parsed: " << source;
      return "";
    }
    t.render(kChat, {"<s>", "</s>", true});
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    return e.what();
  }
  ADD_FAILURE() << "rendered: " << source;
  return "";
}

TEST(ChatTemplate, ChatMLIsTheDefault) {
  EXPECT_EQ(render(ChatTemplate::chatml()),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render(ChatTemplate::chatml(), {{"user", "x"}}, {"", "", false}),
            "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplate, TrimBlocksAndLstripBlocks) {
  // A block tag eats the newline after it and the indentation before it; {{ }} keeps both.
  EXPECT_EQ(render("{% for m in messages %}\n  {% if m.role == 'user' %}\n    {{ m.content }}\n  {% endif %}\n{% endfor %}"),
            "    Hi\n    Bye\n");
  EXPECT_EQ(render("a\n  {# note #}\nb"), "a\nb");
  EXPECT_EQ(render("  {{ 'x' }}\n"), "  x");  // and one trailing newline of the source goes
  EXPECT_EQ(render("{%- if true -%}\n\n  x  \n\n{%- endif -%}"), "x");
  EXPECT_EQ(render("  {%+ if true %}x{% endif +%}\n\n"), "  x\n");
  EXPECT_EQ(render("x {% if true %} y {% endif %} z"), "x  y  z");  // mid-line: kept
  EXPECT_EQ(render("{% if true %}\r\nA\r\n{% endif %}\r\n"), "A\n");
  EXPECT_EQ(render("{{- '  a  ' -}}\n\n{{ 'b' }}"), "  a  b");
}

TEST(ChatTemplate, LoopsAndScopes) {
  EXPECT_EQ(render("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
                   "{{ loop.length }},{% endfor %}"),
            "10TrueFalse4,21FalseFalse4,32FalseFalse4,43FalseTrue4,");
  // Variables set in a loop body live for one iteration; a namespace carries state out.
  EXPECT_EQ(render("{% set c = 'out' %}{% for m in messages %}{{ c }}{% set c = m.role %}{{ c }} {% endfor %}{{ c }}"),
            "outsystem outuser outassistant outuser out");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for m in messages if m.role == 'user' %}"
                   "{% set ns.n = ns.n + loop.length %}{% endfor %}{{ ns.n }}"),
            "4");
  EXPECT_EQ(render("{% for i in range(6) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}"
                   "{% endif %}{{ i }}{% endfor %}{% for x in [] %}a{% else %}empty{% endfor %}"),
            "023empty");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(render("{% if messages[0]['role'] == 'system' %}{% set messages = messages[1:] %}{% endif %}"
                   "{{ messages | length }} {{ messages[0].role }}"),
            "3 user");
}

TEST(ChatTemplate, ExpressionsAsPython) {
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 'a' ~ 2 * 3 }}"),
            "3 -4 2 3.5 2.0 1024 a6");
  EXPECT_EQ(render("{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e-5 }} {{ 1e15 }}"), "0.30000000000000004 1e+16 1e-05 1000000000000000.0");
  EXPECT_EQ(render("{{ [1, 'a', none, true, {'k': (1,)}] }}"), "[1, 'a', None, True, {'k': (1,)}]");
  EXPECT_EQ(render("{{ none or 'd' }} {{ 'a' and 'b' }} {{ 1 < 2 < 3 }} {{ 'ell' in 'hello' }} {{ 3 not in [1] }}"),
            "d b True True True");
  EXPECT_EQ(render("{{ 'x' if false }}|{{ 'y' if true else 'n' }}|{{ messages[9] }}|{{ messages[-1].content }}"),
            "|y||Bye");
  EXPECT_EQ(render("{{ 'héllo'[1] }} {{ 'abcdef'[1:4] }} {{ 'abc'[::-1] }} {{ 'héllo' | length }}"), "é bcd cba 5");
  EXPECT_EQ(render("{{ 'a\\tb\\n\\x41\\u00e9\\101' }}"), "a\tb\nAéA");
}

TEST(ChatTemplate, UndefinedBehavesAsInJinja2) {
  EXPECT_EQ(render("[{{ tools }}]{{ tools is defined }} {{ tools is none }} {{ tools | default('d') }} "
                   "{{ messages[0].tool_calls is defined }} {% for t in tools %}x{% endfor %}{{ 'a' ~ tools }}"),
            "[]False False d False a");
  EXPECT_EQ(error_of("{{ tools.name }}"), "chat template line 1:9: 'tools' is undefined");
  EXPECT_EQ(error_of("{{ messages[0].nope.x }}"), "chat template line 1:20: 'dict object' has no attribute 'nope'");
  EXPECT_EQ(error_of("{{ 'a' + 1 }}"), "chat template line 1:4: can only concatenate str (not \"int\") to str");
}

TEST(ChatTemplate, FiltersAndMethods) {
  EXPECT_EQ(render("{{ '  a b  ' | trim }}|{{ 'hELLO wORLD' | capitalize }}|{{ 'hi there-you' | title }}|"
                   "{{ 'aaa' | replace('a', 'b', 2) }}|{{ [1, 2] | join(', ') }}|{{ messages | first | length }}"),
            "a b|Hello world|Hi There-You|bba|1, 2|2");
  EXPECT_EQ(render("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} "
                   "{{ messages | rejectattr('role', 'eq', 'user') | list | length }} {{ '12' | int + 1 }}"),
            "['Hi', 'Bye'] 2 13");
  EXPECT_EQ(render("{{ {'a': [1, 2.5, none], 'b': 'é\"'} | tojson }} {{ [1] | tojson(indent=2) }}"),
            "{\"a\": [1, 2.5, null], \"b\": \"é\\\"\"} [\n  1\n]");
  EXPECT_EQ(render("{{ ' x '.strip() }}|{{ 'a,b'.split(',') }}|{{ 'abc'.startswith(('x', 'a')) }}|{{ 'ab'.upper() }}"
                   "|{{ \"it's\".title() }}|{{ {'a': 1}.get('b', 2) }}"),
            "x|['a', 'b']|True|AB|It'S|2");
}

TEST(ChatTemplate, MacrosAndBlocks) {
  EXPECT_EQ(render("{% macro tag(name, close=false) %}<{{ '/' if close }}{{ name }}>{% endmacro %}"
                   "{{ tag('a') }}{{ tag('a', close=true) }}"),
            "<a></a>");
  EXPECT_EQ(render("{% set t | upper %} x {% endset %}[{{ t }}]{% filter trim %}  y  {% endfilter %}"
                   "{% with a = 2 %}{{ a * 3 }}{% endwith %}{% raw %}{{ z }}{% endraw %}"),
            "[ X ]y6{{ z }}");
}

TEST(ChatTemplate, RaiseException) {
  const std::string t = "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
                        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
                        "{% endif %}{% endfor %}";
  try {
    render(t, {{"user", "a"}, {"user", "b"}});
    FAIL() << "rendered";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_STREQ(e.what(), "Conversation roles must alternate user/assistant/user/assistant/...");
  }
  EXPECT_EQ(render(t, {{"user", "a"}, {"assistant", "b"}}), "");
}

TEST(ChatTemplate, StrftimeNowReadsTheInjectedClock) {
  ChatTemplateContext ctx{"", "", true, 1722000000};  // 2024-07-26 13:20 UTC
  const std::string out = render("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%B %-d') }}", kChat, ctx);
  EXPECT_TRUE(out == "26 Jul 2024|July 26" || out == "27 Jul 2024|July 27" || out == "25 Jul 2024|July 25") << out;
}

TEST(ChatTemplate, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("{% for m in messages %}\n  {{ m.content + }}\n{% endfor %}", false),
            "chat template line 2:18: unexpected '}}'");
  EXPECT_EQ(error_of("ok\n{% if true %}x", false), "chat template line 2:4: 'if' has no {% endif %}");
  EXPECT_EQ(error_of("{{ 'abc }}", false), "chat template line 1:4: unterminated string literal");
  EXPECT_EQ(error_of("{{ (1, 2] }}", false), "chat template line 1:9: unexpected ']', expected ')'");
  EXPECT_EQ(error_of("a {# never closed", false), "chat template line 1:3: missing end of comment tag '#}'");
  EXPECT_EQ(error_of("{{ x", false), "chat template line 1:1: missing '}}' to close '{{'");
  EXPECT_EQ(error_of("{% endif %}", false), "chat template line 1:4: unexpected tag 'endif'");
  EXPECT_EQ(error_of("{% break %}", false), "chat template line 1:4: 'break' outside a for loop");
  EXPECT_EQ(error_of("{{ 1 $ 2 }}", false), "chat template line 1:6: unexpected character '$'");
  EXPECT_EQ(error_of("{% set none = 1 %}", false), "chat template line 1:8: cannot assign to 'none'");
}

TEST(ChatTemplate, UnsupportedConstructsAreRefusedWhenParsed) {
  EXPECT_EQ(error_of("\n  {% include 'other.jinja' %}", false), "chat template line 2:6: unsupported tag 'include'");
  EXPECT_EQ(error_of("{% extends 'base' %}", false), "chat template line 1:4: unsupported tag 'extends'");
  EXPECT_EQ(error_of("{{ x | wordcount }}", false), "chat template line 1:8: unsupported filter 'wordcount'");
  EXPECT_EQ(error_of("{{ x is escaped }}", false), "chat template line 1:9: unsupported test 'escaped'");
  EXPECT_EQ(error_of("{% for x in y recursive %}{% endfor %}", false),
            "chat template line 1:15: unsupported: recursive for loops");
  EXPECT_EQ(error_of("{{ f(*args) }}", false), "chat template line 1:6: unsupported: *args and **kwargs in calls");
  EXPECT_EQ(error_of("{% do x %}", false), "chat template line 1:4: unknown tag 'do'");
  EXPECT_EQ(error_of("{{ '%s' % 1 }}"), "chat template line 1:4: printf-style '%' string formatting is not supported");
}

TEST(ChatTemplate, LimitsStopRunawayTemplates) {
  using ::testing::EndsWith;
  EXPECT_EQ(error_of("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}", false),
            "chat template line 1:104: template nested more than 100 levels deep");
  std::string chain = "{{ 1";
  for (int k = 0; k < 300; ++k) chain += " + 1";
  EXPECT_EQ(error_of(chain + " }}", false), "chat template line 1:4: expression nested more than 100 levels deep");
  std::string blocks;
  for (int k = 0; k < 200; ++k) blocks += "{% if true %}";
  EXPECT_EQ(error_of(blocks, false), "chat template line 1:1294: template nested more than 100 levels deep");

  EXPECT_THAT(error_of("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"),
              EndsWith(": the template does too much work (over 10 million steps)"));
  EXPECT_EQ(error_of("{{ range(100001) }}"),
            "chat template line 1:9: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  EXPECT_THAT(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
              EndsWith(": recursion deeper than 500 levels"));
  EXPECT_EQ(error_of("{{ 'x' * 20000000 }}"), "chat template line 1:4: text longer than 16 MiB");
  EXPECT_THAT(error_of("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(30) %}"
                       "{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
              EndsWith(": text longer than 16 MiB"));
  EXPECT_THAT(error_of("{% for i in range(20) %}{{ 'x' * 1000000 }}{% endfor %}"), EndsWith(": text longer than 16 MiB"));
  EXPECT_THAT(error_of("{% set ns = namespace(l=[]) %}{% for i in range(100) %}{% set ns.l = [ns.l] %}{% endfor %}"),
              EndsWith(": lists or dicts nested more than 50 deep"));
  EXPECT_EQ(error_of("{{ 9223372036854775807 + 1 }}"), "chat template line 1:4: integer overflow");
}

TEST(ChatTemplate, RendersConcurrentlyAndCopies) {
  const ChatTemplate t(ChatTemplate::chatml());
  const ChatTemplate copy = t;
  const std::string want = t.render(kChat, {});
  std::vector<std::thread> threads;
  std::vector<std::string> got(4);
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int r = 0; r < 50; ++r) got[k] = copy.render(kChat, {});
    });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
  EXPECT_EQ(copy.source(), ChatTemplate::chatml());
}

}  // namespace
}  // namespace slim::text
