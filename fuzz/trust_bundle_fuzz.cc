// libFuzzer target for the OMS signature bundle parser and the in-toto statement parser:
// any input must end in a parsed bundle or a slim::Error, never a crash or a hang.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "slim/core/error.h"
#include "slim/trust/model_signing.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    slim::trust::SignatureBundle b = slim::trust::parse_bundle(text, "fuzz.sig");
    slim::trust::parse_statement(b.payload, "fuzz.sig");
  } catch (const slim::Error&) {
  }
  try {
    // The statement parser also sees raw input, as a tampered payload would reach it
    // only after a signature check that a fuzzer cannot pass.
    slim::trust::parse_statement(text, "fuzz.statement");
  } catch (const slim::Error&) {
  }
  return 0;
}
