// Damaged .slimf payloads that still carry a valid checksum (a crafted file, not a
// corrupt one) must load cleanly or fail with slim::Error, and whatever loads must
// predict without reading out of bounds.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "forest/forest_fixtures.h"
#include "slim/core/error.h"
#include "slim/forest/slimf.h"

namespace slim::forest {
namespace {

constexpr size_t kChecksumOffset = 24;  // magic 8, version 4, encoding 4, payload size 8

void fuzz_encoding(const CompiledForest& cf, SlimfEncoding enc, int iterations, uint32_t seed) {
  const std::string good = encode_slimf(cf, enc);
  const std::string path = testing::env_or("SLIM_TEST_TMP", "/tmp") + "/forest_fuzz_" +
                           std::to_string(::getpid()) + ".slimf";
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::mt19937 rng(seed);
  std::vector<float> row(cf.num_features(), 0.25f), out(cf.num_groups() + 1);
  int loaded = 0, rejected = 0;
  for (int it = 0; it < iterations; ++it) {
    std::string bytes = good;
    const int flips = 1 + int(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const size_t at = 64 + rng() % (bytes.size() - 64);
      bytes[at] = char(rng() % 3 == 0 ? 0xff : bytes[at] ^ char(1u << (rng() % 8)));
    }
    if (rng() % 8 == 0) bytes.resize(64 + rng() % (bytes.size() - 64));
    const uint64_t size = bytes.size() - 64;
    std::memcpy(&bytes[16], &size, 8);
    const uint64_t sum = XXH3_64bits(bytes.data() + 64, size);
    std::memcpy(&bytes[kChecksumOffset], &sum, 8);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    try {
      CompiledForest f = load_slimf(path);
      for (int v = 0; v < 3; ++v) {
        for (auto& x : row) x = std::normal_distribution<float>()(rng);
        f.predict_row(row.data(), out.data(), true);
        f.predict(row.data(), 1, out.data(), true);
      }
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    }
  }
  std::filesystem::remove(path);
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(loaded + rejected, iterations);
}

TEST(ForestRobustness, DamagedPayloadsWithValidChecksums) {
  const std::string dir = testing::fixture_dir("forest_xgb_fixtures.py");
  for (const char* name : {"xgb_softprob.json", "xgb_categorical.json"}) {
    SCOPED_TRACE(name);
    CompiledForest cf = load_compiled_forest(dir + "/" + name);
    // SLIM_FOREST_FUZZ_ITERS raises the count for a longer local run.
    const int iters = std::max(20, std::atoi(testing::env_or("SLIM_FOREST_FUZZ_ITERS", "200").c_str()));
    fuzz_encoding(cf, SlimfEncoding::plain, iters, 1);
    fuzz_encoding(cf, SlimfEncoding::compact, iters, 2);
  }
  const Forest numeric = load_forest_source(dir + "/xgb_softprob.json");
  const CompiledForest ranked = compile_forest(numeric, true);
  fuzz_encoding(ranked, SlimfEncoding::plain, 200, 3);
  fuzz_encoding(ranked, SlimfEncoding::compact, 200, 4);
}

}  // namespace
}  // namespace slim::forest
