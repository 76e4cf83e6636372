// Triton model configurations: protobuf text format (config.pbtxt) is read by hand and
// config.json by nlohmann::json, both into one small field tree; one mapping turns the
// tree into ModelConfig. protobuf's TextFormat would need Triton's .proto compiled in and
// fails on any field it does not know, where slim warns and goes on.
#include "slim/serve/model_config.h"

#include <charconv>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "slim/core/error.h"

namespace slim::serve {

namespace {

struct DTypeNames {
  DType dtype;
  std::string_view triton, kserve;
};

constexpr DTypeNames kDTypeNames[] = {
    {DType::boolean, "TYPE_BOOL", "BOOL"}, {DType::u8, "TYPE_UINT8", "UINT8"},
    {DType::u16, "TYPE_UINT16", "UINT16"}, {DType::u32, "TYPE_UINT32", "UINT32"},
    {DType::u64, "TYPE_UINT64", "UINT64"}, {DType::i8, "TYPE_INT8", "INT8"},
    {DType::i16, "TYPE_INT16", "INT16"},   {DType::i32, "TYPE_INT32", "INT32"},
    {DType::i64, "TYPE_INT64", "INT64"},   {DType::f16, "TYPE_FP16", "FP16"},
    {DType::f32, "TYPE_FP32", "FP32"},     {DType::f64, "TYPE_FP64", "FP64"},
    {DType::bf16, "TYPE_BF16", "BF16"},
};

const DTypeNames& names_of(DType t) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == t) return d;
  throw Error(ErrorCode::internal, "no Triton name for dtype " + std::string(dtype_name(t)));
}

// ---- The field tree ----------------------------------------------------------------

struct Field;

// A message (its fields in order; a repeated field appears once per element) or a scalar
// as written: an identifier (enum value, true/false), a number literal, a decoded string.
struct Node {
  enum class Kind { message, identifier, number, string };
  Kind kind = Kind::message;
  std::string text;
  std::vector<Field> fields;
  int line = 0, column = 0;  // where the value starts; 0 for JSON (nlohmann keeps no positions)
};

struct Field {
  std::string name;
  Node value;
};

// Deep enough for any Triton config, shallow enough that recursion stays cheap.
constexpr int kMaxDepth = 64;

// ---- Protobuf text format ------------------------------------------------------------

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_ident_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_ident_char(char c) {
  return is_ident_start(c) || is_digit(c);
}
int hex_value(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// Names end up in JSON replies (metadata, errors), which must be UTF-8; protobuf also
// rejects string fields that are not.
bool valid_utf8(std::string_view s) {
  static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};  // shortest form per length
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (n < 0 || s.size() - i <= size_t(n)) return false;
    uint32_t cp = n == 0 ? c : c & (0x3F >> n);
    for (int k = 1; k <= n; ++k) {
      auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = cp << 6 | (d & 0x3F);
    }
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += size_t(n) + 1;
  }
  return true;
}

// A number literal as protobuf's text format writes one: decimal or 0x hex integers,
// floats with an optional f suffix, -inf / -nan.
bool valid_number(std::string_view t) {
  if (!t.empty() && t[0] == '-') t.remove_prefix(1);
  if (t.empty()) return false;
  if (t == "inf" || t == "infinity" || t == "nan") return true;
  if (t.size() > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) {
    for (char c : t.substr(2))
      if (hex_value(c) < 0) return false;
    return true;
  }
  if (t.back() == 'f' || t.back() == 'F') t.remove_suffix(1);
  double d;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), d);
  return ec == std::errc() && end == t.data() + t.size();
}

class TextParser {
 public:
  TextParser(std::string_view text, const std::string& origin) : s_(text), origin_(origin) {}

  Node parse() {
    Node root;
    root.line = root.column = 1;
    fields(root, '\0', 0);
    return root;
  }

 private:
  [[noreturn]] void fail(int line, int column, const std::string& message) const {
    throw Error(ErrorCode::invalid_model, origin_ + ":" + std::to_string(line) + ":" +
                                              std::to_string(column) + ": " + message);
  }
  [[noreturn]] void fail_here(const std::string& message) {
    skip_space();
    fail(line_, column_, message);
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char cur() const { return s_[pos_]; }
  void advance() {
    if (s_[pos_] == '\n') {
      ++line_;
      column_ = 1;
    } else {
      ++column_;
    }
    ++pos_;
  }
  void skip_space() {
    while (!at_end()) {
      char c = cur();
      if (c == '#') {
        while (!at_end() && cur() != '\n') advance();
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
        advance();
      } else {
        break;
      }
    }
  }
  bool accept(char c) {
    skip_space();
    if (at_end() || cur() != c) return false;
    advance();
    return true;
  }
  std::string next_described() {
    skip_space();
    if (at_end()) return "the end of the text";
    unsigned char c = static_cast<unsigned char>(cur());
    if (c >= 0x20 && c < 0x7F) return std::string("'") + char(c) + "'";
    static const char kHex[] = "0123456789abcdef";
    return std::string("byte 0x") + kHex[c >> 4] + kHex[c & 15];
  }

  // The fields of a message up to `close` ('\0': the end of the text).
  void fields(Node& msg, char close, int depth) {
    for (;;) {
      skip_space();
      if (at_end()) {
        if (close)
          fail(msg.line, msg.column, std::string("message is not closed with '") + close + "'");
        return;
      }
      if (close && cur() == close) {
        advance();
        return;
      }
      if (!is_ident_start(cur())) fail_here("expected a field name, found " + next_described());
      std::string name = identifier();
      bool colon = accept(':');
      if (accept('[')) {
        if (!accept(']')) {
          do {
            msg.fields.push_back({name, value(name, colon, depth)});
          } while (accept(','));
          if (!accept(']'))
            fail_here("expected ',' or ']' in the list of '" + name + "', found " +
                      next_described());
        }
      } else {
        msg.fields.push_back({name, value(name, colon, depth)});
      }
      if (!accept(',')) accept(';');
    }
  }

  // A message needs no ':' before it; a scalar does (protobuf's rule).
  Node value(const std::string& name, bool colon, int depth) {
    skip_space();
    Node v;
    v.line = line_;
    v.column = column_;
    if (!at_end() && (cur() == '{' || cur() == '<')) {
      if (depth + 1 >= kMaxDepth) fail_here("messages nested deeper than 64 levels");
      char close = cur() == '{' ? '}' : '>';
      advance();
      fields(v, close, depth + 1);
      return v;
    }
    if (!colon)
      fail_here("expected ':' or '{' after field name '" + name + "', found " + next_described());
    if (at_end()) fail_here("expected a value for '" + name + "', found the end of the text");
    char c = cur();
    if (c == '"' || c == '\'') {
      v.kind = Node::Kind::string;
      for (;;) {  // adjacent strings are one string, as in C
        v.text += quoted();
        skip_space();
        if (at_end() || (cur() != '"' && cur() != '\'')) break;
      }
      if (!valid_utf8(v.text)) fail(v.line, v.column, "string is not valid UTF-8");
    } else if (is_ident_start(c)) {
      v.kind = Node::Kind::identifier;
      v.text = identifier();
    } else if (c == '-' || c == '.' || is_digit(c)) {
      v.kind = Node::Kind::number;
      v.text = number();
    } else {
      fail_here("expected a value for '" + name + "', found " + next_described());
    }
    return v;
  }

  std::string identifier() {
    size_t start = pos_;
    while (!at_end() && is_ident_char(cur())) advance();
    return std::string(s_.substr(start, pos_ - start));
  }

  std::string number() {
    int line = line_, column = column_;
    size_t start = pos_;
    if (cur() == '-') advance();
    bool hex = s_.substr(pos_, 2) == "0x" || s_.substr(pos_, 2) == "0X";
    while (!at_end()) {
      char c = cur();
      bool exponent_sign = !hex && pos_ > start && (c == '+' || c == '-') &&
                           (s_[pos_ - 1] == 'e' || s_[pos_ - 1] == 'E');
      if (!is_ident_char(c) && c != '.' && !exponent_sign) break;
      advance();
    }
    std::string t(s_.substr(start, pos_ - start));
    if (!valid_number(t)) fail(line, column, "malformed number '" + t + "'");
    return t;
  }

  std::string quoted() {
    int line = line_, column = column_;
    char quote = cur();
    advance();
    std::string out;
    for (;;) {
      if (at_end() || cur() == '\n') fail(line, column, "string is not closed on its line");
      int esc_line = line_, esc_column = column_;
      char c = cur();
      advance();
      if (c == quote) return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_end()) fail(line, column, "string is not closed on its line");
      char e = cur();
      advance();
      static constexpr std::string_view kSimple = "ntrabfv\\'\"?",
                                        kSimpleValue = "\n\t\r\a\b\f\v\\'\"?";
      if (size_t k = kSimple.find(e); k != std::string_view::npos) {
        out += kSimpleValue[k];
      } else if (e == 'x' || e == 'X') {
        int v = 0, n = 0;
        for (; n < 2 && !at_end() && hex_value(cur()) >= 0; ++n, advance())
          v = v * 16 + hex_value(cur());
        if (n == 0) fail(esc_line, esc_column, "'\\x' without hex digits in string");
        out += char(v);
      } else if (e == 'u' || e == 'U') {
        uint32_t cp = 0;
        int want = e == 'u' ? 4 : 8;
        for (int n = 0; n < want; ++n, advance()) {
          if (at_end() || hex_value(cur()) < 0)
            fail(esc_line, esc_column,
                 std::string("'\\") + e + "' needs " + std::to_string(want) + " hex digits");
          cp = cp * 16 + uint32_t(hex_value(cur()));
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
          fail(esc_line, esc_column,
               std::string("'\\") + e + "' escape is not a Unicode code point");
        append_utf8(out, cp);
      } else if (e >= '0' && e <= '7') {
        int v = e - '0';
        for (int n = 1; n < 3 && !at_end() && cur() >= '0' && cur() <= '7'; ++n, advance())
          v = v * 8 + (cur() - '0');
        if (v > 255) fail(esc_line, esc_column, "octal escape above \\377 in string");
        out += char(v);
      } else {
        fail(esc_line, esc_column, std::string("unknown escape '\\") + e + "' in string");
      }
    }
  }

  std::string_view s_;
  const std::string& origin_;
  size_t pos_ = 0;
  int line_ = 1, column_ = 1;
};

// ---- JSON ----------------------------------------------------------------------------

// JSON arrays become repeated fields and null an absent field, as protobuf's JSON
// mapping reads them; objects stay messages (a map is an object keyed by the map key).
[[noreturn]] void fail_json(const std::string& origin, const std::string& path,
                            const std::string& message) {
  throw Error(ErrorCode::invalid_model, origin + ": field '" + path + "': " + message);
}

Node json_to_node(const nlohmann::json& j, const std::string& origin, const std::string& path,
                  int depth) {
  Node n;
  switch (j.type()) {
    case nlohmann::json::value_t::object:
      if (depth + 1 >= kMaxDepth) fail_json(origin, path, "objects nested deeper than 64 levels");
      for (auto it = j.begin(); it != j.end(); ++it) {
        std::string sub = path.empty() ? it.key() : path + "." + it.key();
        if (!it.value().is_array()) {
          if (!it.value().is_null())
            n.fields.push_back({it.key(), json_to_node(it.value(), origin, sub, depth + 1)});
          continue;
        }
        for (const auto& e : it.value()) {
          if (e.is_array()) fail_json(origin, sub, "a list inside a list");
          if (!e.is_null()) n.fields.push_back({it.key(), json_to_node(e, origin, sub, depth + 1)});
        }
      }
      break;
    case nlohmann::json::value_t::string:
      n.kind = Node::Kind::string;
      n.text = j.get<std::string>();
      break;
    case nlohmann::json::value_t::boolean:
      n.kind = Node::Kind::identifier;
      n.text = j.get<bool>() ? "true" : "false";
      break;
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
    case nlohmann::json::value_t::number_float:
      n.kind = Node::Kind::number;
      n.text = j.dump();
      break;
    default:
      fail_json(origin, path, "expected an object, a list or a value");
  }
  return n;
}

// ---- Mapping the tree to ModelConfig ---------------------------------------------------

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kUInt32Max = std::numeric_limits<uint32_t>::max();
// uint64 fields (microseconds, levels) are read as int64: values above 2^63 are no use.
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

struct Context {
  const std::string& origin;
  bool json;  // JSON allows integers as strings ("16") and writes enum values as strings
  std::vector<std::string>& warnings;

  std::string where(const Node& at) const {
    if (at.line == 0) return origin;
    return origin + ":" + std::to_string(at.line) + ":" + std::to_string(at.column);
  }
  [[noreturn]] void fail(const Node& at, const std::string& path, const std::string& message,
                         ErrorCode code = ErrorCode::invalid_model) const {
    throw Error(code, where(at) + ": field '" + path + "': " + message);
  }
  void warn(const Node& at, const std::string& message) {
    warnings.push_back(where(at) + ": " + message);
  }
};

std::string found(const Node& n) {
  switch (n.kind) {
    case Node::Kind::message:
      return "a message";
    case Node::Kind::string:
      return "the string \"" + n.text + "\"";
    case Node::Kind::identifier:
    case Node::Kind::number:
      return "'" + n.text + "'";
  }
  return "";
}

// The fields of one message, asked for by name. Whatever is never asked for is unknown.
class Message {
 public:
  Message(Context& ctx, const Node& node, std::string path)
      : ctx_(ctx), node_(node), path_(std::move(path)) {
    if (node.kind != Node::Kind::message)
      ctx.fail(node, path_, "expected a message { ... }, found " + found(node));
  }

  const Node& node() const { return node_; }
  std::string path(std::string_view name) const {
    return path_.empty() ? std::string(name) : path_ + "." + std::string(name);
  }
  std::string path(std::string_view name, size_t index) const {
    return path(name) + "[" + std::to_string(index) + "]";
  }

  std::vector<const Node*> repeated(std::string_view name) {
    known_.emplace(name);
    std::vector<const Node*> out;
    for (const Field& f : node_.fields)
      if (f.name == name) out.push_back(&f.value);
    return out;
  }

  const Node* optional(std::string_view name) {
    auto all = repeated(name);
    if (all.size() > 1) ctx_.fail(*all[1], path(name), "given more than once");
    return all.empty() ? nullptr : all[0];
  }

  // Triton fields slim reads past: one warning each, naming the field.
  void ignore(std::initializer_list<std::string_view> names, std::string_view why = "") {
    for (std::string_view name : names) {
      auto all = repeated(name);
      if (!all.empty())
        ctx_.warn(*all[0], "field '" + path(name) + "' is not used by slim" + std::string(why) +
                               "; ignored");
    }
  }

  void finish() {
    for (const Field& f : node_.fields)
      if (known_.insert(f.name).second)
        ctx_.warn(f.value, "unknown field '" + path(f.name) + "' ignored");
  }

 private:
  Context& ctx_;
  const Node& node_;
  std::string path_;
  std::set<std::string, std::less<>> known_;
};

int64_t int_value(const Context& ctx, const Node& n, const std::string& path, int64_t lo,
                  int64_t hi) {
  if (n.kind != Node::Kind::number && !(ctx.json && n.kind == Node::Kind::string))
    ctx.fail(n, path, "expected an integer, found " + found(n));
  std::string_view t = n.text;
  bool negative = !t.empty() && t[0] == '-';
  if (negative) t.remove_prefix(1);
  int base = 10;
  if (t.size() > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) {
    base = 16;
    t.remove_prefix(2);
  }
  uint64_t magnitude = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), magnitude, base);
  if ((ec != std::errc() && ec != std::errc::result_out_of_range) || t.empty() ||
      end != t.data() + t.size())
    ctx.fail(n, path, "expected an integer, found " + found(n));
  constexpr uint64_t kMinMagnitude = uint64_t(kInt64Max) + 1;
  bool fits = ec == std::errc() && magnitude <= (negative ? kMinMagnitude : uint64_t(kInt64Max));
  int64_t v = negative ? int64_t(0 - magnitude) : int64_t(magnitude);  // modular since C++20
  if (!fits || v < lo || v > hi)
    ctx.fail(
        n, path,
        n.text + " is out of range (" + std::to_string(lo) + " to " + std::to_string(hi) + ")");
  return v;
}

std::string string_value(const Context& ctx, const Node& n, const std::string& path) {
  if (n.kind != Node::Kind::string) ctx.fail(n, path, "expected a string, found " + found(n));
  return n.text;
}

bool bool_value(const Context& ctx, const Node& n, const std::string& path) {
  if (n.kind == Node::Kind::identifier && n.text == "true") return true;
  if (n.kind == Node::Kind::identifier && n.text == "false") return false;
  if (!ctx.json) {  // protobuf's text format also takes True / t / 1 and False / f / 0
    bool word = n.kind == Node::Kind::identifier, digit = n.kind == Node::Kind::number;
    if ((word && (n.text == "True" || n.text == "t")) || (digit && n.text == "1")) return true;
    if ((word && (n.text == "False" || n.text == "f")) || (digit && n.text == "0")) return false;
  }
  ctx.fail(n, path, "expected true or false, found " + found(n));
}

// An enum value: an identifier in the text format, a string in JSON.
std::string enum_text(const Context& ctx, const Node& n, const std::string& path) {
  Node::Kind want = ctx.json ? Node::Kind::string : Node::Kind::identifier;
  if (n.kind != want) ctx.fail(n, path, "expected an enum value, found " + found(n));
  return n.text;
}

size_t enum_value(const Context& ctx, const Node& n, const std::string& path,
                  std::initializer_list<std::string_view> values) {
  std::string v = enum_text(ctx, n, path);
  std::string list;
  size_t i = 0;
  for (std::string_view allowed : values) {
    if (allowed == v) return i;
    list += (i++ ? ", " : "") + std::string(allowed);
  }
  ctx.fail(n, path, "unknown value '" + v + "' (expected one of " + list + ")");
}

TensorConfig tensor_config(Context& ctx, Message& m, bool input, int64_t max_batch_size) {
  TensorConfig t;
  const Node* name = m.optional("name");
  if (!name)
    ctx.fail(m.node(), m.path("name"),
             (input ? "an input" : "an output") + std::string(" without a name"));
  t.name = string_value(ctx, *name, m.path("name"));
  const Node* data_type = m.optional("data_type");
  if (!data_type) ctx.fail(m.node(), m.path("data_type"), "'" + t.name + "' has no data_type");
  std::string type_name = enum_text(ctx, *data_type, m.path("data_type"));
  try {
    t.dtype = parse_triton_dtype(type_name);
  } catch (const Error& e) {
    ctx.fail(
        *data_type, m.path("data_type"), e.what(),
        e.code() == ErrorCode::unsupported ? ErrorCode::unsupported : ErrorCode::invalid_model);
  }
  auto dims = m.repeated("dims");
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d =
        int_value(ctx, *dims[i], m.path("dims", i), std::numeric_limits<int64_t>::min(), kInt64Max);
    if (d < 1 && d != -1)
      ctx.fail(*dims[i], m.path("dims", i),
               std::to_string(d) + " is not a dimension (>= 1, or -1 for any size)");
    t.dims.push_back(d);
  }
  // With batching, empty dims are one value per batch row (a shape [batch]).
  if (dims.empty() && max_batch_size == 0)
    ctx.fail(m.node(), m.path("dims"),
             "'" + t.name +
                 "' has no dims; without batching (max_batch_size 0) "
                 "dims is the full shape");
  m.ignore({"reshape"}, " (the tensor keeps the shape of 'dims')");
  m.ignore({"is_shape_tensor", "is_non_linear_format_io"});
  if (input) {
    if (const Node* n = m.optional("allow_ragged_batch")) {
      t.allow_ragged_batch = bool_value(ctx, *n, m.path("allow_ragged_batch"));
      if (t.allow_ragged_batch)
        ctx.warn(*n, "field '" + m.path("allow_ragged_batch") +
                         "' is not acted on: slim batches only "
                         "requests of the same shape");
    }
    if (const Node* n = m.optional("optional"); n && bool_value(ctx, *n, m.path("optional")))
      ctx.warn(*n, "field '" + m.path("optional") + "' is not used by slim; ignored");
    // Any format but FORMAT_NONE (value 0) is a layout slim does not check.
    if (const Node* n = m.optional("format");
        n && enum_value(ctx, *n, m.path("format"), {"FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW"}))
      ctx.warn(*n, "field '" + m.path("format") + "' is not used by slim; ignored");
  } else {
    m.ignore({"label_filename"}, " (outputs carry no class labels)");
  }
  m.finish();
  return t;
}

void read_tensors(Context& ctx, Message& top, std::string_view field, bool input,
                  int64_t max_batch_size, std::vector<TensorConfig>& out) {
  auto nodes = top.repeated(field);
  std::set<std::string> names;
  for (size_t i = 0; i < nodes.size(); ++i) {
    Message m(ctx, *nodes[i], top.path(field, i));
    TensorConfig t = tensor_config(ctx, m, input, max_batch_size);
    if (!names.insert(t.name).second)
      ctx.fail(*nodes[i], m.path("name"),
               "two " + std::string(input ? "inputs" : "outputs") + " named '" + t.name + "'");
    out.push_back(std::move(t));
  }
}

VersionPolicy version_policy(Context& ctx, const Node& node) {
  VersionPolicy p;
  Message m(ctx, node, "version_policy");
  const Node* latest = m.optional("latest");
  const Node* all = m.optional("all");
  const Node* specific = m.optional("specific");
  if ((latest != nullptr) + (all != nullptr) + (specific != nullptr) > 1)
    ctx.fail(node, "version_policy", "takes only one of 'latest', 'all' and 'specific'");
  if (latest) {
    Message l(ctx, *latest, m.path("latest"));
    if (const Node* n = l.optional("num_versions"))
      p.latest_num_versions = uint32_t(int_value(ctx, *n, l.path("num_versions"), 1, kUInt32Max));
    l.finish();
  } else if (all) {
    p.kind = VersionPolicy::Kind::all;
    Message(ctx, *all, m.path("all")).finish();
  } else if (specific) {
    p.kind = VersionPolicy::Kind::specific;
    Message s(ctx, *specific, m.path("specific"));
    auto versions = s.repeated("versions");
    if (versions.empty()) ctx.fail(*specific, s.path("versions"), "no versions listed");
    for (size_t i = 0; i < versions.size(); ++i)
      p.specific_versions.push_back(
          int_value(ctx, *versions[i], s.path("versions", i), 1, kInt64Max));
    s.finish();
  }
  m.finish();
  return p;
}

uint32_t instance_count(Context& ctx, Message& top) {
  auto groups = top.repeated("instance_group");
  if (groups.empty()) return 1;
  int64_t total = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    Message g(ctx, *groups[i], top.path("instance_group", i));
    int64_t count = 1;
    if (const Node* n = g.optional("count"))
      count = int_value(ctx, *n, g.path("count"), 1, kInt32Max);
    if (const Node* n = g.optional("kind")) {
      size_t kind =
          enum_value(ctx, *n, g.path("kind"), {"KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"});
      if (kind == 1 || kind == 3)
        ctx.warn(*n,
                 "'" + g.path("kind") + "' is " + n->text + ": slim runs the instances on the CPU");
    }
    if (const Node* n = g.optional("name")) string_value(ctx, *n, g.path("name"));
    g.ignore({"gpus"}, " (instances run on the CPU)");
    g.ignore({"rate_limiter", "secondary_devices", "profile", "passive", "host_policy"});
    g.finish();
    total += count;  // at most 2^31 per group: cannot overflow before the check below
    if (total > kUInt32Max)
      ctx.fail(*groups[i], top.path("instance_group"), "more than 2^32 - 1 instances");
  }
  return uint32_t(total);
}

QueuePolicy queue_policy(Context& ctx, const Node& node, const std::string& path) {
  QueuePolicy q;
  Message m(ctx, node, path);
  if (const Node* n = m.optional("timeout_action"))
    q.timeout_action = enum_value(ctx, *n, m.path("timeout_action"), {"REJECT", "DELAY"}) == 0
                           ? QueuePolicy::TimeoutAction::reject
                           : QueuePolicy::TimeoutAction::delay;
  if (const Node* n = m.optional("default_timeout_microseconds"))
    q.default_timeout_microseconds =
        uint64_t(int_value(ctx, *n, m.path("default_timeout_microseconds"), 0, kInt64Max));
  if (const Node* n = m.optional("allow_timeout_override"))
    q.allow_timeout_override = bool_value(ctx, *n, m.path("allow_timeout_override"));
  if (const Node* n = m.optional("max_queue_size"))
    q.max_queue_size = uint32_t(int_value(ctx, *n, m.path("max_queue_size"), 0, kUInt32Max));
  m.finish();
  return q;
}

DynamicBatchingConfig dynamic_batching(Context& ctx, const Node& node, int64_t max_batch_size) {
  const std::string path = "dynamic_batching";
  if (max_batch_size == 0)
    ctx.fail(node, path,
             "given with max_batch_size 0: a model that does not batch cannot be batched");
  DynamicBatchingConfig b;
  Message m(ctx, node, path);
  auto preferred = m.repeated("preferred_batch_size");
  for (size_t i = 0; i < preferred.size(); ++i) {
    std::string p = m.path("preferred_batch_size", i);
    int64_t size = int_value(ctx, *preferred[i], p, std::numeric_limits<int32_t>::min(), kInt32Max);
    if (size <= 0) ctx.fail(*preferred[i], p, std::to_string(size) + " is not a batch size (>= 1)");
    if (size > max_batch_size)
      ctx.fail(*preferred[i], p,
               std::to_string(size) + " is above max_batch_size " + std::to_string(max_batch_size));
    b.preferred_batch_size.push_back(size);
  }
  if (const Node* n = m.optional("max_queue_delay_microseconds"))
    b.max_queue_delay_microseconds =
        uint64_t(int_value(ctx, *n, m.path("max_queue_delay_microseconds"), 0, kInt64Max));
  if (const Node* n = m.optional("preserve_ordering"))
    b.preserve_ordering = bool_value(ctx, *n, m.path("preserve_ordering"));
  if (const Node* n = m.optional("priority_levels"))
    b.priority_levels = uint32_t(int_value(ctx, *n, m.path("priority_levels"), 0, kUInt32Max));
  const Node* default_level = m.optional("default_priority_level");
  if (default_level) {
    std::string p = m.path("default_priority_level");
    b.default_priority_level = uint32_t(int_value(ctx, *default_level, p, 0, kUInt32Max));
    if (b.default_priority_level > b.priority_levels)
      ctx.fail(*default_level, p,
               std::to_string(b.default_priority_level) + " is above priority_levels " +
                   std::to_string(b.priority_levels));
  }
  if (b.priority_levels > 0 && b.default_priority_level == 0) {
    b.default_priority_level = b.priority_levels;
    ctx.warn(default_level ? *default_level : node,
             "'" + m.path("default_priority_level") +
                 "' is not set: requests without a priority get the "
                 "least urgent level " +
                 std::to_string(b.priority_levels));
  }
  if (const Node* n = m.optional("default_queue_policy"))
    b.default_queue_policy = queue_policy(ctx, *n, m.path("default_queue_policy"));

  // A protobuf map: repeated { key: K value { ... } } entries in the text format, an object
  // keyed by the level ("1": { ... }) in JSON.
  auto add_policy = [&](const Node& key_node, const std::string& key_path, const Node* value,
                        const std::string& value_path) {
    auto level = uint32_t(int_value(ctx, key_node, key_path, 0, kUInt32Max));
    if (level < 1 || level > b.priority_levels)
      ctx.fail(key_node, key_path,
               "level " + std::to_string(level) + " is not among the priority levels 1.." +
                   std::to_string(b.priority_levels));
    if (b.priority_queue_policy.count(level))
      ctx.fail(key_node, key_path, "level " + std::to_string(level) + " has two policies");
    b.priority_queue_policy[level] = value ? queue_policy(ctx, *value, value_path) : QueuePolicy{};
  };
  auto entries = m.repeated("priority_queue_policy");
  for (size_t i = 0; i < entries.size(); ++i) {
    Message e(ctx, *entries[i], m.path("priority_queue_policy", i));
    if (ctx.json) {
      for (const Field& f : entries[i]->fields) {
        Node key;  // the object's key, read as the integer it spells
        key.kind = Node::Kind::number;
        key.text = f.name;
        std::string p = m.path("priority_queue_policy") + "." + f.name;
        add_policy(key, p, &f.value, p);
      }
    } else {
      const Node* key = e.optional("key");
      if (!key) ctx.fail(*entries[i], e.path("key"), "a map entry without a key");
      add_policy(*key, e.path("key"), e.optional("value"), e.path("value"));
      e.finish();
    }
  }
  m.finish();
  return b;
}

ModelConfig map_config(Context& ctx, const Node& root) {
  ModelConfig c;
  Message m(ctx, root, "");
  auto string_field = [&](std::string_view name, std::string& out) {
    if (const Node* n = m.optional(name)) out = string_value(ctx, *n, std::string(name));
  };
  string_field("name", c.name);
  string_field("platform", c.platform);
  string_field("backend", c.backend);
  string_field("default_model_filename", c.default_model_filename);
  if (const Node* n = m.optional("max_batch_size"))
    c.max_batch_size = int_value(ctx, *n, "max_batch_size", 0, kInt32Max);
  read_tensors(ctx, m, "input", true, c.max_batch_size, c.inputs);
  read_tensors(ctx, m, "output", false, c.max_batch_size, c.outputs);
  if (const Node* n = m.optional("version_policy")) c.version_policy = version_policy(ctx, *n);
  c.instance_count = instance_count(ctx, m);

  // Triton's scheduling_choice is a oneof.
  const Node* batching = m.optional("dynamic_batching");
  std::vector<std::string_view> schedulers;
  for (std::string_view s : {"dynamic_batching", "sequence_batching", "ensemble_scheduling"})
    if (!m.repeated(s).empty()) schedulers.push_back(s);
  if (schedulers.size() > 1)
    ctx.fail(*m.repeated(schedulers[1])[0], std::string(schedulers[1]),
             "given with '" + std::string(schedulers[0]) + "': a model has one scheduler");
  if (batching) c.dynamic_batching = dynamic_batching(ctx, *batching, c.max_batch_size);

  // Triton's map<string, ModelParameter>: repeated { key: K value { string_value: V } }
  // entries in the text format, an object keyed by K in JSON.
  auto add_parameter = [&](const std::string& key, const Node* value, const std::string& path) {
    if (c.parameters.count(key)) ctx.fail(value ? *value : root, path, "parameter '" + key + "' is given twice");
    std::string v;
    if (value) {
      Message pm(ctx, *value, path);
      if (const Node* sv = pm.optional("string_value")) v = string_value(ctx, *sv, pm.path("string_value"));
      pm.finish();
    }
    c.parameters[key] = v;
  };
  auto params = m.repeated("parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    Message e(ctx, *params[i], m.path("parameters", i));
    if (ctx.json) {
      for (const Field& f : params[i]->fields) add_parameter(f.name, &f.value, "parameters." + f.name);
    } else {
      const Node* key = e.optional("key");
      if (!key) ctx.fail(*params[i], e.path("key"), "a map entry without a key");
      add_parameter(string_value(ctx, *key, e.path("key")), e.optional("value"), e.path("value"));
      e.finish();
    }
  }
  m.ignore({"optimization", "model_warmup", "sequence_batching",
            "ensemble_scheduling", "model_transaction_policy", "response_cache", "model_operations",
            "model_repository_agents", "cc_model_filenames", "metric_tags", "runtime",
            "batch_input", "batch_output", "model_metrics"});
  m.finish();
  return c;
}

}  // namespace

DType parse_triton_dtype(std::string_view name) {
  for (const auto& d : kDTypeNames)
    if (d.triton == name) return d.dtype;
  if (name == "TYPE_STRING")
    throw Error(ErrorCode::unsupported, "string tensors are not supported (TYPE_STRING)");
  throw Error(ErrorCode::invalid_argument, "unknown Triton data type '" + std::string(name) + "'");
}

std::string triton_dtype_name(DType t) {
  return std::string(names_of(t).triton);
}

DType parse_kserve_dtype(std::string_view name) {
  for (const auto& d : kDTypeNames)
    if (d.kserve == name) return d.dtype;
  if (name == "BYTES")
    throw Error(ErrorCode::unsupported, "string tensors are not supported (BYTES)");
  throw Error(ErrorCode::invalid_argument, "unknown KServe datatype '" + std::string(name) + "'");
}

std::string_view kserve_dtype_name(DType t) {
  return names_of(t).kserve;
}

ModelConfig parse_model_config_pbtxt(std::string_view text, const std::string& origin) {
  Node root = TextParser(text, origin).parse();
  std::vector<std::string> warnings;
  Context ctx{origin, false, warnings};
  ModelConfig c = map_config(ctx, root);
  c.warnings = std::move(warnings);
  return c;
}

ModelConfig parse_model_config_json(std::string_view text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number out of double range
    throw Error(ErrorCode::invalid_model, origin + ": " + e.what());
  }
  if (!j.is_object())
    throw Error(ErrorCode::invalid_model, origin + ": the configuration is not a JSON object");
  Node root = json_to_node(j, origin, "", 0);
  std::vector<std::string> warnings;
  Context ctx{origin, true, warnings};
  ModelConfig c = map_config(ctx, root);
  c.warnings = std::move(warnings);
  return c;
}

}  // namespace slim::serve
