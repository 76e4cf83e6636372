#include "slim/text/unicode.h"

#include <algorithm>

namespace slim::text::unicode {

Category category(uint32_t cp) {
  if (cp >= 0x110000) return Category::Cn;
  // Last range whose start is <= cp. Entries sort by start because the start sits in
  // the high bits.
  const uint32_t key = (cp << 5) | 0x1f;
  const uint32_t* end = kCategoryRanges + kCategoryRangeCount;
  const uint32_t* it = std::upper_bound(kCategoryRanges, end, key);
  return static_cast<Category>(*(it - 1) & 0x1f);
}

bool is_letter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  switch (category(cp)) {
    case Category::Lu: case Category::Ll: case Category::Lt: case Category::Lm:
    case Category::Lo:
      return true;
    default:
      return false;
  }
}

bool is_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  switch (category(cp)) {
    case Category::Nd: case Category::Nl: case Category::No:
      return true;
    default:
      return false;
  }
}

// The White_Space property (PropList.txt); it is not a general category and has been
// stable since Unicode 6.3, so it is listed here rather than generated.
bool is_whitespace(uint32_t cp) {
  switch (cp) {
    case 0x09: case 0x0a: case 0x0b: case 0x0c: case 0x0d: case 0x20: case 0x85:
    case 0xa0: case 0x1680: case 0x2028: case 0x2029: case 0x202f: case 0x205f:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200a;
  }
}

size_t utf8_sequence_length(std::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  const uint8_t b0 = s[pos];
  if (b0 < 0x80) return 1;
  size_t len;
  uint32_t min_cp;
  if ((b0 & 0xe0) == 0xc0) {
    len = 2, min_cp = 0x80;
  } else if ((b0 & 0xf0) == 0xe0) {
    len = 3, min_cp = 0x800;
  } else if ((b0 & 0xf8) == 0xf0) {
    len = 4, min_cp = 0x10000;
  } else {
    return 1;
  }
  if (pos + len > n) return 1;
  uint32_t cp = b0 & (0x7f >> len);
  for (size_t i = 1; i < len; ++i) {
    if ((s[pos + i] & 0xc0) != 0x80) return 1;
    cp = (cp << 6) | (s[pos + i] & 0x3f);
  }
  if (cp < min_cp || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 1;
  return len;
}

std::vector<CodePoint> decode_utf8(std::string_view text) {
  std::vector<CodePoint> out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = utf8_sequence_length(text, pos);
    uint32_t cp;
    if (len == 1) {
      cp = s[pos] < 0x80 ? s[pos] : kInvalidByteBase + s[pos];
    } else {
      cp = s[pos] & (0x7f >> len);
      for (size_t i = 1; i < len; ++i) cp = (cp << 6) | (s[pos + i] & 0x3f);
    }
    out.push_back({cp, static_cast<uint32_t>(pos), static_cast<uint32_t>(len)});
    pos += len;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp >= kInvalidByteBase) {
    out.push_back(static_cast<char>(cp - kInvalidByteBase));
  } else if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

}  // namespace slim::text::unicode
