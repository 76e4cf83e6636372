// libFuzzer entry for the ONNX importer: any input must load or throw slim::Error.
// Another exception escapes and aborts, and ASan/UBSan report memory and UB bugs.
#include <cstddef>
#include <cstdint>

#include "slim/core/error.h"
#include "slim/onnx/importer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    slim::Model model = slim::OnnxImporter::load_bytes(data, size, "fuzz.onnx", "");
    // Read every initializer byte so that a tensor over bad memory is caught.
    volatile uint8_t sink = 0;
    for (const auto& [name, t] : model.graph.initializers) {
      const auto* p = static_cast<const uint8_t*>(t.raw_data());
      for (size_t i = 0; i < t.nbytes(); ++i) sink = uint8_t(sink ^ p[i]);
    }
    (void)sink;
  } catch (const slim::Error&) {
  }
  return 0;
}
