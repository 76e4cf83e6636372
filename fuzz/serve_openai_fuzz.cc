// libFuzzer target for the OpenAI request parser: any body, read as a chat request and as
// a completions request, must parse or end in a slim::Error (invalid_argument), never a
// crash, a hang or an unbounded allocation; an error encodes back into an error object.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "slim/core/error.h"
#include "slim/serve/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {true, false}) {
    try {
      slim::serve::parse_openai_request(body, chat);
    } catch (const slim::Error& e) {
      if (e.code() != slim::ErrorCode::invalid_argument) __builtin_trap();
      slim::serve::encode_openai_error(400, e.what());
    }
  }
  return 0;
}
