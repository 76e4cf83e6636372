// Checked access to untrusted JSON (signature bundles, audit records): every field is
// type-checked before use and each failure names the source and the field, so a
// malformed file becomes a slim::Error instead of a nlohmann exception.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "slim/core/error.h"

namespace slim::trust::detail {

using Json = nlohmann::json;

// Refuses nesting deeper than max_depth before parsing, so hostile input cannot make
// the parser or the destructor recurse without bound.
inline Json parse_json(std::string_view text, const std::string& context, int max_depth = 32) {
  int depth = 0;
  bool in_string = false, escape = false;
  for (char c : text) {
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') {
      if (++depth > max_depth)
        throw Error(ErrorCode::invalid_model,
                    context + ": JSON nested deeper than " + std::to_string(max_depth));
    } else if (c == '}' || c == ']') --depth;
  }
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    throw Error(ErrorCode::invalid_model, context + ": invalid JSON: " + e.what());
  }
}

inline const Json& field(const Json& obj, const char* key, const std::string& context) {
  if (!obj.is_object())
    throw Error(ErrorCode::invalid_model, context + ": expected a JSON object");
  auto it = obj.find(key);
  if (it == obj.end())
    throw Error(ErrorCode::invalid_model, context + ": missing field '" + key + "'");
  return *it;
}

inline const Json* optional_field(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

inline const std::string& string_field(const Json& obj, const char* key,
                                       const std::string& context) {
  const Json& v = field(obj, key, context);
  if (!v.is_string())
    throw Error(ErrorCode::invalid_model, context + ": field '" + key + "' must be a string");
  return v.get_ref<const std::string&>();
}

inline const Json& array_field(const Json& obj, const char* key, const std::string& context) {
  const Json& v = field(obj, key, context);
  if (!v.is_array())
    throw Error(ErrorCode::invalid_model, context + ": field '" + key + "' must be an array");
  return v;
}

inline const Json& object_field(const Json& obj, const char* key, const std::string& context) {
  const Json& v = field(obj, key, context);
  if (!v.is_object())
    throw Error(ErrorCode::invalid_model, context + ": field '" + key + "' must be an object");
  return v;
}

// Shortens untrusted text quoted in an error message.
inline std::string quote(std::string_view s, size_t max = 80) {
  std::string out = "'";
  for (char c : s.substr(0, max)) out += (unsigned char)c < 0x20 ? '?' : c;
  if (s.size() > max) out += "...";
  return out + "'";
}

}  // namespace slim::trust::detail
