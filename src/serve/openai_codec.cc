// The OpenAI request parser and error encoder (openai.h); the routes are in openai.cc.
#include <nlohmann/json.hpp>

#include "slim/core/error.h"
#include "slim/serve/openai.h"

namespace slim::serve {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& message) { throw Error(ErrorCode::invalid_argument, message); }

double number(const json& j, const char* field, int lo, int hi) {
  if (!j.is_number() || !(j.get<double>() >= lo && j.get<double>() <= hi))
    bad("'" + std::string(field) + "' must be a number from " + std::to_string(lo) + " to " + std::to_string(hi));
  return j.get<double>();
}

int64_t integer(const json& j, const char* field, int64_t lo, int64_t hi) {
  if (!j.is_number_integer() || j.get<int64_t>() < lo || j.get<int64_t>() > hi)
    bad("'" + std::string(field) + "' must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  return j.get<int64_t>();
}

bool boolean(const json& j, const char* field) {
  if (!j.is_boolean()) bad("'" + std::string(field) + "' must be true or false");
  return j.get<bool>();
}

// Message content: a string, or OpenAI's array of parts of which slim reads the text ones.
std::string content_text(const json& c, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  if (c.is_null()) return "";
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad("'" + where + "' must be a string or an array of content parts");
  std::string text;
  for (size_t k = 0; k < c.size(); ++k) {
    const json& part = c[k];
    const std::string pw = where + "[" + std::to_string(k) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) bad("'" + pw + "' must be an object with a 'type'");
    if (part["type"] != "text")
      bad("'" + pw + "' is of type '" + part["type"].get<std::string>() + "'; this model reads text parts only");
    if (!part.contains("text") || !part["text"].is_string()) bad("'" + pw + ".text' must be a string");
    text += part["text"].get<std::string>();
  }
  return text;
}

std::vector<int32_t> token_list(const json& a) {
  std::vector<int32_t> out;
  for (const json& t : a) out.push_back(int32_t(integer(t, "prompt", 0, INT32_MAX)));
  return out;
}

}  // namespace

OpenAiRequest parse_openai_request(std::string_view body, bool chat) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    bad(std::string("the body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad("the body must be a JSON object");
  OpenAiRequest r;
  r.chat = chat;
  // OpenAI's defaults: plain sampling at temperature 1, no truncation, no penalties.
  r.sampling.temperature = 1.f;
  r.sampling.top_k = 0;
  r.sampling.top_p = 1.f;
  r.sampling.min_p = 0.f;
  auto has = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
  if (has("model")) {
    if (!j["model"].is_string()) bad("'model' must be a string");
    r.model = j["model"].get<std::string>();
  }
  if (chat) {
    if (!has("messages")) bad("'messages' is required");
    const json& ms = j["messages"];
    if (!ms.is_array() || ms.empty()) bad("'messages' must be a non-empty array");
    for (size_t i = 0; i < ms.size(); ++i) {
      const json& m = ms[i];
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) bad("'" + where + "' must be an object");
      if (!m.contains("role") || !m["role"].is_string()) bad("'" + where + ".role' must be a string");
      const std::string role = m["role"].get<std::string>();
      if (role != "system" && role != "user" && role != "assistant" && role != "developer" && role != "tool")
        bad("'" + where + ".role' is '" + role + "'; expected system, developer, user, assistant or tool");
      if (!m.contains("content") && role != "assistant") bad("'" + where + ".content' is required");
      // OpenAI's newer "developer" role is the system prompt of older templates.
      r.messages.push_back({role == "developer" ? "system" : role, content_text(m.value("content", json()), i)});
    }
  } else {
    if (!has("prompt")) bad("'prompt' is required");
    const json& p = j["prompt"];
    if (p.is_string()) {
      r.prompt = p.get<std::string>();
    } else if (p.is_array() && !p.empty() && p[0].is_number()) {
      r.prompt_tokens = token_list(p);
      r.prompt_is_tokens = true;
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt = p[0].get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_array()) {
      r.prompt_tokens = token_list(p[0]);
      r.prompt_is_tokens = true;
    } else {
      bad("'prompt' must be a string, an array of token ids, or an array holding one of them (one prompt per request)");
    }
  }
  if (has("max_completion_tokens")) r.max_tokens = int(integer(j["max_completion_tokens"], "max_completion_tokens", 1, INT32_MAX));
  else if (has("max_tokens")) r.max_tokens = int(integer(j["max_tokens"], "max_tokens", 1, INT32_MAX));
  if (has("temperature")) r.sampling.temperature = float(number(j["temperature"], "temperature", 0, 2));
  if (has("top_p")) {
    r.sampling.top_p = float(number(j["top_p"], "top_p", 0, 1));
    if (r.sampling.top_p <= 0) bad("'top_p' must be above 0");
  }
  if (has("top_k")) r.sampling.top_k = int(integer(j["top_k"], "top_k", -1, INT32_MAX));
  if (has("min_p")) {
    r.sampling.min_p = float(number(j["min_p"], "min_p", 0, 1));
    if (r.sampling.min_p >= 1) bad("'min_p' must be below 1");
  }
  if (has("presence_penalty")) r.sampling.presence_penalty = float(number(j["presence_penalty"], "presence_penalty", -2, 2));
  if (has("frequency_penalty")) r.sampling.frequency_penalty = float(number(j["frequency_penalty"], "frequency_penalty", -2, 2));
  if (has("repeat_penalty")) {
    r.sampling.repeat_penalty = float(number(j["repeat_penalty"], "repeat_penalty", 0, 10));
    if (r.sampling.repeat_penalty <= 0) bad("'repeat_penalty' must be above 0");
  }
  if (has("seed")) {
    const json& s = j["seed"];
    if (!s.is_number_integer()) bad("'seed' must be an integer");
    r.sampling.seed = s.is_number_unsigned() ? s.get<uint64_t>() : uint64_t(s.get<int64_t>());
    r.seeded = true;
  }
  if (has("stop")) {
    const json& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (s.size() > 16) bad("'stop' may hold at most 16 strings");
      for (const json& x : s) {
        if (!x.is_string()) bad("'stop' must be a string or an array of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("'stop' must be a string or an array of strings");
    }
    for (const std::string& x : r.stop)
      if (x.empty()) bad("'stop' strings must not be empty");
  }
  if (chat) {
    const bool lp = has("logprobs") && boolean(j["logprobs"], "logprobs");
    if (has("top_logprobs")) {
      if (!lp) bad("'top_logprobs' needs 'logprobs': true");
      r.top_logprobs = int(integer(j["top_logprobs"], "top_logprobs", 0, 20));
    } else if (lp) {
      r.top_logprobs = 0;
    }
  } else if (has("logprobs")) {
    r.top_logprobs = int(integer(j["logprobs"], "logprobs", 0, 20));
  }
  if (has("n")) r.n = int(integer(j["n"], "n", 1, 16));
  if (has("stream")) r.stream = boolean(j["stream"], "stream");
  if (has("stream_options")) {
    const json& so = j["stream_options"];
    if (!so.is_object()) bad("'stream_options' must be an object");
    if (so.contains("include_usage") && !so["include_usage"].is_null())
      r.include_usage = boolean(so["include_usage"], "stream_options.include_usage");
  }
  if (has("priority")) r.priority = int(integer(j["priority"], "priority", -1000, 1000));
  if (has("slim_energy")) r.energy = boolean(j["slim_energy"], "slim_energy");
  return r;
}

std::string encode_openai_error(int status, const std::string& message) {
  const char* type = status == 404   ? "not_found_error"
                     : status == 429 ? "rate_limit_error"
                     : status == 503 ? "unavailable_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  ojson e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status == 404 ? json("model_not_found") : json(nullptr)}};
  return ojson{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace slim::serve
