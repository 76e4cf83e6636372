// libFuzzer target for the model-configuration parser: any input must end in a
// ModelConfig or a slim::Error, never a crash or a hang. The first byte picks the form
// (even: config.pbtxt, odd: config.json), the rest is the text; the seeds in
// fuzz/seeds/serve_config/ start with '\n' (text) or '\t' (JSON) so they stay readable.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "slim/core/error.h"
#include "slim/serve/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0)
      slim::serve::parse_model_config_pbtxt(text, "fuzz.pbtxt");
    else
      slim::serve::parse_model_config_json(text, "fuzz.json");
  } catch (const slim::Error&) {
  }
  return 0;
}
