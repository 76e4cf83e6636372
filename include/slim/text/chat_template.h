// Chat templates: the Jinja source a model ships in GGUF tokenizer.chat_template (the same
// text as Hugging Face tokenizer_config.json's chat_template), rendered as Hugging Face
// transformers renders it: jinja2's ImmutableSandboxedEnvironment with trim_blocks and
// lstrip_blocks, the loopcontrols extension ({% break %}, {% continue %}), the globals
// raise_exception() and strftime_now(), and a tojson that writes json.dumps output
// (ensure_ascii=False). The subset implemented is what real chat templates use:
// expressions, filters, tests and methods of Python's str/dict, if/for/set/macro/with/
// filter/print blocks, namespaces; the rest (include, extends, blocks, imports, call
// blocks, raw, str % formatting) is refused when the template is parsed.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace slim::text {

struct ChatMessage {
  std::string role;
  std::string content;
};

struct ChatTemplateContext {
  std::string bos_token, eos_token;  // the tokenizer's BOS/EOS text ("" when none)
  bool add_generation_prompt = true;
  // The clock strftime_now() reads (local time); unset: the current time. For tests.
  std::optional<std::time_t> now;
};

class ChatTemplate {
 public:
  // Parses once; throws Error(invalid_argument) naming line:column and the construct for
  // syntax errors or unsupported Jinja features.
  explicit ChatTemplate(std::string source);
  // Renders with the variables `messages` (a list of dicts with role and content),
  // bos_token, eos_token and add_generation_prompt; every other name is undefined, as in
  // jinja2 (`tools is defined` is false). raise_exception(msg) in the template throws
  // Error(invalid_argument, msg); other failures (type errors, undefined values used,
  // limits) throw Error(invalid_argument) naming the template's line:column. Recursion,
  // work and output size are bounded, so no template or input crashes or hangs it.
  // Thread-safe: the parsed template is never modified.
  std::string render(std::span<const ChatMessage> messages, const ChatTemplateContext& ctx) const;

  const std::string& source() const { return source_; }
  // The ChatML template used when a model has none.
  static const std::string& chatml();

  struct Program;  // the parsed template

 private:
  std::string source_;
  std::shared_ptr<const Program> program_;
};

}  // namespace slim::text
