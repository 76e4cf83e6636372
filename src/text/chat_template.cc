// The chat-template renderer (see chat_template.h): a lexer that reproduces jinja2's
// tokenizer with trim_blocks and lstrip_blocks, a recursive-descent parser with jinja2's
// operator precedence into an immutable tree, and an interpreter over Python-like values.
// Comments name the jinja2 or Python behaviour a piece reproduces where it is not obvious.
#include "slim/text/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <string_view>
#include <vector>

#include "slim/core/error.h"
#include "slim/text/unicode.h"

namespace slim::text {
namespace {

namespace uc = unicode;

// Templates come from model files and messages from clients, so a render is bounded in
// nesting (the C++ stack), work (time) and size (memory).
constexpr int kMaxNesting = 100;          // parser recursion and tree depth
constexpr int kMaxEvalDepth = 500;        // nested evaluations in a render (macro recursion)
constexpr int kMaxValueDepth = 50;        // lists and dicts nested in one another
constexpr int64_t kMaxWork = 20'000'000;  // evaluations, iterations, elements, 16-byte units
constexpr size_t kMaxString = 16u << 20;  // bytes of one string, and of the output
constexpr size_t kMaxList = 1u << 20;     // elements of one list
constexpr int64_t kMaxRange = 100000;     // jinja2's sandbox refuses larger ranges

struct Pos {
  uint32_t line = 1, column = 1;
};

[[noreturn]] void fail_at(Pos p, const std::string& msg) {
  throw Error(ErrorCode::invalid_argument, "chat template line " + std::to_string(p.line) + ":" +
                                               std::to_string(p.column) + ": " + msg);
}

// ---------------------------------------------------------------------------------------
// Text helpers. Strings are UTF-8; an invalid byte counts as one character.

uint32_t decode_at(std::string_view s, size_t pos, size_t& len) {
  len = uc::utf8_sequence_length(s, pos);
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (len == 1) return b0 < 0x80 ? b0 : uc::kInvalidByteBase + b0;
  uint32_t cp = b0 & (0x7f >> len);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[pos + k]) & 0x3f);
  return cp;
}

// Python's str.isspace(): what strip(), split() and jinja2's lexer (\s) treat as space.
bool py_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

size_t skip_space(std::string_view s, size_t pos) {
  size_t len;
  while (pos < s.size() && py_space(decode_at(s, pos, len))) pos += len;
  return pos;
}

size_t rstrip_end(std::string_view s) {
  size_t end = 0, len;
  for (size_t p = 0; p < s.size(); p += len)
    if (!py_space(decode_at(s, p, len))) end = p + len;
  return end;
}

size_t char_count(std::string_view s) {
  size_t n = 0;
  for (size_t p = 0; p < s.size(); p += uc::utf8_sequence_length(s, p)) ++n;
  return n;
}

// Byte offsets of each character, plus s.size() at the end.
std::vector<size_t> char_offsets(std::string_view s) {
  std::vector<size_t> out;
  for (size_t p = 0; p < s.size(); p += uc::utf8_sequence_length(s, p)) out.push_back(p);
  out.push_back(s.size());
  return out;
}

bool is_cased(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  const auto c = uc::category(cp);
  return c == uc::Category::Lu || c == uc::Category::Ll || c == uc::Category::Lt;
}

// Case mapping changes ASCII letters only; other letters keep their case (Python maps all
// of Unicode, which no chat template relies on: they case role names).
char ascii_upper(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c; }
char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }

std::string upper(std::string s) {
  for (auto& c : s) c = ascii_upper(c);
  return s;
}
std::string lower(std::string s) {
  for (auto& c : s) c = ascii_lower(c);
  return s;
}

// Python's str.title(): a cased character after an uncased one starts a word.
std::string py_title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  size_t len;
  for (size_t p = 0; p < s.size(); p += len) {
    const uint32_t cp = decode_at(s, p, len);
    if (cp < 0x80) out += prev_cased ? ascii_lower(s[p]) : ascii_upper(s[p]);
    else out.append(s, p, len);
    prev_cased = is_cased(cp);
  }
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out = lower(std::string(s));
  if (!out.empty()) out[0] = ascii_upper(out[0]);
  return out;
}

// Python's str.strip(chars): chars == nullptr strips whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> set;
  if (chars) {
    size_t len;
    for (size_t p = 0; p < chars->size(); p += len) set.push_back(decode_at(*chars, p, len));
  }
  auto strip = [&](uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : py_space(cp);
  };
  size_t begin = 0, end = s.size(), len;
  if (left)
    while (begin < end && strip(decode_at(s, begin, len))) begin += len;
  if (right) {
    size_t last = begin;
    for (size_t p = begin; p < end; p += len)
      if (!strip(decode_at(s, p, len))) last = p + len;
    end = last;
  }
  return std::string(s.substr(begin, end - begin));
}

void append_hex(std::string& out, const char* prefix, uint32_t v, int digits) {
  static const char kHex[] = "0123456789abcdef";
  out += prefix;
  for (int k = digits - 1; k >= 0; --k) out += kHex[(v >> (4 * k)) & 15];
}

// Python's repr() of a str.
void repr_string(std::string& out, std::string_view s) {
  const char q = s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos ? '"' : '\'';
  out += q;
  size_t len;
  for (size_t p = 0; p < s.size(); p += len) {
    const uint32_t cp = decode_at(s, p, len);
    if (cp == static_cast<uint32_t>(q) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7f) {
      append_hex(out, "\\x", cp, 2);
    } else if (cp < 0x7f) {
      out += static_cast<char>(cp);
    } else if (cp >= uc::kInvalidByteBase) {
      append_hex(out, "\\x", cp - uc::kInvalidByteBase, 2);
    } else {
      using C = uc::Category;
      switch (uc::category(cp)) {  // str.isprintable()
        case C::Cc: case C::Cf: case C::Cs: case C::Co: case C::Cn: case C::Zl: case C::Zp:
        case C::Zs:
          if (cp <= 0xff) append_hex(out, "\\x", cp, 2);
          else if (cp <= 0xffff) append_hex(out, "\\u", cp, 4);
          else append_hex(out, "\\U", cp, 8);
          break;
        default:
          out.append(s, p, len);
      }
    }
  }
  out += q;
}

std::string quoted(std::string_view s) {
  std::string out;
  repr_string(out, s);
  return out;
}

// Python's repr() of a float: the shortest digits that round-trip, positional notation
// for exponents -4..15 and scientific beyond.
std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string_view s(buf, static_cast<size_t>(r.ptr - buf));
  std::string out;
  if (s.front() == '-') {
    out += '-';
    s.remove_prefix(1);
  }
  const size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e))
    if (c != '.') digits += c;
  int exp = 0;
  std::from_chars(s.data() + e + 1 + (s[e + 1] == '+'), s.data() + s.size(), exp);
  const int point = exp + 1;  // digits before the decimal point
  const int n = static_cast<int>(digits.size());
  if (point > -4 && point <= 16) {
    if (point <= 0) out += "0." + std::string(static_cast<size_t>(-point), '0') + digits;
    else if (point >= n) out += digits + std::string(static_cast<size_t>(point - n), '0') + ".0";
    else out += digits.substr(0, static_cast<size_t>(point)) + "." + digits.substr(static_cast<size_t>(point));
  } else {
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    const int e10 = point - 1;
    out += e10 < 0 ? "e-" : "e+";
    if (std::abs(e10) < 10) out += '0';
    out += std::to_string(std::abs(e10));
  }
  return out;
}

// json.dumps' string form (ensure_ascii selects \uXXXX for non-ASCII characters).
void json_string(std::string& out, std::string_view s, bool ascii) {
  out += '"';
  size_t len;
  for (size_t p = 0; p < s.size(); p += len) {
    const uint32_t cp = decode_at(s, p, len);
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (cp < 0x20) {
          append_hex(out, "\\u", cp, 4);
        } else if (!ascii || cp < 0x80) {
          out.append(s, p, len);
        } else if (cp >= uc::kInvalidByteBase) {
          append_hex(out, "\\u", cp - uc::kInvalidByteBase, 4);
        } else if (cp > 0xffff) {
          append_hex(out, "\\u", 0xd800 + ((cp - 0x10000) >> 10), 4);
          append_hex(out, "\\u", 0xdc00 + ((cp - 0x10000) & 0x3ff), 4);
        } else {
          append_hex(out, "\\u", cp, 4);
        }
    }
  }
  out += '"';
}

// jinja2 normalizes every line break to \n and drops one trailing newline.
std::string normalize_newlines(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '\r') {
      out += '\n';
      if (k + 1 < s.size() && s[k + 1] == '\n') ++k;
    } else {
      out += s[k];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// ---------------------------------------------------------------------------------------
// Values: Python's types as jinja2 sees them. Strings, lists and dicts are immutable
// and shared; namespaces (the one mutable object) belong to the render.

enum class Kind : uint8_t { undefined, none, boolean, integer, floating, string, list, tuple, dict, ns, function };

struct Value;
using ValueList = std::vector<Value>;
struct DictData;
struct NsData;
struct Function;
struct Renderer;

struct Value {
  Kind kind = Kind::undefined;
  uint8_t depth = 0;  // lists and dicts: how deep they nest
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<const std::string> str;  // string; undefined: why (jinja2's hint)
  std::shared_ptr<const ValueList> items;  // list, tuple
  std::shared_ptr<const DictData> dict;
  NsData* ns = nullptr;
  std::shared_ptr<const Function> fn;

  const std::string& s() const {
    static const std::string empty;
    return str ? *str : empty;
  }
  bool is_int() const { return kind == Kind::boolean || kind == Kind::integer; }  // bool is an int
  bool is_number() const { return is_int() || kind == Kind::floating; }
  int64_t as_int() const { return kind == Kind::boolean ? b : i; }
  double as_double() const { return kind == Kind::floating ? f : static_cast<double>(as_int()); }
  bool is_seq() const { return kind == Kind::list || kind == Kind::tuple; }
};

struct DictData {
  std::vector<std::pair<Value, Value>> entries;  // insertion order, as Python's dict
};
struct NsData {
  std::vector<std::pair<std::string, Value>> attrs;
};
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};
struct Function {
  std::string name;
  std::function<Value(Renderer&, Args&)> call;
};

Value make_undefined(std::string why) {
  Value v;
  v.str = std::make_shared<const std::string>(std::move(why));
  return v;
}
Value make_none() {
  Value v;
  v.kind = Kind::none;
  return v;
}
Value make_bool(bool b) {
  Value v;
  v.kind = Kind::boolean;
  v.b = b;
  return v;
}
Value make_int(int64_t i) {
  Value v;
  v.kind = Kind::integer;
  v.i = i;
  return v;
}
Value make_float(double f) {
  Value v;
  v.kind = Kind::floating;
  v.f = f;
  return v;
}
Value make_string(std::string s) {
  Value v;
  v.kind = Kind::string;
  v.str = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value make_function(std::string name, std::function<Value(Renderer&, Args&)> call) {
  Value v;
  v.kind = Kind::function;
  v.fn = std::make_shared<const Function>(Function{std::move(name), std::move(call)});
  return v;
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::list: return "list";
    case Kind::tuple: return "tuple";
    case Kind::dict: return "dict";
    case Kind::ns: return "Namespace";
    case Kind::function: return "function";
  }
  return "object";
}

// jinja2's object_type_repr, which its undefined messages use.
std::string object_type_repr(const Value& v) {
  if (v.kind == Kind::none) return "None";
  if (v.kind == Kind::ns) return "jinja2.utils.Namespace object";
  return std::string(type_name(v)) + " object";
}

// ---------------------------------------------------------------------------------------
// Lexer: jinja2's tokenizer for {{ }}, {% %} and {# #} with trim_blocks (a block or comment
// tag eats one newline after it) and lstrip_blocks (spaces from the line start to a block
// or comment tag go), '-' and '+' modifiers.

enum class Tok : uint8_t { data, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct Token {
  Tok type;
  Pos pos;
  std::string text;  // data, name, decoded string, operator
  int64_t i = 0;
  double f = 0;
};

class Lexer {
 public:
  explicit Lexer(std::string_view s) : s_(s) {
    for (size_t k = 0; k < s.size(); ++k)
      if (s[k] == '\n') line_starts_.push_back(k + 1);
  }

  std::vector<Token> tokens() {
    const size_t n = s_.size();
    size_t p = 0;
    bool line_starting = true;  // the last token ended a line (lstrip applies at column 1)
    while (p < n) {
      size_t open = p;
      for (;; ++open) {
        open = s_.find('{', open);
        if (open == std::string_view::npos ||
            (open + 1 < n && (s_[open + 1] == '{' || s_[open + 1] == '%' || s_[open + 1] == '#')))
          break;
      }
      if (open == std::string_view::npos) {
        push(Tok::data, p, std::string(s_.substr(p)));
        break;
      }
      const char kind = s_[open + 1];
      size_t q = open + 2;
      char sign = 0;
      if (q < n && (s_[q] == '-' || s_[q] == '+')) sign = s_[q++];
      std::string_view text = s_.substr(p, open - p);
      if (sign == '-') {
        text = text.substr(0, rstrip_end(text));
      } else if (sign != '+' && kind != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l > 0 || line_starting) && l < text.size() && skip_space(text, l) == text.size())
          text = text.substr(0, l);
      }
      if (!text.empty()) push(Tok::data, p, std::string(text));
      if (kind == '#') {
        p = comment_end(q, open);
      } else {
        if (kind == '%' && is_raw(q)) fail_at(pos(open), "unsupported tag 'raw'");
        push(kind == '{' ? Tok::var_begin : Tok::block_begin, open);
        p = tag(q, kind, open);
      }
      line_starting = s_[p - 1] == '\n';
    }
    push(Tok::eof, n);
    return std::move(out_);
  }

 private:
  Pos pos(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) - 1;
    return {static_cast<uint32_t>(it - line_starts_.begin() + 1),
            static_cast<uint32_t>(char_count(s_.substr(*it, offset - *it)) + 1)};
  }
  void push(Tok type, size_t offset, std::string text = {}) {
    out_.push_back({type, pos(offset), std::move(text)});
  }
  bool at(size_t p, std::string_view what) const { return s_.substr(p, what.size()) == what; }

  size_t comment_end(size_t q, size_t open) const {
    const size_t h = s_.find("#}", q);
    if (h == std::string_view::npos) fail_at(pos(open), "missing end of comment tag '#}'");
    if (h > q && s_[h - 1] == '-') return skip_space(s_, h + 2);
    if (h > q && s_[h - 1] == '+') return h + 2;
    return h + 2 + (h + 2 < s_.size() && s_[h + 2] == '\n');
  }

  bool is_raw(size_t q) const {
    q = skip_space(s_, q);
    if (!at(q, "raw")) return false;
    q = skip_space(s_, q + 3);
    return at(q, "-%}") || at(q, "%}");
  }

  // The inside of {{ }} or {% %} from q; returns the offset after the closing tag.
  size_t tag(size_t p, char kind, size_t open) {
    const size_t n = s_.size();
    std::string balance;  // closers of the open brackets: '}}' inside them is two operators
    for (;;) {
      if (p >= n)
        fail_at(pos(open), kind == '{' ? "missing '}}' to close '{{'" : "missing '%}' to close '{%'");
      if (balance.empty()) {
        size_t end = std::string_view::npos;
        if (kind == '%') {
          if (at(p, "+%}")) end = p + 3;
          else if (at(p, "-%}")) end = skip_space(s_, p + 3);
          else if (at(p, "%}")) end = p + 2 + (p + 2 < n && s_[p + 2] == '\n');
        } else if (at(p, "-}}")) {
          end = skip_space(s_, p + 3);
        } else if (at(p, "}}")) {
          end = p + 2;
        }
        if (end != std::string_view::npos) {
          push(kind == '{' ? Tok::var_end : Tok::block_end, p);
          return end;
        }
      }
      size_t len;
      const uint32_t cp = decode_at(s_, p, len);
      if (py_space(cp)) {
        p += len;
      } else if (cp < 0x80 && std::isdigit(static_cast<unsigned char>(cp))) {
        p = number(p);
      } else if (cp < 0x80 && (std::isalpha(static_cast<unsigned char>(cp)) || cp == '_')) {
        size_t e = p;
        while (e < n && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
        push(Tok::name, p, std::string(s_.substr(p, e - p)));
        p = e;
      } else if (cp == '\'' || cp == '"') {
        p = string(p);
      } else {
        p = operator_(p, balance);
      }
    }
  }

  // (\d+_)*\d+ from p; npos when no digit is there.
  size_t digits(size_t p) const {
    const size_t n = s_.size();
    if (p >= n || !std::isdigit(static_cast<unsigned char>(s_[p]))) return std::string_view::npos;
    while (p < n && std::isdigit(static_cast<unsigned char>(s_[p]))) ++p;
    while (p + 1 < n && s_[p] == '_' && std::isdigit(static_cast<unsigned char>(s_[p + 1])))
      for (++p; p < n && std::isdigit(static_cast<unsigned char>(s_[p]));) ++p;
    return p;
  }

  size_t number(size_t p) {
    const size_t npos = std::string_view::npos;
    const size_t a = digits(p);
    // A float: digits, then a fraction and/or an exponent (not right after a '.').
    size_t end = npos;
    if (p == 0 || s_[p - 1] != '.') {
      size_t q = a;
      bool frac = false;
      if (q < s_.size() && s_[q] == '.' && digits(q + 1) != npos) {
        q = digits(q + 1);
        frac = true;
      }
      if (q < s_.size() && (s_[q] == 'e' || s_[q] == 'E')) {
        size_t r = q + 1;
        if (r < s_.size() && (s_[r] == '+' || s_[r] == '-')) ++r;
        if (digits(r) != npos) end = digits(r);
      }
      if (end == npos && frac) end = q;
    }
    if (end != npos) {
      std::string text;
      for (char c : s_.substr(p, end - p))
        if (c != '_') text += c;
      Token t{Tok::floating, pos(p), text};
      std::from_chars(text.data(), text.data() + text.size(), t.f);
      out_.push_back(std::move(t));
      return end;
    }
    // An integer: 0b/0o/0x prefixed, [1-9](_?\d)* or 0(_?0)*.
    int base = 10;
    size_t q = p, body = p;
    const char x = p + 1 < s_.size() ? static_cast<char>(s_[p + 1] | 0x20) : 0;
    auto is_digit = [&](char c, int b) {
      const int v = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                    : std::isalpha(static_cast<unsigned char>(c)) ? (c | 0x20) - 'a' + 10 : 99;
      return v < b;
    };
    auto run = [&](size_t r, int b) {  // (_?digit)+ from r
      size_t e = r;
      while (e < s_.size()) {
        if (is_digit(s_[e], b)) ++e;
        else if (s_[e] == '_' && e + 1 < s_.size() && is_digit(s_[e + 1], b)) e += 2;
        else break;
      }
      return e;
    };
    if (s_[p] == '0' && (x == 'b' || x == 'o' || x == 'x')) {
      base = x == 'b' ? 2 : x == 'o' ? 8 : 16;
      q = run(p + 2, base);
      body = p + 2;
      if (q == p + 2) base = 10;  // "0x" without digits: just the 0
    }
    if (base == 10) {
      body = p;
      if (s_[p] == '0') {
        q = p + 1;
        while (q < s_.size() && (s_[q] == '0' || (s_[q] == '_' && q + 1 < s_.size() && s_[q + 1] == '0')))
          q += s_[q] == '_' ? 2 : 1;
      } else {
        q = run(p, 10);
      }
    }
    Token t{Tok::integer, pos(p), std::string(s_.substr(p, q - p))};
    for (size_t k = body; k < q; ++k) {
      if (s_[k] == '_') continue;
      const int d = std::isdigit(static_cast<unsigned char>(s_[k])) ? s_[k] - '0' : (s_[k] | 0x20) - 'a' + 10;
      if (__builtin_mul_overflow(t.i, base, &t.i) || __builtin_add_overflow(t.i, d, &t.i))
        fail_at(t.pos, "integer literal " + t.text + " does not fit in 64 bits");
    }
    out_.push_back(std::move(t));
    return q;
  }

  // A quoted string, its escapes decoded as Python's unicode-escape codec does.
  size_t string(size_t p) {
    const char q = s_[p];
    size_t e = p + 1;
    while (e < s_.size() && s_[e] != q) e += s_[e] == '\\' ? 2 : 1;
    if (e >= s_.size()) fail_at(pos(p), "unterminated string literal");
    const std::string_view body = s_.substr(p + 1, e - p - 1);
    std::string out;
    for (size_t k = 0; k < body.size();) {
      if (body[k] != '\\') {
        out += body[k++];
        continue;
      }
      const char c = body[k + 1];
      k += 2;
      auto hex = [&](size_t count, const char* what) {
        uint32_t v = 0;
        for (size_t d = 0; d < count; ++d, ++k) {
          if (k >= body.size() || !std::isxdigit(static_cast<unsigned char>(body[k])))
            fail_at(pos(p), std::string("truncated ") + what + " escape in a string");
          v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(body[k])) ? body[k] - '0' : (body[k] | 0x20) - 'a' + 10);
        }
        return v;
      };
      uint32_t cp;
      switch (c) {
        case '\n': continue;
        case '\\': case '\'': case '"': out += c; continue;
        case 'a': out += '\a'; continue;
        case 'b': out += '\b'; continue;
        case 'f': out += '\f'; continue;
        case 'n': out += '\n'; continue;
        case 'r': out += '\r'; continue;
        case 't': out += '\t'; continue;
        case 'v': out += '\v'; continue;
        case 'x': cp = hex(2, "\\xXX"); break;
        case 'u': cp = hex(4, "\\uXXXX"); break;
        case 'U': cp = hex(8, "\\UXXXXXXXX"); break;
        case 'N': fail_at(pos(p), "\\N{...} escapes are not supported");
        default:
          if (c >= '0' && c <= '7') {
            cp = static_cast<uint32_t>(c - '0');
            for (int d = 0; d < 2 && k < body.size() && body[k] >= '0' && body[k] <= '7'; ++d)
              cp = cp * 8 + static_cast<uint32_t>(body[k++] - '0');
            break;
          }
          // Unknown escapes stay as written; a non-ASCII character after the backslash
          // comes out as its backslashreplace form, as jinja2's encode/decode round trip.
          out += '\\';
          if (static_cast<unsigned char>(c) < 0x80) {
            out += c;
          } else {
            size_t len;
            const uint32_t v = decode_at(body, k - 1, len);
            if (v >= uc::kInvalidByteBase) out.append(body, k - 1, len);
            else append_hex(out, v <= 0xff ? "x" : v <= 0xffff ? "u" : "U", v, v <= 0xff ? 2 : v <= 0xffff ? 4 : 8);
            k += len - 1;
          }
          continue;
      }
      if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        fail_at(pos(p), "string escape names no Unicode character (or a lone surrogate)");
      uc::append_utf8(out, cp);
    }
    Token t{Tok::string, pos(p), std::move(out)};
    out_.push_back(std::move(t));
    return e + 1;
  }

  size_t operator_(size_t p, std::string& balance) {
    static const char* const kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwo)
      if (at(p, op)) {
        push(Tok::op, p, op);
        return p + 2;
      }
    const char c = s_[p];
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
      size_t len;
      decode_at(s_, p, len);
      fail_at(pos(p), "unexpected character " + quoted(s_.substr(p, len)));
    }
    if (c == '(' || c == '[' || c == '{') {
      balance += c == '(' ? ')' : c == '[' ? ']' : '}';
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) fail_at(pos(p), std::string("unexpected '") + c + "'");
      if (balance.back() != c)
        fail_at(pos(p), std::string("unexpected '") + c + "', expected '" + balance.back() + "'");
      balance.pop_back();
    }
    push(Tok::op, p, std::string(1, c));
    return p + 1;
  }

  std::string_view s_;
  std::vector<size_t> line_starts_{0};
  std::vector<Token> out_;
};

// ---------------------------------------------------------------------------------------
// The tree.

enum class Ex : uint8_t { constant, name, hole, attr, item, slice, call, filter, test, neg, pos, not_, binary, and_, or_, concat, compare, cond, list, tuple, dict };

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Expr {
  Ex kind;
  Pos pos;
  int depth = 1;
  std::string name;                  // name, attribute, filter, test or operator
  Value value;                       // constant
  std::vector<ExprPtr> args;         // operands; call/filter/test: callee or input, then arguments
  std::vector<std::string> kwnames;  // names of the trailing keyword arguments
  std::vector<std::string> ops;      // compare: the operators between args
  bool negated = false;              // test: `is not`
  int fn = -1;                       // filter/test: its index in the table
};

enum class St : uint8_t { text, output, if_, for_, set, set_attr, set_block, macro, with, filter_block, break_, continue_ };

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;
struct Stmt {
  St kind;
  Pos pos;
  std::string text;                // text; set_attr: the namespace; macro: its name
  std::vector<std::string> names;  // targets of for/set/with; macro parameters; set_attr: [attribute]
  bool unpack = false;             // the targets are a tuple
  std::vector<ExprPtr> exprs;      // output: [e]; if: conditions; for: [iterable, filter]; set/with: values; macro: defaults
  std::vector<Body> bodies;        // if: one per condition, then else; for: body, else; others: body
  ExprPtr filter;                  // set_block/filter_block: filters applied to the body's output
};

int find_filter(std::string_view name);
int find_test(std::string_view name);

// ---------------------------------------------------------------------------------------
// Parser: jinja2's grammar and precedence (parser.py), loosest first: inline if, or, and,
// not, comparisons and `in`, + -, ~, * / // %, **, unary - +, then postfix . [] () and
// filters | and tests `is`, which bind tighter than every binary operator.

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse() { return body({}, "", {}); }

 private:
  struct Nest {
    Parser& p;
    Nest(Parser& parser, Pos pos) : p(parser) {
      if (++p.nesting_ > kMaxNesting) fail_at(pos, "template nested more than 100 levels deep");
    }
    ~Nest() { --p.nesting_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& next() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  bool op(std::string_view o) const { return cur().type == Tok::op && cur().text == o; }
  bool word(std::string_view w) const { return cur().type == Tok::name && cur().text == w; }
  bool skip_op(std::string_view o) { return op(o) ? (++i_, true) : false; }
  bool skip_word(std::string_view w) { return word(w) ? (++i_, true) : false; }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::data: return "template text";
      case Tok::var_begin: return "'{{'";
      case Tok::var_end: return "'}}'";
      case Tok::block_begin: return "'{%'";
      case Tok::block_end: return "'%}'";
      case Tok::string: return "a string";
      case Tok::integer: case Tok::floating: return "a number";
      case Tok::eof: return "the end of the template";
      default: return "'" + t.text + "'";
    }
  }
  [[noreturn]] void expected(const std::string& what) const {
    fail_at(cur().pos, "expected " + what + ", got " + describe(cur()));
  }
  void expect_op(std::string_view o) {
    if (!skip_op(o)) expected("'" + std::string(o) + "'");
  }
  void expect(Tok type) {
    if (cur().type != type) expected(type == Tok::block_end ? "'%}'" : "'}}'");
    ++i_;
  }
  std::string identifier(const char* what) {
    if (cur().type != Tok::name) expected(what);
    return t_[i_++].text;
  }

  ExprPtr node(Ex kind, Pos pos, std::vector<ExprPtr> args = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    for (const auto& a : args)
      if (a) e->depth = std::max(e->depth, a->depth + 1);
    if (e->depth > kMaxNesting) fail_at(pos, "expression nested more than 100 levels deep");
    e->args = std::move(args);
    return e;
  }
  template <typename... E>
  static std::vector<ExprPtr> list(E&&... e) {
    std::vector<ExprPtr> v;
    (v.push_back(std::move(e)), ...);
    return v;
  }
  StmtPtr stmt(St kind, Pos pos) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->pos = pos;
    return s;
  }

  // Statements up to a block tag named in `ends` (left current); the end of the template
  // ends the top level only.
  Body body(std::initializer_list<std::string_view> ends, const std::string& tag, Pos tag_pos) {
    Body out;
    for (;;) {
      const Token& t = cur();
      if (t.type == Tok::eof) {
        if (ends.size() == 0) return out;
        std::string names;
        for (auto e : ends) names += (names.empty() ? "'" : " or '") + std::string(e) + "'";
        fail_at(tag_pos, "'" + tag + "' is not closed: expected " + names + " before the end of the template");
      }
      if (t.type == Tok::data) {
        auto s = stmt(St::text, t.pos);
        s->text = t.text;
        out.push_back(std::move(s));
        ++i_;
      } else if (t.type == Tok::var_begin) {
        ++i_;
        auto s = stmt(St::output, t.pos);
        s->exprs.push_back(tuple(true));
        expect(Tok::var_end);
        out.push_back(std::move(s));
      } else if (t.type == Tok::block_begin) {
        ++i_;
        if (cur().type == Tok::name && std::find(ends.begin(), ends.end(), cur().text) != ends.end())
          return out;
        out.push_back(statement());
        expect(Tok::block_end);
      } else {
        fail_at(t.pos, "unexpected " + describe(t));
      }
    }
  }

  // jinja2's parse_statements: an optional ':', the end of the opening tag, the body.
  Body statements(std::initializer_list<std::string_view> ends, const std::string& tag, Pos tag_pos) {
    skip_op(":");
    expect(Tok::block_end);
    return body(ends, tag, tag_pos);
  }

  StmtPtr statement() {
    const Token& t = cur();
    Nest nest(*this, t.pos);
    if (t.type != Tok::name) expected("a tag name");
    const std::string w = t.text;
    if (w == "for") return for_stmt();
    if (w == "if") return if_stmt();
    if (w == "set") return set_stmt();
    if (w == "macro") return macro_stmt();
    if (w == "with" || w == "generation") return with_stmt();
    if (w == "filter") return filter_stmt();
    if (w == "print") {
      ++i_;
      auto s = stmt(St::output, t.pos);
      s->exprs.push_back(tuple(true));
      return s;
    }
    if (w == "break" || w == "continue") {
      if (loops_ == 0) fail_at(t.pos, "'" + w + "' outside a for loop");
      ++i_;
      return stmt(w == "break" ? St::break_ : St::continue_, t.pos);
    }
    static const char* const kUnsupported[] = {"include", "extends", "block", "import", "from", "call", "autoescape", "trans", "raw"};
    for (const char* u : kUnsupported)
      if (w == u) fail_at(t.pos, "unsupported tag '" + w + "'");
    static const char* const kEnds[] = {"elif", "else", "endif", "endfor", "endset", "endmacro", "endwith", "endfilter", "endgeneration"};
    for (const char* e : kEnds)
      if (w == e) fail_at(t.pos, "unexpected tag '" + w + "'");
    fail_at(t.pos, "unknown tag '" + w + "'");
  }

  // Assignment targets: name or name, name, ... (a trailing comma makes a tuple).
  std::vector<std::string> targets(bool& unpack) {
    std::vector<std::string> names;
    unpack = false;
    for (;;) {
      if (cur().type != Tok::name) expected("a variable name");
      static const char* const kLiterals[] = {"true", "false", "none", "True", "False", "None"};
      for (const char* l : kLiterals)
        if (cur().text == l) fail_at(cur().pos, "cannot assign to '" + cur().text + "'");
      names.push_back(t_[i_++].text);
      if (!skip_op(",")) break;
      unpack = true;
      if (cur().type != Tok::name || word("in")) break;
    }
    return names;
  }

  StmtPtr for_stmt() {
    const Pos p = cur().pos;
    ++i_;
    auto s = stmt(St::for_, p);
    s->names = targets(s->unpack);
    if (!skip_word("in")) expected("'in'");
    s->exprs.push_back(tuple(false, "recursive"));
    s->exprs.push_back(skip_word("if") ? expression() : nullptr);
    if (word("recursive")) fail_at(cur().pos, "unsupported: recursive for loops");
    ++loops_;
    s->bodies.push_back(statements({"endfor", "else"}, "for", p));
    --loops_;
    if (cur().text == "else") {
      ++i_;
      s->bodies.push_back(statements({"endfor"}, "for", p));
    }
    ++i_;
    return s;
  }

  StmtPtr if_stmt() {
    const Pos p = cur().pos;
    ++i_;
    auto s = stmt(St::if_, p);
    for (;;) {
      s->exprs.push_back(tuple(false));
      s->bodies.push_back(statements({"elif", "else", "endif"}, "if", p));
      const std::string w = cur().text;
      ++i_;
      if (w == "elif") continue;
      if (w == "else") {
        s->bodies.push_back(statements({"endif"}, "if", p));
        ++i_;
      }
      return s;
    }
  }

  StmtPtr set_stmt() {
    const Pos p = cur().pos;
    ++i_;
    if (cur().type == Tok::name && next().type == Tok::op && next().text == ".") {
      auto s = stmt(St::set_attr, p);
      s->text = t_[i_].text;
      i_ += 2;
      s->names.push_back(identifier("an attribute name"));
      expect_op("=");
      s->exprs.push_back(tuple(true));
      return s;
    }
    auto s = stmt(St::set, p);
    s->names = targets(s->unpack);
    if (skip_op("=")) {
      s->exprs.push_back(tuple(true));
      return s;
    }
    if (s->unpack) expected("'='");
    s->kind = St::set_block;
    if (skip_op("|")) s->filter = filters(node(Ex::hole, p));
    s->bodies.push_back(statements({"endset"}, "set", p));
    ++i_;
    return s;
  }

  StmtPtr macro_stmt() {
    const Pos p = cur().pos;
    ++i_;
    auto s = stmt(St::macro, p);
    s->text = identifier("a macro name");
    expect_op("(");
    while (!op(")")) {
      if (!s->names.empty()) expect_op(",");
      s->names.push_back(identifier("a parameter name"));
      if (skip_op("=")) s->exprs.push_back(expression());
      else if (!s->exprs.empty()) fail_at(cur().pos, "non-default argument follows default argument");
    }
    ++i_;
    const int loops = loops_;
    loops_ = 0;
    s->bodies.push_back(statements({"endmacro"}, "macro", p));
    loops_ = loops;
    ++i_;
    return s;
  }

  // {% with a = 1, b = 2 %} ... {% endwith %}, and Hugging Face's {% generation %} tag,
  // which renders its body as is.
  StmtPtr with_stmt() {
    const Pos p = cur().pos;
    const std::string tag = cur().text;
    ++i_;
    auto s = stmt(St::with, p);
    while (tag == "with" && cur().type != Tok::block_end) {
      if (!s->names.empty()) expect_op(",");
      s->names.push_back(identifier("a variable name"));
      expect_op("=");
      s->exprs.push_back(expression());
    }
    s->bodies.push_back(statements({tag == "with" ? "endwith" : "endgeneration"}, tag, p));
    ++i_;
    return s;
  }

  StmtPtr filter_stmt() {
    const Pos p = cur().pos;
    ++i_;
    auto s = stmt(St::filter_block, p);
    s->filter = filters(node(Ex::hole, p));
    s->bodies.push_back(statements({"endfilter"}, "filter", p));
    ++i_;
    return s;
  }

  bool tuple_end(const char* extra) const {
    return cur().type == Tok::var_end || cur().type == Tok::block_end || op(")") || (extra && word(extra));
  }

  // Expressions separated by commas make a tuple.
  ExprPtr tuple(bool with_cond, const char* extra_end = nullptr, bool parens = false) {
    const Pos p = cur().pos;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    for (;;) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(extra_end)) break;
      items.push_back(expression(with_cond));
      if (!op(",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!parens) expected("an expression");
    }
    return node(Ex::tuple, p, std::move(items));
  }

  ExprPtr expression(bool with_cond = true) {
    Nest nest(*this, cur().pos);
    const Pos p = cur().pos;
    ExprPtr e = or_expr();
    while (with_cond && skip_word("if")) {
      ExprPtr c = or_expr();
      ExprPtr other = skip_word("else") ? expression() : nullptr;
      e = node(Ex::cond, p, list(e, c, other));
    }
    return e;
  }

  ExprPtr or_expr() {
    const Pos p = cur().pos;
    ExprPtr e = and_expr();
    while (skip_word("or")) e = node(Ex::or_, p, list(e, and_expr()));
    return e;
  }

  ExprPtr and_expr() {
    const Pos p = cur().pos;
    ExprPtr e = not_expr();
    while (skip_word("and")) e = node(Ex::and_, p, list(e, not_expr()));
    return e;
  }

  ExprPtr not_expr() {
    const Pos p = cur().pos;
    if (!skip_word("not")) return compare();
    Nest nest(*this, p);
    return node(Ex::not_, p, list(not_expr()));
  }

  ExprPtr compare() {
    const Pos p = cur().pos;
    ExprPtr first = math1();
    std::vector<ExprPtr> args;
    std::vector<std::string> ops;
    for (;;) {
      if (op("==") || op("!=") || op("<") || op("<=") || op(">") || op(">=")) {
        ops.push_back(t_[i_++].text);
      } else if (skip_word("in")) {
        ops.push_back("in");
      } else if (word("not") && next().type == Tok::name && next().text == "in") {
        i_ += 2;
        ops.push_back("not in");
      } else {
        break;
      }
      args.push_back(math1());
    }
    if (ops.empty()) return first;
    args.insert(args.begin(), std::move(first));
    auto e = node(Ex::compare, p, std::move(args));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr binary(const std::string& o, Pos p, ExprPtr l, ExprPtr r) {
    auto e = node(Ex::binary, p, list(l, r));
    e->name = o;
    return e;
  }

  ExprPtr math1() {
    const Pos p = cur().pos;
    ExprPtr e = concat();
    while (op("+") || op("-")) {
      const std::string o = t_[i_++].text;
      e = binary(o, p, std::move(e), concat());
    }
    return e;
  }

  ExprPtr concat() {
    const Pos p = cur().pos;
    std::vector<ExprPtr> args;
    args.push_back(math2());
    while (skip_op("~")) args.push_back(math2());
    return args.size() == 1 ? std::move(args[0]) : node(Ex::concat, p, std::move(args));
  }

  ExprPtr math2() {
    const Pos p = cur().pos;
    ExprPtr e = power();
    while (op("*") || op("/") || op("//") || op("%")) {
      const std::string o = t_[i_++].text;
      e = binary(o, p, std::move(e), power());
    }
    return e;
  }

  ExprPtr power() {
    const Pos p = cur().pos;
    ExprPtr e = unary();
    while (skip_op("**")) e = binary("**", p, std::move(e), unary());
    return e;
  }

  ExprPtr unary(bool with_filter = true) {
    const Pos p = cur().pos;
    ExprPtr e;
    if (op("-") || op("+")) {
      Nest nest(*this, p);
      const bool neg = op("-");
      ++i_;
      e = node(neg ? Ex::neg : Ex::pos, p, list(unary(false)));
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    return with_filter ? filter_expr(std::move(e)) : std::move(e);
  }

  ExprPtr constant(Pos p, Value v) {
    auto e = node(Ex::constant, p);
    e->value = std::move(v);
    return e;
  }

  ExprPtr primary() {
    const Token& t = cur();
    const Pos p = t.pos;
    switch (t.type) {
      case Tok::name: {
        ++i_;
        if (t.text == "true" || t.text == "True") return constant(p, make_bool(true));
        if (t.text == "false" || t.text == "False") return constant(p, make_bool(false));
        if (t.text == "none" || t.text == "None") return constant(p, make_none());
        auto e = node(Ex::name, p);
        e->name = t.text;
        return e;
      }
      case Tok::string: {
        std::string s;
        while (cur().type == Tok::string) s += t_[i_++].text;
        return constant(p, make_string(std::move(s)));
      }
      case Tok::integer: ++i_; return constant(p, make_int(t.i));
      case Tok::floating: ++i_; return constant(p, make_float(t.f));
      default: break;
    }
    if (skip_op("(")) {
      ExprPtr e = tuple(true, nullptr, true);
      expect_op(")");
      return e;
    }
    if (op("[") || op("{")) {
      const bool is_list = op("[");
      const char* close = is_list ? "]" : "}";
      ++i_;
      std::vector<ExprPtr> items;
      while (!op(close)) {
        if (!items.empty()) {
          expect_op(",");
          if (op(close)) break;
        }
        items.push_back(expression());
        if (!is_list) {
          expect_op(":");
          items.push_back(expression());
        }
      }
      ++i_;
      return node(is_list ? Ex::list : Ex::dict, p, std::move(items));
    }
    fail_at(p, "unexpected " + describe(t));
  }

  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      const Pos p = cur().pos;
      if (skip_op(".")) {
        const Token& t = cur();
        if (t.type == Tok::name) {
          ++i_;
          e = node(Ex::attr, p, list(e));
          e->name = t.text;
        } else if (t.type == Tok::integer) {
          ++i_;
          e = node(Ex::item, p, list(e, constant(t.pos, make_int(t.i))));
        } else {
          expected("an attribute name or number after '.'");
        }
      } else if (skip_op("[")) {
        e = subscript(std::move(e), p);
      } else if (op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr subscript(ExprPtr obj, Pos p) {
    ExprPtr a, b, c;
    bool slice = false;
    if (!op(":")) a = expression();
    if (skip_op(":")) {
      slice = true;
      if (!op(":") && !op("]") && !op(",")) b = expression();
      if (skip_op(":") && !op("]") && !op(",")) c = expression();
    }
    if (slice) {
      expect_op("]");
      return node(Ex::slice, p, list(obj, a, b, c));
    }
    if (op(",")) {  // obj[a, b]: a tuple key
      std::vector<ExprPtr> keys;
      keys.push_back(std::move(a));
      while (skip_op(",") && !op("]")) keys.push_back(expression());
      a = node(Ex::tuple, p, std::move(keys));
    }
    expect_op("]");
    return node(Ex::item, p, list(obj, a));
  }

  void call_args(std::vector<ExprPtr>& args, std::vector<std::string>& kwnames) {
    expect_op("(");
    bool comma = false;
    while (!op(")")) {
      if (comma) {
        expect_op(",");
        if (op(")")) break;
      }
      if (op("*") || op("**")) fail_at(cur().pos, "unsupported: *args and **kwargs in calls");
      if (cur().type == Tok::name && next().type == Tok::op && next().text == "=") {
        kwnames.push_back(cur().text);
        i_ += 2;
      } else if (!kwnames.empty()) {
        fail_at(cur().pos, "positional argument after keyword argument");
      }
      args.push_back(expression());
      comma = true;
    }
    ++i_;
  }

  ExprPtr call(ExprPtr callee) {
    const Pos p = cur().pos;
    std::vector<ExprPtr> args;
    std::vector<std::string> kw;
    args.push_back(std::move(callee));
    call_args(args, kw);
    auto e = node(Ex::call, p, std::move(args));
    e->kwnames = std::move(kw);
    return e;
  }

  ExprPtr filter_expr(ExprPtr e) {
    for (;;) {
      if (skip_op("|")) e = filters(std::move(e), false);
      else if (word("is")) e = test(std::move(e));
      else if (op("(")) e = call(std::move(e));
      else return e;
    }
  }

  std::string dotted(const char* what) {
    std::string name = identifier(what);
    while (skip_op(".")) name += "." + identifier(what);
    return name;
  }

  // One filter (after its '|'), or with chain = true a filter and every '|' one after it.
  ExprPtr filters(ExprPtr input, bool chain = true) {
    do {
      const Pos p = cur().pos;
      const std::string name = dotted("a filter name");
      const int fn = find_filter(name);
      if (fn < 0) fail_at(p, "unsupported filter '" + name + "'");
      std::vector<ExprPtr> args;
      std::vector<std::string> kw;
      args.push_back(std::move(input));
      if (op("(")) call_args(args, kw);
      input = node(Ex::filter, p, std::move(args));
      input->name = name;
      input->fn = fn;
      input->kwnames = std::move(kw);
    } while (chain && skip_op("|"));
    return input;
  }

  ExprPtr test(ExprPtr input) {
    ++i_;  // is
    const bool negated = skip_word("not");
    const Pos p = cur().pos;
    const std::string name = dotted("a test name");
    const int fn = find_test(name);
    if (fn < 0) fail_at(p, "unsupported test '" + name + "'");
    std::vector<ExprPtr> args;
    std::vector<std::string> kw;
    args.push_back(std::move(input));
    const Tok t = cur().type;
    if (op("(")) {
      call_args(args, kw);
    } else if ((t == Tok::name || t == Tok::string || t == Tok::integer || t == Tok::floating || op("[") || op("{")) &&
               !word("else") && !word("or") && !word("and")) {
      if (word("is")) fail_at(cur().pos, "tests cannot be chained with 'is'");
      args.push_back(postfix(primary()));  // `x is divisibleby 3`: one argument without parentheses
    }
    auto e = node(Ex::test, p, std::move(args));
    e->name = name;
    e->fn = fn;
    e->negated = negated;
    e->kwnames = std::move(kw);
    return e;
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int nesting_ = 0;
  int loops_ = 0;
};

// ---------------------------------------------------------------------------------------
// The interpreter.

struct Frame {
  std::map<std::string, Value, std::less<>> vars;
  std::shared_ptr<Frame> parent;
};

enum class Flow { normal, break_, continue_ };

// Arguments bound to a builtin's parameters; a trailing "*" parameter collects the rest.
struct Bound {
  std::vector<std::optional<Value>> p;
  std::vector<Value> rest;
  bool has(size_t k) const { return p[k].has_value() && p[k]->kind != Kind::none; }
  const Value& get(size_t k) const { return *p[k]; }
};

struct JsonStyle {
  std::optional<std::string> indent;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false, ascii = false;
};

struct Renderer {
  explicit Renderer(const ChatTemplateContext& c) : ctx(c) {}

  const ChatTemplateContext& ctx;
  Pos at;  // the node being evaluated, for error messages
  int depth = 0;
  int64_t work = 0;
  std::shared_ptr<Frame> frame;
  std::string* out = nullptr;
  Value hole;  // the input of a {% filter %} or {% set x | f %} body
  std::vector<std::unique_ptr<NsData>> namespaces;

  [[noreturn]] void fail(const std::string& msg) const { fail_at(at, msg); }

  void charge(int64_t units) {
    work += units;
    if (work > kMaxWork) fail("the template does too much work (over 20 million steps)");
  }
  void check_size(const std::string& s) const {
    if (s.size() > kMaxString) fail("text longer than 16 MiB");
  }
  Value str(std::string s) {
    check_size(s);
    charge(static_cast<int64_t>(s.size() / 16));
    return make_string(std::move(s));
  }
  Value seq(Kind kind, ValueList items) {
    if (items.size() > kMaxList) fail("list longer than 1048576 items");
    charge(static_cast<int64_t>(items.size()));
    Value v;
    v.kind = kind;
    for (const auto& x : items) v.depth = std::max<uint8_t>(v.depth, x.depth);
    if (++v.depth > kMaxValueDepth) fail("lists or dicts nested more than 50 deep");
    v.items = std::make_shared<const ValueList>(std::move(items));
    return v;
  }
  Value make_dict(DictData d) {
    if (d.entries.size() > kMaxList) fail("dict larger than 1048576 items");
    charge(static_cast<int64_t>(d.entries.size()));
    Value v;
    v.kind = Kind::dict;
    for (const auto& [k, x] : d.entries) v.depth = std::max<uint8_t>(v.depth, x.depth);
    if (++v.depth > kMaxValueDepth) fail("lists or dicts nested more than 50 deep");
    v.dict = std::make_shared<const DictData>(std::move(d));
    return v;
  }

  [[noreturn]] void undefined_error(const Value& v) const { fail(v.s()); }

  static Value undefined_attr(const Value& obj, std::string_view name) {
    return make_undefined(quoted(object_type_repr(obj)) + " has no attribute " + quoted(name));
  }
  Value undefined_item(const Value& obj, const Value& key) {
    if (key.kind == Kind::string) return undefined_attr(obj, key.s());
    std::string k;
    append_repr(k, key, 0);
    return make_undefined(object_type_repr(obj) + " has no element " + k);
  }

  // ---- Python semantics

  static bool truthy(const Value& v) {
    switch (v.kind) {
      case Kind::undefined: case Kind::none: return false;
      case Kind::boolean: return v.b;
      case Kind::integer: return v.i != 0;
      case Kind::floating: return v.f != 0;
      case Kind::string: return !v.s().empty();
      case Kind::list: case Kind::tuple: return !v.items->empty();
      case Kind::dict: return !v.dict->entries.empty();
      default: return true;
    }
  }

  // str(v), as {{ }} and ~ print it (an undefined value prints as nothing).
  void append_str(std::string& s, const Value& v) {
    if (v.kind == Kind::string) s += v.s();
    else if (v.kind != Kind::undefined) append_repr(s, v, 0);
    check_size(s);
  }
  std::string to_str(const Value& v) {
    if (v.kind == Kind::string) return v.s();
    std::string s;
    append_str(s, v);
    return s;
  }

  void append_repr(std::string& s, const Value& v, int nest) {
    if (nest > kMaxValueDepth) fail("value nested too deeply to print");
    charge(1);
    switch (v.kind) {
      case Kind::undefined: s += "Undefined"; break;
      case Kind::none: s += "None"; break;
      case Kind::boolean: s += v.b ? "True" : "False"; break;
      case Kind::integer: s += std::to_string(v.i); break;
      case Kind::floating: s += float_repr(v.f); break;
      case Kind::string: repr_string(s, v.s()); break;
      case Kind::list: case Kind::tuple: {
        const bool list = v.kind == Kind::list;
        s += list ? '[' : '(';
        for (size_t k = 0; k < v.items->size(); ++k) {
          if (k) s += ", ";
          append_repr(s, (*v.items)[k], nest + 1);
          check_size(s);
        }
        if (!list && v.items->size() == 1) s += ',';
        s += list ? ']' : ')';
        break;
      }
      case Kind::dict: {
        s += '{';
        bool first = true;
        for (const auto& [k, x] : v.dict->entries) {
          if (!first) s += ", ";
          first = false;
          append_repr(s, k, nest + 1);
          s += ": ";
          append_repr(s, x, nest + 1);
          check_size(s);
        }
        s += '}';
        break;
      }
      case Kind::ns: {
        s += "<Namespace {";
        bool first = true;
        for (const auto& [k, x] : v.ns->attrs) {
          if (!first) s += ", ";
          first = false;
          repr_string(s, k);
          s += ": ";
          append_repr(s, x, nest + 1);
          check_size(s);
        }
        s += "}>";
        break;
      }
      case Kind::function: s += "<function " + v.fn->name + ">"; break;
    }
    check_size(s);
  }

  bool equal(const Value& a, const Value& b) {
    charge(1);
    if (a.is_number() && b.is_number()) {
      if (a.kind == Kind::floating || b.kind == Kind::floating) return a.as_double() == b.as_double();
      return a.as_int() == b.as_int();
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
      case Kind::string:
        charge(static_cast<int64_t>(a.s().size() / 16));
        return a.s() == b.s();
      case Kind::list: case Kind::tuple:
        if (a.items->size() != b.items->size()) return false;
        for (size_t k = 0; k < a.items->size(); ++k)
          if (!equal((*a.items)[k], (*b.items)[k])) return false;
        return true;
      case Kind::dict:
        if (a.dict->entries.size() != b.dict->entries.size()) return false;
        for (const auto& [k, x] : a.dict->entries) {
          const Value* y = find(*b.dict, k);
          if (!y || !equal(x, *y)) return false;
        }
        return true;
      case Kind::ns: return a.ns == b.ns;
      case Kind::function: return a.fn == b.fn;
      default: return true;  // undefined == undefined, None == None
    }
  }

  // -1, 0, 1 as Python's < orders a and b; TypeError where Python has no order.
  int order(const Value& a, const Value& b, const std::string& op) {
    charge(1);
    if (a.kind == Kind::undefined) undefined_error(a);
    if (b.kind == Kind::undefined) undefined_error(b);
    if (a.is_number() && b.is_number()) {
      if (a.kind == Kind::floating || b.kind == Kind::floating)
        return a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    }
    if (a.kind == Kind::string && b.kind == Kind::string) {
      charge(static_cast<int64_t>(a.s().size() / 16));
      const int c = a.s().compare(b.s());  // UTF-8 byte order is code point order
      return c < 0 ? -1 : c > 0;
    }
    if (a.kind == b.kind && a.is_seq()) {
      const size_t n = std::min(a.items->size(), b.items->size());
      for (size_t k = 0; k < n; ++k)
        if (!equal((*a.items)[k], (*b.items)[k])) return order((*a.items)[k], (*b.items)[k], op);
      return a.items->size() < b.items->size() ? -1 : a.items->size() > b.items->size();
    }
    fail("'" + op + "' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
  }

  const Value* find(const DictData& d, const Value& key) {
    for (const auto& [k, x] : d.entries)
      if (equal(k, key)) return &x;
    return nullptr;
  }

  bool contains(const Value& hay, const Value& needle) {
    switch (hay.kind) {
      case Kind::string:
        if (needle.kind != Kind::string)
          fail(std::string("'in <string>' requires string as left operand, not ") + type_name(needle));
        charge(static_cast<int64_t>(hay.s().size() / 16));
        return hay.s().find(needle.s()) != std::string::npos;
      case Kind::list: case Kind::tuple:
        for (const auto& x : *hay.items)
          if (equal(x, needle)) return true;
        return false;
      case Kind::dict: return find(*hay.dict, needle) != nullptr;
      case Kind::undefined: return false;  // iterates as empty
      default: fail(std::string("argument of type '") + type_name(hay) + "' is not iterable");
    }
  }

  bool compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return equal(a, b);
    if (op == "!=") return !equal(a, b);
    if (op == "in") return contains(b, a);
    if (op == "not in") return !contains(b, a);
    const int c = order(a, b, op);
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  ValueList iterate(const Value& v) {
    switch (v.kind) {
      case Kind::list: case Kind::tuple:
        charge(static_cast<int64_t>(v.items->size()));
        return *v.items;
      case Kind::string: {
        ValueList out;
        const auto offs = char_offsets(v.s());
        charge(static_cast<int64_t>(offs.size()));
        for (size_t k = 0; k + 1 < offs.size(); ++k) out.push_back(make_string(v.s().substr(offs[k], offs[k + 1] - offs[k])));
        return out;
      }
      case Kind::dict: {
        ValueList out;
        charge(static_cast<int64_t>(v.dict->entries.size()));
        for (const auto& [k, x] : v.dict->entries) out.push_back(k);
        return out;
      }
      case Kind::undefined: return {};
      default: fail(std::string("'") + type_name(v) + "' object is not iterable");
    }
  }

  int64_t length(const Value& v) {
    switch (v.kind) {
      case Kind::string: charge(static_cast<int64_t>(v.s().size() / 16)); return static_cast<int64_t>(char_count(v.s()));
      case Kind::list: case Kind::tuple: return static_cast<int64_t>(v.items->size());
      case Kind::dict: return static_cast<int64_t>(v.dict->entries.size());
      case Kind::undefined: return 0;
      default: fail(std::string("object of type '") + type_name(v) + "' has no len()");
    }
  }

  Value lookup(std::string_view name) const {
    for (const Frame* f = frame.get(); f; f = f->parent.get()) {
      const auto it = f->vars.find(name);
      if (it != f->vars.end()) return it->second;
    }
    return make_undefined(quoted(name) + " is undefined");
  }

  Value method(const Value& self, std::string_view name);

  // jinja2's sandboxed getattr: a Python attribute first (methods), then the item.
  Value getattr(const Value& obj, const std::string& name) {
    if (obj.kind == Kind::undefined) undefined_error(obj);
    if (!name.empty() && name[0] == '_')
      return make_undefined("access to attribute " + quoted(name) + " of " + quoted(type_name(obj)) + " object is unsafe.");
    Value m = method(obj, name);
    if (m.kind == Kind::function) return m;
    if (obj.kind == Kind::dict) {
      if (const Value* x = find(*obj.dict, make_string(name))) return *x;
    } else if (obj.kind == Kind::ns) {
      for (const auto& [k, x] : obj.ns->attrs)
        if (k == name) return x;
    }
    return undefined_attr(obj, name);
  }

  // jinja2's sandboxed getitem: the item first, then for a string key the attribute.
  Value getitem(const Value& obj, const Value& key) {
    if (obj.kind == Kind::undefined) undefined_error(obj);
    if (obj.kind == Kind::dict) {
      if (const Value* x = find(*obj.dict, key)) return *x;
    } else if ((obj.is_seq() || obj.kind == Kind::string) && key.is_int()) {
      int64_t k = key.as_int();
      if (obj.kind == Kind::string) {
        const auto offs = char_offsets(obj.s());
        charge(static_cast<int64_t>(offs.size() / 16));
        const int64_t n = static_cast<int64_t>(offs.size()) - 1;
        if (k < 0) k += n;
        if (k >= 0 && k < n) return make_string(obj.s().substr(offs[k], offs[k + 1] - offs[k]));
      } else {
        const int64_t n = static_cast<int64_t>(obj.items->size());
        if (k < 0) k += n;
        if (k >= 0 && k < n) return (*obj.items)[static_cast<size_t>(k)];
      }
    }
    if (key.kind == Kind::string) return getattr(obj, key.s());
    return undefined_item(obj, key);
  }

  // Python's obj[start:stop:step] on a list, tuple or string.
  Value slice(const Value& obj, const Value* bounds) {
    if (obj.kind == Kind::undefined) undefined_error(obj);
    for (int k = 0; k < 3; ++k)
      if (bounds[k].kind != Kind::none && !bounds[k].is_int())
        return make_undefined(object_type_repr(obj) + " has no element slice");
    if (!obj.is_seq() && obj.kind != Kind::string) return make_undefined(object_type_repr(obj) + " has no element slice");
    const int64_t step = bounds[2].kind == Kind::none ? 1 : bounds[2].as_int();
    if (step == 0) fail("slice step cannot be zero");
    std::vector<size_t> offs;
    int64_t n;
    if (obj.kind == Kind::string) {
      offs = char_offsets(obj.s());
      n = static_cast<int64_t>(offs.size()) - 1;
    } else {
      n = static_cast<int64_t>(obj.items->size());
    }
    auto adjust = [&](const Value& v, int64_t dflt) {
      if (v.kind == Kind::none) return dflt;
      int64_t x = v.as_int();
      if (x < 0) {
        x = x < -n ? -1 : x + n;  // avoid overflow of x + n for huge negatives
        if (x < 0) x = step < 0 ? -1 : 0;
      } else if (x >= n) {
        x = step < 0 ? n - 1 : n;
      }
      return x;
    };
    const int64_t start = adjust(bounds[0], step < 0 ? n - 1 : 0);
    const int64_t stop = adjust(bounds[1], step < 0 ? -1 : n);
    charge(n);
    std::vector<int64_t> picks;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      picks.push_back(k);
      if (step > 0 ? k > INT64_MAX - step : k < INT64_MIN - step) break;
    }
    if (obj.kind == Kind::string) {
      std::string s;
      for (int64_t k : picks) s.append(obj.s(), offs[k], offs[k + 1] - offs[k]);
      return str(std::move(s));
    }
    ValueList items;
    for (int64_t k : picks) items.push_back((*obj.items)[static_cast<size_t>(k)]);
    return seq(obj.kind, std::move(items));
  }

  Value call(const Value& callee, Args& args) {
    if (callee.kind == Kind::function) return callee.fn->call(*this, args);
    if (callee.kind == Kind::undefined) undefined_error(callee);
    fail(std::string("'") + type_name(callee) + "' object is not callable");
  }

  Bound bind(Args& a, std::initializer_list<const char*> params, const std::string& fn, size_t required = 0) {
    const bool rest = params.size() && std::string_view(*(params.end() - 1)) == "*";
    const size_t n = params.size() - rest;
    Bound b;
    b.p.resize(n);
    for (size_t k = 0; k < a.pos.size(); ++k) {
      if (k < n) b.p[k] = std::move(a.pos[k]);
      else if (rest) b.rest.push_back(std::move(a.pos[k]));
      else fail(fn + "() takes at most " + std::to_string(n) + " argument(s) (" + std::to_string(a.pos.size()) + " given)");
    }
    for (auto& [name, v] : a.kw) {
      size_t k = 0;
      while (k < n && name != params.begin()[k]) ++k;
      if (k == n) fail(fn + "() got an unexpected keyword argument '" + name + "'");
      if (b.p[k]) fail(fn + "() got multiple values for argument '" + name + "'");
      b.p[k] = std::move(v);
    }
    for (size_t k = 0; k < required; ++k)
      if (!b.p[k]) fail(fn + "() missing required argument '" + params.begin()[k] + "'");
    return b;
  }

  int64_t int_arg(const Value& v, const std::string& what) {
    if (!v.is_int()) fail(what + " must be an integer, not '" + type_name(v) + "'");
    return v.as_int();
  }
  const std::string& str_arg(const Value& v, const std::string& what) {
    if (v.kind != Kind::string) fail(what + " must be a string, not '" + type_name(v) + "'");
    return v.s();
  }

  Value arith(const std::string& op, const Value& a, const Value& b);
  Value apply_filter(int fn, const Value& input, Args& args);
  bool apply_test(int fn, const Value& v, Args& args);
  void json(std::string& s, const Value& v, const JsonStyle& st, int level);

  // ---- evaluation

  struct Guard {
    Renderer& r;
    Pos saved;
    Guard(Renderer& renderer, Pos pos) : r(renderer), saved(renderer.at) {
      r.at = pos;
      if (++r.depth > kMaxEvalDepth) r.fail("recursion deeper than 500 levels");
      r.charge(1);
    }
    ~Guard() {
      --r.depth;
      r.at = saved;
    }
  };

  struct Scope {
    Renderer& r;
    std::shared_ptr<Frame> saved;
    Scope(Renderer& renderer, std::shared_ptr<Frame> parent) : r(renderer), saved(renderer.frame) {
      r.frame = std::make_shared<Frame>();
      r.frame->parent = std::move(parent);
    }
    ~Scope() { r.frame = std::move(saved); }
  };

  struct Capture {
    Renderer& r;
    std::string* saved;
    std::string text;
    explicit Capture(Renderer& renderer) : r(renderer), saved(renderer.out) { r.out = &text; }
    ~Capture() { r.out = saved; }
  };

  Args eval_args(const Expr& e) {
    Args a;
    const size_t nkw = e.kwnames.size(), end = e.args.size() - nkw;
    for (size_t k = 1; k < end; ++k) a.pos.push_back(eval(*e.args[k]));
    for (size_t k = 0; k < nkw; ++k) a.kw.emplace_back(e.kwnames[k], eval(*e.args[end + k]));
    return a;
  }

  Value eval(const Expr& e) {
    Guard guard(*this, e.pos);
    switch (e.kind) {
      case Ex::constant: return e.value;
      case Ex::name: return lookup(e.name);
      case Ex::hole: return hole;
      case Ex::attr: {
        const Value obj = eval(*e.args[0]);
        return getattr(obj, e.name);
      }
      case Ex::item: {
        const Value obj = eval(*e.args[0]);
        const Value key = eval(*e.args[1]);
        return getitem(obj, key);
      }
      case Ex::slice: {
        const Value obj = eval(*e.args[0]);
        Value bounds[3];
        for (int k = 0; k < 3; ++k) bounds[k] = e.args[k + 1] ? eval(*e.args[k + 1]) : make_none();
        return slice(obj, bounds);
      }
      case Ex::call: {
        const Value callee = eval(*e.args[0]);
        Args a = eval_args(e);
        return call(callee, a);
      }
      case Ex::filter: {
        const Value input = eval(*e.args[0]);
        Args a = eval_args(e);
        return apply_filter(e.fn, input, a);
      }
      case Ex::test: {
        const Value v = eval(*e.args[0]);
        Args a = eval_args(e);
        return make_bool(apply_test(e.fn, v, a) != e.negated);
      }
      case Ex::neg: case Ex::pos: {
        const Value v = eval(*e.args[0]);
        if (v.kind == Kind::undefined) undefined_error(v);
        if (!v.is_number())
          fail(std::string("bad operand type for unary ") + (e.kind == Ex::neg ? "-" : "+") + ": '" + type_name(v) + "'");
        if (e.kind == Ex::pos) return v.kind == Kind::floating ? v : make_int(v.as_int());
        if (v.kind == Kind::floating) return make_float(-v.f);
        if (v.as_int() == INT64_MIN) fail("integer overflow");
        return make_int(-v.as_int());
      }
      case Ex::not_: return make_bool(!truthy(eval(*e.args[0])));
      case Ex::binary: {
        const Value a = eval(*e.args[0]);
        const Value b = eval(*e.args[1]);
        return arith(e.name, a, b);
      }
      case Ex::and_: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case Ex::or_: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case Ex::concat: {
        std::string s;
        for (const auto& x : e.args) append_str(s, eval(*x));
        return str(std::move(s));
      }
      case Ex::compare: {
        Value a = eval(*e.args[0]);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value b = eval(*e.args[k + 1]);
          if (!compare(e.ops[k], a, b)) return make_bool(false);
          a = std::move(b);
        }
        return make_bool(true);
      }
      case Ex::cond:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        if (e.args[2]) return eval(*e.args[2]);
        return make_undefined("the inline if-expression on line " + std::to_string(e.pos.line) +
                              " evaluated to false and no else section was defined.");
      case Ex::list: case Ex::tuple: {
        ValueList items;
        for (const auto& x : e.args) items.push_back(eval(*x));
        return seq(e.kind == Ex::list ? Kind::list : Kind::tuple, std::move(items));
      }
      case Ex::dict: {
        DictData d;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k]);
          Value v = eval(*e.args[k + 1]);
          put(d, std::move(key), std::move(v));
        }
        return make_dict(std::move(d));
      }
    }
    return {};
  }

  void put(DictData& d, Value key, Value v) {
    if (key.kind == Kind::list || key.kind == Kind::dict || key.kind == Kind::ns)
      fail(std::string("unhashable type: '") + type_name(key) + "'");
    for (auto& [k, x] : d.entries)
      if (equal(k, key)) {
        x = std::move(v);
        return;
      }
    d.entries.emplace_back(std::move(key), std::move(v));
  }

  void emit(std::string_view s) {
    out->append(s);
    check_size(*out);
  }

  void assign(const Stmt& s, const Value& v) {
    if (!s.unpack) {
      frame->vars[s.names[0]] = v;
      return;
    }
    const ValueList parts = iterate(v);
    if (parts.size() < s.names.size())
      fail("not enough values to unpack (expected " + std::to_string(s.names.size()) + ", got " + std::to_string(parts.size()) + ")");
    if (parts.size() > s.names.size())
      fail("too many values to unpack (expected " + std::to_string(s.names.size()) + ")");
    for (size_t k = 0; k < parts.size(); ++k) frame->vars[s.names[k]] = parts[k];
  }

  Value loop_object(const ValueList& items, size_t k) {
    const auto n = static_cast<int64_t>(items.size()), i = static_cast<int64_t>(k);
    DictData d;
    auto add = [&](const char* key, Value v) { d.entries.emplace_back(make_string(key), std::move(v)); };
    add("index", make_int(i + 1));
    add("index0", make_int(i));
    add("revindex", make_int(n - i));
    add("revindex0", make_int(n - i - 1));
    add("first", make_bool(i == 0));
    add("last", make_bool(i == n - 1));
    add("length", make_int(n));
    add("depth", make_int(1));
    add("depth0", make_int(0));
    if (i > 0) add("previtem", items[k - 1]);
    if (i < n - 1) add("nextitem", items[k + 1]);
    add("cycle", make_function("cycle", [k](Renderer& r, Args& a) {
          if (a.pos.empty()) r.fail("no items for cycling given");
          return a.pos[k % a.pos.size()];
        }));
    return make_dict(std::move(d));
  }

  Flow exec_for(const Stmt& s) {
    ValueList items = iterate(eval(*s.exprs[0]));
    if (s.exprs[1]) {
      ValueList kept;
      for (auto& x : items) {
        Scope scope(*this, frame);
        assign(s, x);
        if (truthy(eval(*s.exprs[1]))) kept.push_back(std::move(x));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (s.bodies.size() < 2) return Flow::normal;
      Scope scope(*this, frame);
      return exec(s.bodies[1]);
    }
    for (size_t k = 0; k < items.size(); ++k) {
      Scope scope(*this, frame);  // each iteration has its own variables, as in jinja2
      assign(s, items[k]);
      frame->vars["loop"] = loop_object(items, k);
      if (exec(s.bodies[0]) == Flow::break_) break;
    }
    return Flow::normal;
  }

  Value call_macro(const Stmt& m, const std::weak_ptr<Frame>& defined_in, Args& a) {
    auto parent = defined_in.lock();
    if (!parent) fail("macro '" + m.text + "' called after the block that defined it ended");
    const size_t n = m.names.size(), first_default = n - m.exprs.size();
    if (a.pos.size() > n) fail("macro '" + m.text + "' takes not more than " + std::to_string(n) + " argument(s)");
    Scope scope(*this, parent);
    std::vector<bool> given(n);
    for (size_t k = 0; k < a.pos.size(); ++k) {
      frame->vars[m.names[k]] = std::move(a.pos[k]);
      given[k] = true;
    }
    for (auto& [name, v] : a.kw) {
      const size_t k = static_cast<size_t>(std::find(m.names.begin(), m.names.end(), name) - m.names.begin());
      if (k == n) fail("macro '" + m.text + "' takes no keyword argument '" + name + "'");
      if (given[k]) fail("macro '" + m.text + "' got multiple values for argument '" + name + "'");
      frame->vars[name] = std::move(v);
      given[k] = true;
    }
    for (size_t k = 0; k < n; ++k)
      if (!given[k])
        frame->vars[m.names[k]] = k >= first_default ? eval(*m.exprs[k - first_default])
                                                     : make_undefined("parameter " + quoted(m.names[k]) + " was not provided");
    Capture capture(*this);
    exec(m.bodies[0]);
    return str(std::move(capture.text));
  }

  // The output of a body passed through a filter chain (set blocks and filter blocks).
  Value filtered(const Stmt& s, Flow& flow) {
    std::string text;
    {
      Capture capture(*this);
      flow = exec(s.bodies[0]);
      text = std::move(capture.text);
    }
    Value v = str(std::move(text));
    if (!s.filter) return v;
    Value saved = std::move(hole);
    hole = std::move(v);
    Value result = eval(*s.filter);
    hole = std::move(saved);
    return result;
  }

  Flow exec(const Body& body) {
    for (const auto& ptr : body) {
      const Stmt& s = *ptr;
      Guard guard(*this, s.pos);
      Flow flow = Flow::normal;
      switch (s.kind) {
        case St::text: emit(s.text); break;
        case St::output: {
          const Value v = eval(*s.exprs[0]);
          if (v.kind == Kind::string) emit(v.s());
          else append_str(*out, v);
          break;
        }
        case St::if_: {
          size_t k = 0;
          while (k < s.exprs.size() && !truthy(eval(*s.exprs[k]))) ++k;
          if (k < s.bodies.size()) flow = exec(s.bodies[k]);
          break;
        }
        case St::for_: flow = exec_for(s); break;
        case St::set: assign(s, eval(*s.exprs[0])); break;
        case St::set_attr: {
          const Value target = lookup(s.text);
          if (target.kind != Kind::ns) fail("cannot assign attribute on non-namespace object");
          Value v = eval(*s.exprs[0]);
          auto& attrs = target.ns->attrs;
          const auto it = std::find_if(attrs.begin(), attrs.end(), [&](const auto& kv) { return kv.first == s.names[0]; });
          if (it != attrs.end()) it->second = std::move(v);
          else attrs.emplace_back(s.names[0], std::move(v));
          break;
        }
        case St::set_block: assign(s, filtered(s, flow)); break;
        case St::filter_block: {
          const Value v = filtered(s, flow);
          append_str(*out, v);
          break;
        }
        case St::macro: {
          const Stmt* m = &s;
          std::weak_ptr<Frame> defined_in = frame;  // weak: the frame holds the macro
          frame->vars[s.text] = make_function(s.text, [m, defined_in](Renderer& r, Args& a) {
            return r.call_macro(*m, defined_in, a);
          });
          break;
        }
        case St::with: {
          ValueList values;
          for (const auto& x : s.exprs) values.push_back(eval(*x));
          Scope scope(*this, frame);
          for (size_t k = 0; k < values.size(); ++k) frame->vars[s.names[k]] = std::move(values[k]);
          flow = exec(s.bodies[0]);
          break;
        }
        case St::break_: return Flow::break_;
        case St::continue_: return Flow::continue_;
      }
      if (flow != Flow::normal) return flow;
    }
    return Flow::normal;
  }

  Value affix(const Value& s, Args& a, const std::string& fn) {
    Bound b = bind(a, {"prefix"}, fn, 1);
    const auto test = [&](const Value& x) {
      if (x.kind != Kind::string) fail(fn + " first arg must be str or a tuple of str, not " + type_name(x));
      const std::string& t = x.s();
      if (t.size() > s.s().size()) return false;
      return s.s().compare(fn == "startswith" ? 0 : s.s().size() - t.size(), t.size(), t) == 0;
    };
    const Value& p = b.get(0);
    if (p.kind != Kind::tuple) return make_bool(test(p));
    for (const auto& x : *p.items)
      if (test(x)) return make_bool(true);
    return make_bool(false);
  }

  // Python's str.split(sep, maxsplit); no sep splits at runs of whitespace.
  Value split(const std::string& s, const std::string* sep, int64_t maxsplit) {
    charge(static_cast<int64_t>(s.size() / 16));
    ValueList parts;
    const auto room = [&] { return maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit; };
    if (sep) {
      if (sep->empty()) fail("empty separator");
      size_t start = 0;
      for (size_t at; room() && (at = s.find(*sep, start)) != std::string::npos; start = at + sep->size())
        parts.push_back(make_string(s.substr(start, at - start)));
      parts.push_back(make_string(s.substr(start)));
    } else {
      size_t p = skip_space(s, 0), len;
      while (p < s.size()) {
        if (!room()) {
          parts.push_back(make_string(s.substr(p)));
          break;
        }
        size_t e = p;
        while (e < s.size() && !py_space(decode_at(s, e, len))) e += len;
        parts.push_back(make_string(s.substr(p, e - p)));
        p = skip_space(s, e);
      }
    }
    return seq(Kind::list, std::move(parts));
  }

  // Python's str.replace(old, new, count); an empty old inserts new around every character.
  Value replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count) {
    std::string out;
    int64_t n = 0;
    if (old.empty()) {
      const auto offs = char_offsets(s);
      for (size_t k = 0; k < offs.size(); ++k) {
        if (count < 0 || n < count) {
          out += rep;
          ++n;
        }
        if (k + 1 < offs.size()) out.append(s, offs[k], offs[k + 1] - offs[k]);
        check_size(out);
      }
    } else {
      size_t start = 0;
      for (size_t at; (count < 0 || n < count) && (at = s.find(old, start)) != std::string::npos; start = at + old.size(), ++n) {
        out.append(s, start, at - start);
        out += rep;
        check_size(out);
      }
      out.append(s, start);
    }
    return str(std::move(out));
  }

  Value items(const Value& d) {
    ValueList out;
    for (const auto& [k, x] : d.dict->entries) out.push_back(seq(Kind::tuple, {k, x}));
    return seq(Kind::list, std::move(out));
  }

  // jinja2's make_attrgetter: "a.b.0" looks up a, b and 0 in turn, as items.
  Value attribute_path(const Value& v, const Value& attr) {
    if (attr.kind != Kind::string) return getitem(v, attr);
    Value x = v;
    size_t start = 0;
    for (;;) {
      const size_t dot = attr.s().find('.', start);
      const std::string part = attr.s().substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      const bool digits = !part.empty() && part.size() < 19 && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      x = getitem(x, digits ? make_int(std::stoll(part)) : make_string(part));
      if (dot == std::string::npos) return x;
      start = dot + 1;
    }
  }

  // select/reject(test, args...) and selectattr/rejectattr(attribute, test, args...).
  Value select(const Value& v, Args& a, bool by_attr, bool keep) {
    size_t off = 0;
    if (by_attr && a.pos.empty()) fail("missing parameter for attribute name");
    if (by_attr) off = 1;
    int test = -1;
    if (a.pos.size() > off) {
      const std::string& name = str_arg(a.pos[off], "test name");
      test = find_test(name);
      if (test < 0) fail("no test named " + quoted(name));
    }
    ValueList out;
    for (auto& item : iterate(v)) {
      const Value x = by_attr ? attribute_path(item, a.pos[0]) : item;
      bool r;
      if (test >= 0) {
        Args ta;
        ta.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(off + 1), a.pos.end());
        ta.kw = a.kw;
        r = apply_test(test, x, ta);
      } else {
        r = truthy(x);
      }
      if (r == keep) out.push_back(std::move(item));
    }
    return seq(Kind::list, std::move(out));
  }

  // Python's int(text, base), or nullopt where it raises ValueError.
  std::optional<int64_t> parse_int(std::string_view s, int64_t base) {
    if (base != 0 && (base < 2 || base > 36)) fail("int() base must be >= 2 and <= 36, or 0");
    size_t p = skip_space(s, 0);
    s = s.substr(0, rstrip_end(s));
    bool neg = false;
    if (p < s.size() && (s[p] == '+' || s[p] == '-')) neg = s[p++] == '-';
    const char x = p + 1 < s.size() ? static_cast<char>(s[p + 1] | 0x20) : 0;
    const int64_t prefix = s.size() > p && s[p] == '0' ? (x == 'x' ? 16 : x == 'o' ? 8 : x == 'b' ? 2 : 0) : 0;
    if (prefix && (base == 0 || base == prefix)) {
      base = prefix;
      p += 2;
      if (p < s.size() && s[p] == '_') ++p;
    } else if (base == 0) {
      base = 10;
      if (p < s.size() && s[p] == '0' && s.find_first_not_of("0_", p) != std::string_view::npos) return std::nullopt;
    }
    if (p >= s.size()) return std::nullopt;
    int64_t v = 0;
    for (size_t k = p; k < s.size(); ++k) {
      if (s[k] == '_' && k > p && k + 1 < s.size() && s[k + 1] != '_') continue;
      const char c = static_cast<char>(s[k] | 0x20);
      const int64_t d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : 99;
      if (d >= base) return std::nullopt;
      if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) fail("integer does not fit in 64 bits");
    }
    return neg ? -v : v;
  }

  // Python's float(text), or nullopt where it raises ValueError.
  static std::optional<double> parse_float(std::string_view s) {
    s = s.substr(0, rstrip_end(s));
    s.remove_prefix(std::min(skip_space(s, 0), s.size()));
    std::string t;
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k] == '_' && k > 0 && k + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[k - 1])) &&
          std::isdigit(static_cast<unsigned char>(s[k + 1])))
        continue;
      t += s[k];
    }
    const bool neg = !t.empty() && t[0] == '-';
    if (!t.empty() && (t[0] == '+' || t[0] == '-')) t.erase(0, 1);
    double v = 0;
    const auto r = std::from_chars(t.data(), t.data() + t.size(), v);
    if (t.empty() || r.ec != std::errc() || r.ptr != t.data() + t.size()) return std::nullopt;
    return neg ? -v : v;
  }

  // strftime with the C locale's names; glibc's '-' flag drops the padding.
  std::string strftime(const std::string& fmt, const std::tm& tm) {
    static const char* const kDays[] = {"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"};
    static const char* const kMonths[] = {"January", "February", "March", "April", "May", "June", "July",
                                          "August", "September", "October", "November", "December"};
    std::string out;
    for (size_t k = 0; k < fmt.size(); ++k) {
      if (fmt[k] != '%') {
        out += fmt[k];
        continue;
      }
      const bool pad = !(k + 1 < fmt.size() && fmt[k + 1] == '-');
      k += pad ? 1 : 2;
      if (k >= fmt.size()) fail("strftime_now: format ends in '%'");
      const auto num = [&](int v, int width) {
        std::string d = std::to_string(v);
        if (pad && d.size() < static_cast<size_t>(width)) d.insert(0, static_cast<size_t>(width) - d.size(), '0');
        out += d;
      };
      switch (fmt[k]) {
        case 'd': num(tm.tm_mday, 2); break;
        case 'm': num(tm.tm_mon + 1, 2); break;
        case 'Y': num(tm.tm_year + 1900, 1); break;
        case 'y': num((tm.tm_year + 1900) % 100, 2); break;
        case 'H': num(tm.tm_hour, 2); break;
        case 'I': num(tm.tm_hour % 12 ? tm.tm_hour % 12 : 12, 2); break;
        case 'M': num(tm.tm_min, 2); break;
        case 'S': num(tm.tm_sec, 2); break;
        case 'j': num(tm.tm_yday + 1, 3); break;
        case 'p': out += tm.tm_hour < 12 ? "AM" : "PM"; break;
        case 'a': out += std::string(kDays[tm.tm_wday], 3); break;
        case 'A': out += kDays[tm.tm_wday]; break;
        case 'b': case 'h': out += std::string(kMonths[tm.tm_mon], 3); break;
        case 'B': out += kMonths[tm.tm_mon]; break;
        case '%': out += '%'; break;
        default: fail(std::string("strftime_now: unsupported directive %") + fmt[k]);
      }
    }
    return out;
  }

  void add_globals(std::span<const ChatMessage> messages);
};

// ---- arithmetic (Python's operators on int, float, str, list and tuple)

Value Renderer::arith(const std::string& op, const Value& a, const Value& b) {
  if (a.kind == Kind::undefined) undefined_error(a);
  if (b.kind == Kind::undefined) undefined_error(b);
  const auto unsupported = [&]() -> Value {
    fail("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  if (a.is_number() && b.is_number()) {
    const bool ints = a.is_int() && b.is_int();
    const int64_t x = a.as_int(), y = b.as_int();
    const double fx = a.as_double(), fy = b.as_double();
    int64_t r = 0;
    if (op == "+") {
      if (!ints) return make_float(fx + fy);
      if (__builtin_add_overflow(x, y, &r)) fail("integer overflow");
      return make_int(r);
    }
    if (op == "-") {
      if (!ints) return make_float(fx - fy);
      if (__builtin_sub_overflow(x, y, &r)) fail("integer overflow");
      return make_int(r);
    }
    if (op == "*") {
      if (!ints) return make_float(fx * fy);
      if (__builtin_mul_overflow(x, y, &r)) fail("integer overflow");
      return make_int(r);
    }
    if (op == "/") {
      if (fy == 0) fail("division by zero");
      return make_float(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (ints) {
        if (y == 0) fail("integer division or modulo by zero");
        if (y == -1) {
          if (op == "%") return make_int(0);
          if (x == INT64_MIN) fail("integer overflow");
          return make_int(-x);
        }
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return make_int(op == "//" ? q : m);
      }
      if (fy == 0) fail(op == "//" ? "float floor division by zero" : "float modulo");
      if (op == "//") return make_float(std::floor(fx / fy));
      double m = std::fmod(fx, fy);
      if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
      return make_float(m);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t result = 1, base = x;
        for (int64_t e = y; e > 0; e >>= 1) {
          if ((e & 1) && __builtin_mul_overflow(result, base, &result)) fail("integer overflow");
          if (e > 1 && __builtin_mul_overflow(base, base, &base)) fail("integer overflow");
        }
        return make_int(result);
      }
      if (fx == 0 && fy < 0) fail("0.0 cannot be raised to a negative power");
      return make_float(std::pow(fx, fy));
    }
  }
  if (op == "+") {
    if (a.kind == Kind::string && b.kind == Kind::string) {
      charge(static_cast<int64_t>((a.s().size() + b.s().size()) / 16));
      if (a.s().size() + b.s().size() > kMaxString) fail("text longer than 16 MiB");
      return make_string(a.s() + b.s());
    }
    if (a.is_seq() && a.kind == b.kind) {
      ValueList items = *a.items;
      items.insert(items.end(), b.items->begin(), b.items->end());
      return seq(a.kind, std::move(items));
    }
    if (a.kind == Kind::string || a.is_seq())
      fail(std::string("can only concatenate ") + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
    return unsupported();
  }
  if (op == "*") {
    const Value* s = a.kind == Kind::string || a.is_seq() ? &a : &b;
    const Value* n = s == &a ? &b : &a;
    if ((s->kind != Kind::string && !s->is_seq()) || !n->is_int()) return unsupported();
    const int64_t count = std::max<int64_t>(0, n->as_int());
    const size_t unit = s->kind == Kind::string ? s->s().size() : s->items->size();
    if (unit && count > static_cast<int64_t>((s->kind == Kind::string ? kMaxString : kMaxList) / unit))
      fail(s->kind == Kind::string ? "text longer than 16 MiB" : "list longer than 1048576 items");
    if (s->kind == Kind::string) {
      std::string r;
      for (int64_t k = 0; k < count; ++k) r += s->s();
      return str(std::move(r));
    }
    ValueList items;
    for (int64_t k = 0; k < count; ++k) items.insert(items.end(), s->items->begin(), s->items->end());
    return seq(s->kind, std::move(items));
  }
  if (op == "%" && a.kind == Kind::string) fail("printf-style '%' string formatting is not supported");
  return unsupported();
}

// ---- JSON: Hugging Face's tojson, json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)

void Renderer::json(std::string& s, const Value& v, const JsonStyle& st, int level) {
  charge(1);
  const auto newline = [&](int lvl) {
    if (!st.indent) return;
    s += '\n';
    for (int k = 0; k < lvl; ++k) s += *st.indent;
  };
  switch (v.kind) {
    case Kind::none: s += "null"; break;
    case Kind::boolean: s += v.b ? "true" : "false"; break;
    case Kind::integer: s += std::to_string(v.i); break;
    case Kind::floating:
      s += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : float_repr(v.f);
      break;
    case Kind::string: json_string(s, v.s(), st.ascii); break;
    case Kind::list: case Kind::tuple:
      if (v.items->empty()) {
        s += "[]";
        break;
      }
      s += '[';
      for (size_t k = 0; k < v.items->size(); ++k) {
        if (k) s += st.item_sep;
        newline(level + 1);
        json(s, (*v.items)[k], st, level + 1);
      }
      newline(level);
      s += ']';
      break;
    case Kind::dict: {
      if (v.dict->entries.empty()) {
        s += "{}";
        break;
      }
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& e : v.dict->entries) entries.push_back(&e);
      if (st.sort_keys)
        std::stable_sort(entries.begin(), entries.end(), [&](auto* x, auto* y) { return order(x->first, y->first, "<") < 0; });
      s += '{';
      bool first = true;
      for (const auto* e : entries) {
        if (!first) s += st.item_sep;
        first = false;
        newline(level + 1);
        const Value& k = e->first;
        if (k.kind == Kind::string) json_string(s, k.s(), st.ascii);
        else if (k.kind == Kind::floating || k.is_int() || k.kind == Kind::none) {
          std::string key;
          json(key, k, st, level + 1);
          json_string(s, key, st.ascii);
        } else {
          fail(std::string("keys must be str, int, float, bool or None, not ") + type_name(k));
        }
        s += st.key_sep;
        json(s, e->second, st, level + 1);
      }
      newline(level);
      s += '}';
      break;
    }
    default: fail(std::string("Object of type ") + type_name(v) + " is not JSON serializable");
  }
  check_size(s);
}

// ---- methods of str and dict

Value Renderer::method(const Value& self, std::string_view name) {
  using Fn = Value (*)(Renderer&, const Value&, Args&);
  struct Def {
    Kind kind;
    const char* name;
    Fn fn;
  };
  static const Def kMethods[] = {
      {Kind::string, "strip", [](Renderer& r, const Value& s, Args& a) {
         Bound b = r.bind(a, {"chars"}, "strip");
         return r.str(py_strip(s.s(), b.has(0) ? &r.str_arg(b.get(0), "strip arg") : nullptr, true, true));
       }},
      {Kind::string, "lstrip", [](Renderer& r, const Value& s, Args& a) {
         Bound b = r.bind(a, {"chars"}, "lstrip");
         return r.str(py_strip(s.s(), b.has(0) ? &r.str_arg(b.get(0), "lstrip arg") : nullptr, true, false));
       }},
      {Kind::string, "rstrip", [](Renderer& r, const Value& s, Args& a) {
         Bound b = r.bind(a, {"chars"}, "rstrip");
         return r.str(py_strip(s.s(), b.has(0) ? &r.str_arg(b.get(0), "rstrip arg") : nullptr, false, true));
       }},
      {Kind::string, "upper", [](Renderer& r, const Value& s, Args& a) { r.bind(a, {}, "upper"); return r.str(upper(s.s())); }},
      {Kind::string, "lower", [](Renderer& r, const Value& s, Args& a) { r.bind(a, {}, "lower"); return r.str(lower(s.s())); }},
      {Kind::string, "title", [](Renderer& r, const Value& s, Args& a) { r.bind(a, {}, "title"); return r.str(py_title(s.s())); }},
      {Kind::string, "capitalize", [](Renderer& r, const Value& s, Args& a) {
         r.bind(a, {}, "capitalize");
         return r.str(py_capitalize(s.s()));
       }},
      {Kind::string, "startswith", [](Renderer& r, const Value& s, Args& a) { return r.affix(s, a, "startswith"); }},
      {Kind::string, "endswith", [](Renderer& r, const Value& s, Args& a) { return r.affix(s, a, "endswith"); }},
      {Kind::string, "split", [](Renderer& r, const Value& s, Args& a) {
         Bound b = r.bind(a, {"sep", "maxsplit"}, "split");
         return r.split(s.s(), b.has(0) ? &r.str_arg(b.get(0), "split separator") : nullptr,
                        b.has(1) ? r.int_arg(b.get(1), "maxsplit") : -1);
       }},
      {Kind::string, "replace", [](Renderer& r, const Value& s, Args& a) {
         Bound b = r.bind(a, {"old", "new", "count"}, "replace", 2);
         return r.replace(s.s(), r.str_arg(b.get(0), "replace() argument 1"), r.str_arg(b.get(1), "replace() argument 2"),
                          b.has(2) ? r.int_arg(b.get(2), "replace() count") : -1);
       }},
      {Kind::string, "find", [](Renderer& r, const Value& s, Args& a) {
         Bound b = r.bind(a, {"sub"}, "find", 1);
         const size_t at = s.s().find(r.str_arg(b.get(0), "find() argument"));
         return make_int(at == std::string::npos ? -1 : static_cast<int64_t>(char_count(std::string_view(s.s()).substr(0, at))));
       }},
      {Kind::string, "count", [](Renderer& r, const Value& s, Args& a) {
         Bound b = r.bind(a, {"sub"}, "count", 1);
         const std::string& sub = r.str_arg(b.get(0), "count() argument");
         if (sub.empty()) return make_int(static_cast<int64_t>(char_count(s.s())) + 1);
         int64_t n = 0;
         for (size_t at = s.s().find(sub); at != std::string::npos; at = s.s().find(sub, at + sub.size())) ++n;
         return make_int(n);
       }},
      {Kind::string, "join", [](Renderer& r, const Value& s, Args& a) {
         Bound b = r.bind(a, {"iterable"}, "join", 1);
         std::string out;
         const ValueList items = r.iterate(b.get(0));
         for (size_t k = 0; k < items.size(); ++k) {
           if (items[k].kind != Kind::string)
             r.fail("sequence item " + std::to_string(k) + ": expected str instance, " + type_name(items[k]) + " found");
           if (k) out += s.s();
           out += items[k].s();
           r.check_size(out);
         }
         return r.str(std::move(out));
       }},
      {Kind::dict, "items", [](Renderer& r, const Value& d, Args& a) {
         r.bind(a, {}, "items");
         return r.items(d);
       }},
      {Kind::dict, "keys", [](Renderer& r, const Value& d, Args& a) {
         r.bind(a, {}, "keys");
         return r.seq(Kind::list, r.iterate(d));
       }},
      {Kind::dict, "values", [](Renderer& r, const Value& d, Args& a) {
         r.bind(a, {}, "values");
         ValueList out;
         for (const auto& [k, x] : d.dict->entries) out.push_back(x);
         return r.seq(Kind::list, std::move(out));
       }},
      {Kind::dict, "get", [](Renderer& r, const Value& d, Args& a) {
         Bound b = r.bind(a, {"key", "default"}, "get", 1);
         const Value* x = r.find(*d.dict, b.get(0));
         return x ? *x : b.p[1] ? b.get(1) : make_none();
       }},
  };
  for (const auto& m : kMethods)
    if (m.kind == self.kind && name == m.name) {
      const Fn fn = m.fn;
      return make_function(m.name, [self, fn](Renderer& r, Args& a) { return fn(r, self, a); });
    }
  return {};
}


// ---- filters (jinja2's filters.py, with Hugging Face's tojson)

using FilterFn = Value (*)(Renderer&, const Value&, Args&);
struct FilterDef {
  const char* name;
  FilterFn fn;
};

Value first_or_last(Renderer& r, const Value& v, Args& a, bool first) {
  r.bind(a, {}, first ? "first" : "last");
  const ValueList items = r.iterate(v);
  if (items.empty()) return make_undefined(first ? "No first item, sequence was empty." : "No last item, sequence was empty.");
  return first ? items.front() : items.back();
}

Value case_filter(Renderer& r, const Value& v, Args& a, const char* name, std::string (*fn)(std::string)) {
  r.bind(a, {}, name);
  return r.str(fn(r.to_str(v)));
}

// jinja2's title filter: words start after '-', whitespace and opening brackets.
std::string jinja_title(std::string s) {
  bool start = true;
  for (size_t p = 0, len; p < s.size(); p += len) {
    const uint32_t cp = decode_at(s, p, len);
    const bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_space(cp);
    if (!sep && len == 1) s[p] = start ? ascii_upper(s[p]) : ascii_lower(s[p]);
    start = sep;
  }
  return s;
}

const FilterDef kFilters[] = {
    {"abs", [](Renderer& r, const Value& v, Args& a) {
       r.bind(a, {}, "abs");
       if (v.kind == Kind::floating) return make_float(std::fabs(v.f));
       if (v.kind == Kind::undefined) r.undefined_error(v);
       if (!v.is_int()) r.fail(std::string("bad operand type for abs(): '") + type_name(v) + "'");
       if (v.as_int() == INT64_MIN) r.fail("integer overflow");
       return make_int(v.as_int() < 0 ? -v.as_int() : v.as_int());
     }},
    {"attr", [](Renderer& r, const Value& v, Args& a) {  // the Python attribute only, not the item
       Bound b = r.bind(a, {"name"}, "attr", 1);
       const std::string name = r.to_str(b.get(0));
       if (v.kind == Kind::undefined) r.undefined_error(v);
       if (name.empty() || name[0] != '_') {
         Value m = r.method(v, name);
         if (m.kind == Kind::function) return m;
         if (v.kind == Kind::ns)
           for (const auto& [k, x] : v.ns->attrs)
             if (k == name) return x;
       }
       return Renderer::undefined_attr(v, name);
     }},
    {"capitalize", [](Renderer& r, const Value& v, Args& a) {
       r.bind(a, {}, "capitalize");
       return r.str(py_capitalize(r.to_str(v)));
     }},
    {"count", [](Renderer& r, const Value& v, Args& a) {
       r.bind(a, {}, "count");
       return make_int(r.length(v));
     }},
    {"d", [](Renderer& r, const Value& v, Args& a) {
       Bound b = r.bind(a, {"default_value", "boolean"}, "default");
       if (v.kind == Kind::undefined || (b.p[1] && Renderer::truthy(b.get(1)) && !Renderer::truthy(v)))
         return b.p[0] ? b.get(0) : make_string("");
       return v;
     }},
    {"default", nullptr},  // the same as "d"
    {"first", [](Renderer& r, const Value& v, Args& a) { return first_or_last(r, v, a, true); }},
    {"float", [](Renderer& r, const Value& v, Args& a) {
       Bound b = r.bind(a, {"default"}, "float");
       const Value fallback = b.p[0] ? b.get(0) : make_float(0);
       if (v.kind == Kind::undefined) r.undefined_error(v);
       if (v.is_number()) return make_float(v.as_double());
       if (v.kind != Kind::string) return fallback;
       const auto f = Renderer::parse_float(v.s());
       return f ? make_float(*f) : fallback;
     }},
    {"indent", [](Renderer& r, const Value& v, Args& a) {
       Bound b = r.bind(a, {"width", "first", "blank"}, "indent");
       std::string ind = "    ";
       if (b.p[0]) ind = b.get(0).kind == Kind::string ? b.get(0).s() : std::string(static_cast<size_t>(std::clamp<int64_t>(r.int_arg(b.get(0), "indent width"), 0, 1 << 16)), ' ');
       const bool first = b.p[1] && Renderer::truthy(b.get(1)), blank = b.p[2] && Renderer::truthy(b.get(2));
       // Python's str.splitlines() on the text plus "\n".
       const std::string s = r.to_str(v) + "\n";
       std::vector<std::string> lines;
       size_t start = 0, len;
       for (size_t p = 0; p < s.size(); p += len) {
         const uint32_t cp = decode_at(s, p, len);
         if ((cp >= 0x0a && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1e) || cp == 0x85 || cp == 0x2028 || cp == 0x2029) {
           lines.push_back(s.substr(start, p - start));
           if (cp == '\r' && p + 1 < s.size() && s[p + 1] == '\n') ++len;
           start = p + len;
         }
       }
       std::string out;
       for (size_t k = 0; k < lines.size(); ++k) {
         if (k) out += "\n";
         if ((k > 0 || first) && (blank || !lines[k].empty())) out += ind;
         out += lines[k];
         r.check_size(out);
       }
       return r.str(std::move(out));
     }},
    {"int", [](Renderer& r, const Value& v, Args& a) {
       Bound b = r.bind(a, {"default", "base"}, "int");
       const Value fallback = b.p[0] ? b.get(0) : make_int(0);
       if (v.kind == Kind::undefined) r.undefined_error(v);
       if (v.is_int()) return make_int(v.as_int());
       double f;
       if (v.kind == Kind::floating) {
         f = v.f;
       } else if (v.kind == Kind::string) {
         if (auto i = r.parse_int(v.s(), b.p[1] ? r.int_arg(b.get(1), "int base") : 10)) return make_int(*i);
         const auto parsed = Renderer::parse_float(v.s());
         if (!parsed) return fallback;
         f = *parsed;
       } else {
         return fallback;
       }
       if (std::isnan(f)) return fallback;
       if (!(std::fabs(f) < 9.2e18)) r.fail("cannot convert float " + float_repr(f) + " to a 64-bit integer");
       return make_int(static_cast<int64_t>(f));
     }},
    {"items", [](Renderer& r, const Value& v, Args& a) {
       r.bind(a, {}, "items");
       if (v.kind == Kind::undefined) return r.seq(Kind::list, {});
       if (v.kind != Kind::dict) r.fail("Can only get item pairs from a mapping.");
       return r.items(v);
     }},
    {"join", [](Renderer& r, const Value& v, Args& a) {
       Bound b = r.bind(a, {"d", "attribute"}, "join");
       const std::string sep = b.p[0] ? r.to_str(b.get(0)) : "";
       std::string out;
       bool first = true;
       for (const auto& item : r.iterate(v)) {
         if (!first) out += sep;
         first = false;
         r.append_str(out, b.has(1) ? r.attribute_path(item, b.get(1)) : item);
       }
       return r.str(std::move(out));
     }},
    {"last", [](Renderer& r, const Value& v, Args& a) { return first_or_last(r, v, a, false); }},
    {"length", nullptr},  // the same as "count"
    {"list", [](Renderer& r, const Value& v, Args& a) {
       r.bind(a, {}, "list");
       return r.seq(Kind::list, r.iterate(v));
     }},
    {"lower", [](Renderer& r, const Value& v, Args& a) { return case_filter(r, v, a, "lower", lower); }},
    {"map", [](Renderer& r, const Value& v, Args& a) {
       ValueList out;
       if (a.pos.empty() && !a.kw.empty() && std::any_of(a.kw.begin(), a.kw.end(), [](const auto& kv) { return kv.first == "attribute"; })) {
         Bound b = r.bind(a, {"attribute", "default"}, "map");
         for (const auto& item : r.iterate(v)) {
           Value x = r.attribute_path(item, b.get(0));
           if (x.kind == Kind::undefined && b.has(1)) x = b.get(1);
           out.push_back(std::move(x));
         }
       } else {
         if (a.pos.empty()) r.fail("map requires a filter argument");
         const std::string& name = r.str_arg(a.pos[0], "map filter name");
         const int fn = find_filter(name);
         if (fn < 0) r.fail("no filter named " + quoted(name));
         for (const auto& item : r.iterate(v)) {
           Args fa;
           fa.pos.assign(a.pos.begin() + 1, a.pos.end());
           fa.kw = a.kw;
           out.push_back(r.apply_filter(fn, item, fa));
         }
       }
       return r.seq(Kind::list, std::move(out));
     }},
    {"reject", [](Renderer& r, const Value& v, Args& a) { return r.select(v, a, false, false); }},
    {"rejectattr", [](Renderer& r, const Value& v, Args& a) { return r.select(v, a, true, false); }},
    {"replace", [](Renderer& r, const Value& v, Args& a) {
       Bound b = r.bind(a, {"old", "new", "count"}, "replace", 2);
       return r.replace(r.to_str(v), r.to_str(b.get(0)), r.to_str(b.get(1)), b.has(2) ? r.int_arg(b.get(2), "replace count") : -1);
     }},
    {"reverse", [](Renderer& r, const Value& v, Args& a) {
       r.bind(a, {}, "reverse");
       ValueList items = r.iterate(v);
       std::reverse(items.begin(), items.end());
       if (v.kind != Kind::string) return r.seq(Kind::list, std::move(items));
       std::string s;
       for (const auto& c : items) s += c.s();
       return r.str(std::move(s));
     }},
    {"safe", [](Renderer& r, const Value& v, Args& a) {
       r.bind(a, {}, "safe");
       return r.str(r.to_str(v));
     }},
    {"select", [](Renderer& r, const Value& v, Args& a) { return r.select(v, a, false, true); }},
    {"selectattr", [](Renderer& r, const Value& v, Args& a) { return r.select(v, a, true, true); }},
    {"string", [](Renderer& r, const Value& v, Args& a) {
       r.bind(a, {}, "string");
       return r.str(r.to_str(v));
     }},
    {"sum", [](Renderer& r, const Value& v, Args& a) {
       Bound b = r.bind(a, {"attribute", "start"}, "sum");
       Value total = b.p[1] ? b.get(1) : make_int(0);
       for (const auto& item : r.iterate(v)) total = r.arith("+", total, b.has(0) ? r.attribute_path(item, b.get(0)) : item);
       return total;
     }},
    {"title", [](Renderer& r, const Value& v, Args& a) { return case_filter(r, v, a, "title", jinja_title); }},
    {"tojson", [](Renderer& r, const Value& v, Args& a) {
       Bound b = r.bind(a, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson");
       JsonStyle st;
       st.ascii = b.p[0] && Renderer::truthy(b.get(0));
       if (b.has(1)) {
         const Value& ind = b.get(1);
         st.indent = ind.kind == Kind::string ? ind.s() : std::string(static_cast<size_t>(std::clamp<int64_t>(r.int_arg(ind, "tojson indent"), 0, 1 << 16)), ' ');
         st.item_sep = ",";
       }
       if (b.has(2)) {
         const Value& sep = b.get(2);
         if (!sep.is_seq() || sep.items->size() != 2) r.fail("tojson separators must be a pair of strings");
         st.item_sep = r.str_arg((*sep.items)[0], "tojson item separator");
         st.key_sep = r.str_arg((*sep.items)[1], "tojson key separator");
       }
       st.sort_keys = b.p[3] && Renderer::truthy(b.get(3));
       std::string out;
       r.json(out, v, st, 0);
       return r.str(std::move(out));
     }},
    {"trim", [](Renderer& r, const Value& v, Args& a) {
       Bound b = r.bind(a, {"chars"}, "trim");
       return r.str(py_strip(r.to_str(v), b.has(0) ? &r.str_arg(b.get(0), "trim chars") : nullptr, true, true));
     }},
    {"upper", [](Renderer& r, const Value& v, Args& a) { return case_filter(r, v, a, "upper", upper); }},
};

int find_filter(std::string_view name) {
  if (name == "default") name = "d";
  if (name == "length") name = "count";
  for (size_t k = 0; k < std::size(kFilters); ++k)
    if (kFilters[k].fn && name == kFilters[k].name) return static_cast<int>(k);
  return -1;
}

Value Renderer::apply_filter(int fn, const Value& input, Args& args) { return kFilters[fn].fn(*this, input, args); }

// ---- tests (jinja2's tests.py)

using TestFn = bool (*)(Renderer&, const Value&, Args&);
struct TestDef {
  const char* name;
  TestFn fn;
};

bool kind_test(Renderer& r, const Value& v, Args& a, const char* name, std::initializer_list<Kind> kinds) {
  r.bind(a, {}, name);
  return std::find(kinds.begin(), kinds.end(), v.kind) != kinds.end();
}

const Value& other(Renderer& r, Args& a, const char* name) {
  static thread_local Value v;
  v = r.bind(a, {"other"}, name, 1).get(0);
  return v;
}

bool compare_test(Renderer& r, const Value& v, Args& a, const char* name, const char* op) {
  Bound b = r.bind(a, {"other"}, name, 1);
  return r.compare(op, v, b.get(0));
}

bool case_test(Renderer& r, const Value& v, Args& a, const char* name, bool want_upper) {
  r.bind(a, {}, name);
  const std::string s = r.to_str(v);
  bool cased = false;
  for (size_t p = 0, len; p < s.size(); p += len) {
    const uint32_t cp = decode_at(s, p, len);
    if (!is_cased(cp)) continue;
    cased = true;
    const bool is_lower = cp < 0x80 ? (cp >= 'a' && cp <= 'z') : uc::category(cp) == uc::Category::Ll;
    if (is_lower == want_upper) return false;
  }
  return cased;
}

bool parity(Renderer& r, const Value& v, Args& a, const char* name, int64_t want) {
  r.bind(a, {}, name);
  return r.equal(r.arith("%", v, make_int(2)), make_int(want));
}

const TestDef kTests[] = {
    {"boolean", [](Renderer& r, const Value& v, Args& a) { return kind_test(r, v, a, "boolean", {Kind::boolean}); }},
    {"callable", [](Renderer& r, const Value& v, Args& a) { return kind_test(r, v, a, "callable", {Kind::function, Kind::undefined}); }},
    {"defined", [](Renderer& r, const Value& v, Args& a) { return !kind_test(r, v, a, "defined", {Kind::undefined}); }},
    {"divisibleby", [](Renderer& r, const Value& v, Args& a) {
       Bound b = r.bind(a, {"num"}, "divisibleby", 1);
       return r.equal(r.arith("%", v, b.get(0)), make_int(0));
     }},
    {"eq", [](Renderer& r, const Value& v, Args& a) { return compare_test(r, v, a, "eq", "=="); }},
    {"even", [](Renderer& r, const Value& v, Args& a) { return parity(r, v, a, "even", 0); }},
    {"false", [](Renderer& r, const Value& v, Args& a) { return kind_test(r, v, a, "false", {Kind::boolean}) && !v.b; }},
    {"float", [](Renderer& r, const Value& v, Args& a) { return kind_test(r, v, a, "float", {Kind::floating}); }},
    {"ge", [](Renderer& r, const Value& v, Args& a) { return compare_test(r, v, a, "ge", ">="); }},
    {"gt", [](Renderer& r, const Value& v, Args& a) { return compare_test(r, v, a, "gt", ">"); }},
    {"in", [](Renderer& r, const Value& v, Args& a) {
       Bound b = r.bind(a, {"seq"}, "in", 1);
       return r.contains(b.get(0), v);
     }},
    {"integer", [](Renderer& r, const Value& v, Args& a) { return kind_test(r, v, a, "integer", {Kind::integer}); }},
    {"iterable", [](Renderer& r, const Value& v, Args& a) {
       return kind_test(r, v, a, "iterable", {Kind::string, Kind::list, Kind::tuple, Kind::dict, Kind::undefined});
     }},
    {"le", [](Renderer& r, const Value& v, Args& a) { return compare_test(r, v, a, "le", "<="); }},
    {"lower", [](Renderer& r, const Value& v, Args& a) { return case_test(r, v, a, "lower", false); }},
    {"lt", [](Renderer& r, const Value& v, Args& a) { return compare_test(r, v, a, "lt", "<"); }},
    {"mapping", [](Renderer& r, const Value& v, Args& a) { return kind_test(r, v, a, "mapping", {Kind::dict}); }},
    {"ne", [](Renderer& r, const Value& v, Args& a) { return compare_test(r, v, a, "ne", "!="); }},
    {"none", [](Renderer& r, const Value& v, Args& a) { return kind_test(r, v, a, "none", {Kind::none}); }},
    {"number", [](Renderer& r, const Value& v, Args& a) {
       return kind_test(r, v, a, "number", {Kind::boolean, Kind::integer, Kind::floating});
     }},
    {"odd", [](Renderer& r, const Value& v, Args& a) { return parity(r, v, a, "odd", 1); }},
    {"sameas", [](Renderer& r, const Value& v, Args& a) {
       // Python's `is`: identity for objects; None, True and False are singletons.
       const Value& o = other(r, a, "sameas");
       if (v.kind != o.kind) return false;
       switch (v.kind) {
         case Kind::list: case Kind::tuple: return v.items == o.items;
         case Kind::dict: return v.dict == o.dict;
         case Kind::ns: return v.ns == o.ns;
         case Kind::function: return v.fn == o.fn;
         case Kind::string: return v.str == o.str;
         default: return r.equal(v, o);
       }
     }},
    {"sequence", [](Renderer& r, const Value& v, Args& a) {
       return kind_test(r, v, a, "sequence", {Kind::string, Kind::list, Kind::tuple, Kind::dict, Kind::undefined});
     }},
    {"string", [](Renderer& r, const Value& v, Args& a) { return kind_test(r, v, a, "string", {Kind::string}); }},
    {"true", [](Renderer& r, const Value& v, Args& a) { return kind_test(r, v, a, "true", {Kind::boolean}) && v.b; }},
    {"undefined", [](Renderer& r, const Value& v, Args& a) { return kind_test(r, v, a, "undefined", {Kind::undefined}); }},
    {"upper", [](Renderer& r, const Value& v, Args& a) { return case_test(r, v, a, "upper", true); }},
};

int find_test(std::string_view name) {
  static const std::pair<std::string_view, std::string_view> kAliases[] = {
      {"==", "eq"}, {"equalto", "eq"}, {"!=", "ne"}, {"<", "lt"}, {"lessthan", "lt"}, {"<=", "le"},
      {">", "gt"}, {"greaterthan", "gt"}, {">=", "ge"}};
  for (const auto& [alias, real] : kAliases)
    if (name == alias) name = real;
  for (size_t k = 0; k < std::size(kTests); ++k)
    if (name == kTests[k].name) return static_cast<int>(k);
  return -1;
}

bool Renderer::apply_test(int fn, const Value& v, Args& args) { return kTests[fn].fn(*this, v, args); }

// ---- globals: the template's variables and Hugging Face's functions

void Renderer::add_globals(std::span<const ChatMessage> messages) {
  auto& g = frame->vars;
  ValueList list;
  for (const auto& m : messages) {
    DictData d;
    d.entries.emplace_back(make_string("role"), str(m.role));
    d.entries.emplace_back(make_string("content"), str(m.content));
    list.push_back(make_dict(std::move(d)));
  }
  g["messages"] = seq(Kind::list, std::move(list));
  g["bos_token"] = str(ctx.bos_token);
  g["eos_token"] = str(ctx.eos_token);
  g["add_generation_prompt"] = make_bool(ctx.add_generation_prompt);
  g["raise_exception"] = make_function("raise_exception", [](Renderer& r, Args& a) -> Value {
    Bound b = r.bind(a, {"message"}, "raise_exception", 1);
    throw Error(ErrorCode::invalid_argument, r.to_str(b.get(0)));
  });
  g["strftime_now"] = make_function("strftime_now", [](Renderer& r, Args& a) {
    Bound b = r.bind(a, {"format"}, "strftime_now", 1);
    const std::time_t t = r.ctx.now ? *r.ctx.now : std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    return r.str(r.strftime(r.str_arg(b.get(0), "strftime_now format"), tm));
  });
  g["range"] = make_function("range", [](Renderer& r, Args& a) {
    Bound b = r.bind(a, {"start", "stop", "step"}, "range", 1);
    int64_t start = 0, stop = r.int_arg(b.get(0), "range() argument"), step = 1;
    if (b.p[1]) {
      start = stop;
      stop = r.int_arg(b.get(1), "range() argument");
    }
    if (b.p[2]) step = r.int_arg(b.get(2), "range() step");
    if (step == 0) r.fail("range() arg 3 must not be zero");
    const double count = std::max(0.0, std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step)));
    if (count > kMaxRange) r.fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    ValueList out;
    for (int64_t k = 0; k < static_cast<int64_t>(count); ++k) out.push_back(make_int(start + k * step));
    return r.seq(Kind::list, std::move(out));
  });
  g["namespace"] = make_function("namespace", [](Renderer& r, Args& a) {
    r.charge(1);
    r.namespaces.push_back(std::make_unique<NsData>());
    NsData* ns = r.namespaces.back().get();
    if (a.pos.size() > 1) r.fail("namespace() takes at most 1 positional argument");
    if (!a.pos.empty()) {
      if (a.pos[0].kind != Kind::dict) r.fail("namespace() argument must be a dict");
      for (const auto& [k, x] : a.pos[0].dict->entries) ns->attrs.emplace_back(r.to_str(k), x);
    }
    for (auto& [k, x] : a.kw) ns->attrs.emplace_back(k, std::move(x));
    Value v;
    v.kind = Kind::ns;
    v.ns = ns;
    return v;
  });
  g["dict"] = make_function("dict", [](Renderer& r, Args& a) {
    DictData d;
    if (a.pos.size() > 1) r.fail("dict expected at most 1 argument");
    if (!a.pos.empty()) {
      if (a.pos[0].kind != Kind::dict) r.fail("dict() argument must be a dict");
      d = *a.pos[0].dict;
    }
    for (auto& [k, x] : a.kw) r.put(d, make_string(k), std::move(x));
    return r.make_dict(std::move(d));
  });
}

}  // namespace

struct ChatTemplate::Program {
  Body body;
};

ChatTemplate::ChatTemplate(std::string source) : source_(std::move(source)) {
  const std::string text = normalize_newlines(source_);
  auto program = std::make_shared<Program>();
  program->body = Parser(Lexer(text).tokens()).parse();
  program_ = std::move(program);
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, const ChatTemplateContext& ctx) const {
  Renderer r(ctx);
  r.frame = std::make_shared<Frame>();
  r.add_globals(messages);
  std::string out;
  r.out = &out;
  r.exec(program_->body);
  return out;
}

const std::string& ChatTemplate::chatml() {
  static const std::string kChatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  return kChatml;
}

}  // namespace slim::text
