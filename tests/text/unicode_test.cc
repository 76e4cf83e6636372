#include "slim/text/unicode.h"

#include <gtest/gtest.h>

#include "slim/text/pretokenizer.h"
#include "slim/core/error.h"

namespace slim::text {
namespace {

using unicode::Category;

TEST(Unicode, GeneralCategories) {
  EXPECT_EQ(unicode::category('A'), Category::Lu);
  EXPECT_EQ(unicode::category('z'), Category::Ll);
  EXPECT_EQ(unicode::category('7'), Category::Nd);
  EXPECT_EQ(unicode::category(' '), Category::Zs);
  EXPECT_EQ(unicode::category('\n'), Category::Cc);
  EXPECT_EQ(unicode::category(0x01C5), Category::Lt);   // Dž
  EXPECT_EQ(unicode::category(0x02B0), Category::Lm);   // modifier h
  EXPECT_EQ(unicode::category(0x4E00), Category::Lo);   // CJK
  EXPECT_EQ(unicode::category(0x0301), Category::Mn);   // combining acute
  EXPECT_EQ(unicode::category(0x0903), Category::Mc);   // Devanagari visarga
  EXPECT_EQ(unicode::category(0x0661), Category::Nd);   // Arabic-Indic one
  EXPECT_EQ(unicode::category(0x216B), Category::Nl);   // Roman twelve
  EXPECT_EQ(unicode::category(0x00BD), Category::No);   // one half
  EXPECT_EQ(unicode::category(0x1F642), Category::So);  // emoji
  EXPECT_EQ(unicode::category(0x200D), Category::Cf);   // ZWJ
  EXPECT_EQ(unicode::category(0xD800), Category::Cs);
  EXPECT_EQ(unicode::category(0xE000), Category::Co);
  EXPECT_EQ(unicode::category(0x0378), Category::Cn);   // unassigned
  EXPECT_EQ(unicode::category(0x10FFFF), Category::Cn);
  EXPECT_EQ(unicode::category(0x110041), Category::Cn);  // an invalid-byte code point
  EXPECT_EQ(unicode::category(0x2028), Category::Zl);
  EXPECT_EQ(unicode::category(0x00A0), Category::Zs);
}

TEST(Unicode, ClassesTheRegexesUse) {
  EXPECT_TRUE(unicode::is_letter(0x00E9));
  EXPECT_TRUE(unicode::is_letter(0x3042));   // hiragana a
  EXPECT_FALSE(unicode::is_letter(0x0301));  // marks are not \p{L}
  EXPECT_TRUE(unicode::is_number(0x00B2));   // superscript two
  EXPECT_FALSE(unicode::is_number('x'));
  for (uint32_t cp : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u,
                      0x200Au, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u})
    EXPECT_TRUE(unicode::is_whitespace(cp)) << cp;
  for (uint32_t cp : {0x1Cu, 0x200Bu, 0x180Eu, 0xFEFFu, 0x41u})
    EXPECT_FALSE(unicode::is_whitespace(cp)) << cp;
}

TEST(Unicode, DecodesValidAndInvalidUtf8WithoutLosingBytes) {
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x99\x82"  // a é € 🙂
                           "\xFF\xC3\x28\xE0\x80\x80\xED\xA0\x80\xF0\x9F";
  const auto cps = unicode::decode_utf8(text);
  std::vector<uint32_t> got;
  std::string rebuilt;
  for (const auto& cp : cps) {
    got.push_back(cp.cp);
    unicode::append_utf8(rebuilt, cp.cp);
  }
  const uint32_t b = unicode::kInvalidByteBase;
  const std::vector<uint32_t> want = {'a', 0xE9, 0x20AC, 0x1F642, b + 0xFF, b + 0xC3, '(',
                                      b + 0xE0, b + 0x80, b + 0x80,  // overlong
                                      b + 0xED, b + 0xA0, b + 0x80,  // surrogate
                                      b + 0xF0, b + 0x9F};           // truncated
  EXPECT_EQ(got, want);
  EXPECT_EQ(rebuilt, text);
}

std::vector<std::string> words(SplitPattern p, std::string_view text) {
  std::vector<std::string> out;
  for (auto w : PreTokenizer({p}).split(text)) out.emplace_back(w);
  return out;
}

using W = std::vector<std::string>;

TEST(PreTokenizer, Gpt2Regex) {
  EXPECT_EQ(words(SplitPattern::gpt2, "Hello world's end"),
            (W{"Hello", " world", "'s", " end"}));
  // A whitespace run leaves its last space to the next word; at the end it stays whole.
  EXPECT_EQ(words(SplitPattern::gpt2, "a   b  "), (W{"a", "  ", " b", "  "}));
  EXPECT_EQ(words(SplitPattern::gpt2, "x\n\ny"), (W{"x", "\n", "\n", "y"}));
  EXPECT_EQ(words(SplitPattern::gpt2, "x\t y"), (W{"x", "\t", " y"}));
  // Contractions are case-sensitive here: 'S is punctuation then a letter.
  EXPECT_EQ(words(SplitPattern::gpt2, "IT'S it's"), (W{"IT", "'", "S", " it", "'s"}));
  EXPECT_EQ(words(SplitPattern::gpt2, "abc123 45!? ..."),
            (W{"abc", "123", " 45", "!?", " ..."}));
  EXPECT_EQ(words(SplitPattern::gpt2, "日本語 テスト"), (W{"日本語", " テスト"}));
  EXPECT_EQ(words(SplitPattern::gpt2, "e\xCC\x81t\xC3\xA9"),  // e + combining acute, té
            (W{"e", "\xCC\x81", "t\xC3\xA9"}));
  EXPECT_TRUE(words(SplitPattern::gpt2, "").empty());
}

TEST(PreTokenizer, Llama3Regex) {
  EXPECT_EQ(words(SplitPattern::llama3, "IT'S we'LL"), (W{"IT", "'S", " we", "'LL"}));
  EXPECT_EQ(words(SplitPattern::llama3, "1234567 x"), (W{"123", "456", "7", " x"}));
  // One non-letter, non-digit char (not \r\n) may lead a letter run.
  EXPECT_EQ(words(SplitPattern::llama3, "(hello) \"hi\""),
            (W{"(hello", ")", " \"", "hi", "\""}));
  EXPECT_EQ(words(SplitPattern::llama3, "\tfoo"), (W{"\tfoo"}));
  EXPECT_EQ(words(SplitPattern::llama3, "a.\n\nb"), (W{"a", ".\n\n", "b"}));
  EXPECT_EQ(words(SplitPattern::llama3, "a \n  \n b"), (W{"a", " \n  \n", " b"}));
  EXPECT_EQ(words(SplitPattern::llama3, "a   b"), (W{"a", "  ", " b"}));
}

TEST(PreTokenizer, Qwen2SplitsEveryDigit) {
  EXPECT_EQ(words(SplitPattern::qwen2, "x1234 IT'S"), (W{"x", "1", "2", "3", "4", " IT", "'S"}));
}

TEST(PreTokenizer, StarcoderIsolatesDigitsFirst) {
  auto pre = PreTokenizer::from_name("starcoder", "test");
  std::vector<std::string> got;
  for (auto w : pre.split("ab12 cd")) got.emplace_back(w);
  EXPECT_EQ(got, (W{"ab", "1", "2", " cd"}));
}

TEST(PreTokenizer, LlamaCppDefaultStages) {
  auto pre = PreTokenizer::from_name("", "test");
  std::vector<std::string> got;
  for (auto w : pre.split("Hello, world!! 12345 x+y")) got.emplace_back(w);
  EXPECT_EQ(got, (W{"Hello", ",", " world", "!!", " ", "123", "45", " x", "+", "y"}));
  got.clear();
  for (auto w : PreTokenizer::from_name("gpt-2", "test").split("Hello, world!! 12345 x+y"))
    got.emplace_back(w);
  EXPECT_EQ(got, (W{"Hello", ",", " world", "!!", " 12345", " x", "+", "y"}));
}

TEST(PreTokenizer, UnknownNameIsUnsupported) {
  try {
    PreTokenizer::from_name("made-up", "model.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_NE(std::string(e.what()).find("model.gguf"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("made-up"), std::string::npos);
  }
}

}  // namespace
}  // namespace slim::text
