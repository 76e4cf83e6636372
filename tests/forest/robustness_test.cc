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
#include "slim/core/tensor.h"
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

// The AVX-512 node check must accept exactly the payloads the scalar one accepts: both
// run on payloads whose node tables (tree ranges, depths, packed words, children) were
// damaged in place (leaf values and their copies included), with the rest intact.
TEST(ForestRobustness, VectorAndScalarNodeChecksAgree) {
  if (detected_simd_level() != SimdLevel::avx512) GTEST_SKIP() << "no AVX-512 here";
  const std::string dir = testing::fixture_dir("forest_xgb_fixtures.py");
  const Forest numeric = load_forest_source(dir + "/xgb_softprob.json");
  const std::vector<CompiledForest> forests = {compile_forest(numeric), compile_forest(numeric, true),
                                               load_compiled_forest(dir + "/xgb_categorical.json")};
  std::mt19937 rng(11);
  int accepted = 0, rejected = 0;
  for (const CompiledForest& cf : forests) {
    const CompiledHeader& h = cf.header();
    const uint64_t lo = h.off_tree_root, hi = h.off_category_offsets;  // roots ... nodes, leaves
    for (int it = 0; it < 3000; ++it) {
      auto storage = Storage::allocate(cf.payload_size());
      uint8_t* p = static_cast<uint8_t*>(storage->data());
      std::memcpy(p, cf.payload(), cf.payload_size());
      const int edits = 1 + int(rng() % 3);
      for (int k = 0; k < edits; ++k) {
        const uint64_t at = (lo + rng() % (hi - lo)) & ~uint64_t(3);
        uint32_t v;
        std::memcpy(&v, p + at, 4);
        switch (rng() % 4) {
          case 0: v ^= 1u << (rng() % 32); break;
          case 1: v += (rng() % 5) - 2; break;
          case 2: v = rng() % (h.num_nodes + 4); break;
          default: v = rng(); break;
        }
        std::memcpy(p + at, &v, 4);
      }
      bool ok[2];
      const SimdLevel levels[2] = {SimdLevel::scalar, SimdLevel::avx512};
      for (int m = 0; m < 2; ++m) {
        try {
          CompiledForest::from_payload(p, cf.payload_size(), storage, "fuzz", levels[m]);
          ok[m] = true;
        } catch (const Error&) {
          ok[m] = false;
        }
      }
      ASSERT_EQ(ok[0], ok[1]) << "iteration " << it;
      (ok[0] ? accepted : rejected)++;
    }
  }
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(accepted, 10);
}

}  // namespace
}  // namespace slim::forest
