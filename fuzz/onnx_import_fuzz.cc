// libFuzzer entry for the ONNX importer: any input must load or throw slim::Error.
// Another exception escapes and aborts, and ASan/UBSan report memory and UB bugs.
// Models resolve external data against a scratch folder holding a small weights file,
// a subfolder and a symlink that leads out of the folder, so that the path checks and
// the bounds checks are fuzzed too.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "slim/core/error.h"
#include "slim/onnx/importer.h"

namespace {
std::string g_base_dir;

void write_bytes(const std::filesystem::path& path, size_t n) {
  std::ofstream f(path, std::ios::binary);
  for (size_t i = 0; i < n; ++i) f.put(char(i * 7));
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / "slim_onnx_fuzz";
  fs::create_directories(root / "model" / "sub");
  write_bytes(root / "model" / "weights.bin", 4096);
  write_bytes(root / "model" / "sub" / "w.bin", 100);
  write_bytes(root / "outside.bin", 4096);
  std::error_code ec;
  fs::create_symlink(root / "outside.bin", root / "model" / "link.bin", ec);
  g_base_dir = (root / "model").string();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    slim::Model model = slim::OnnxImporter::load_bytes(data, size, "fuzz.onnx", g_base_dir);
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
