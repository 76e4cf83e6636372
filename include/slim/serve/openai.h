// The OpenAI API of `slim serve` for language models: /v1/chat/completions,
// /v1/completions (both also as Server-Sent Events), /v1/models, and llama-server's
// /health. This header holds the request parser (JSON to OpenAiRequest, every field
// checked, unknown fields ignored as OpenAI clients send many) and the response encoders;
// the routes themselves are registered on the HTTP front door (http.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "slim/llm/sampler.h"
#include "slim/serve/llm_service.h"
#include "slim/text/chat_template.h"

namespace slim::serve {

struct OpenAiRequest {
  bool chat = true;  // /v1/chat/completions, else /v1/completions
  std::string model;
  std::vector<text::ChatMessage> messages;  // chat
  std::string prompt;                       // completions: text ...
  std::vector<int32_t> prompt_tokens;       // ... or token ids
  bool prompt_is_tokens = false;
  int max_tokens = 0;  // 0: up to the context
  llm::SamplerOptions sampling;
  bool seeded = false;  // `seed` given: otherwise each request draws one
  std::vector<std::string> stop;
  int top_logprobs = -1;  // -1: no logprobs
  int n = 1;
  bool stream = false, include_usage = false;
  std::optional<int> priority;
  bool energy = false;  // "slim_energy": true: usage.energy (slim serve --energy)
};

// Throws invalid_argument with OpenAI-style messages naming the field.
OpenAiRequest parse_openai_request(std::string_view body, bool chat);

// {"error": {"message", "type", "param", "code"}} with the type for the HTTP status.
std::string encode_openai_error(int status, const std::string& message);

}  // namespace slim::serve
