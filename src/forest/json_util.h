// Helpers for reading XGBoost's JSON/UBJSON documents with errors that name the file
// and the field.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace slim::forest::detail {

// XGBoost writes NaN, Infinity and -Infinity as bare tokens, which strict JSON parsers
// reject; they are turned into strings that number readers below understand.
std::string quote_nonfinite_tokens(const std::string& text);

const nlohmann::json& field(const nlohmann::json& obj, const char* key, const std::string& where);
float as_float(const nlohmann::json& v, const std::string& where);
double as_double(const nlohmann::json& v, const std::string& where);
int64_t as_int(const nlohmann::json& v, const std::string& where);

}  // namespace slim::forest::detail
