// Unicode support the pre-tokenizer regexes need: UTF-8 decoding that tolerates invalid
// bytes, general categories (\p{L}, \p{N}, ...) and White_Space (\s).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace slim::text::unicode {

enum class Category : uint8_t {
  Cc, Cf, Cn, Co, Cs, Ll, Lm, Lo, Lt, Lu, Mc, Me, Mn, Nd, Nl, No, Pc, Pd, Pe, Pf, Pi, Po,
  Ps, Sc, Sk, Sm, So, Zl, Zp, Zs
};

extern const uint32_t kCategoryRanges[];
extern const size_t kCategoryRangeCount;
extern const char kUnicodeVersion[];

// A code point that stands for one byte of invalid UTF-8. Outside the Unicode range so it
// never collides with a real character; it is "other" for every regex class.
inline constexpr uint32_t kInvalidByteBase = 0x110000;

Category category(uint32_t cp);
bool is_letter(uint32_t cp);
bool is_number(uint32_t cp);
bool is_whitespace(uint32_t cp);

// One decoded code point and the bytes it came from.
struct CodePoint {
  uint32_t cp;      // kInvalidByteBase + byte for an invalid sequence
  uint32_t offset;  // byte offset in the input
  uint32_t length;  // 1..4 bytes
};

// Decodes UTF-8; each byte of a malformed, overlong, surrogate or truncated sequence
// becomes its own kInvalidByteBase + byte code point, so no input is lost.
std::vector<CodePoint> decode_utf8(std::string_view text);

// Length of the UTF-8 sequence starting at text[pos], 1 for an invalid byte.
size_t utf8_sequence_length(std::string_view text, size_t pos);

void append_utf8(std::string& out, uint32_t cp);

}  // namespace slim::text::unicode
