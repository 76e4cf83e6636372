// Exact agreement with xgboost's own margins and with the LightGBM reference evaluator,
// for every SIMD level, single-row prediction, threads, both .slimf encodings, and both
// node layouts (float thresholds and lossless per-feature ranks).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <cstring>
#include <filesystem>
#include <limits>

#include "forest/forest_fixtures.h"
#include "slim/core/npy.h"
#include "slim/core/thread_pool.h"
#include "slim/forest/compiled_forest.h"
#include "slim/forest/slimf.h"

namespace slim::forest {
namespace {

using testing::fixture_dir;
using testing::fixture_names;

struct Case {
  std::string dir, name, model;
  Tensor x, margin, pred;
};

Case load_case(const std::string& dir, const std::string& name, const std::string& model_ext) {
  Case c{dir, name, dir + "/" + name + model_ext, {}, {}, {}};
  c.x = read_npy(dir + "/" + name + ".x.npy");
  c.margin = read_npy(dir + "/" + name + ".margin.npy");
  c.pred = read_npy(dir + "/" + name + ".pred.npy");
  return c;
}

std::vector<SimdLevel> levels() {
  std::vector<SimdLevel> out{SimdLevel::scalar};
  if (detected_simd_level() == SimdLevel::neon) out.push_back(SimdLevel::neon);
  else if (detected_simd_level() != SimdLevel::scalar) out.push_back(SimdLevel::avx2);
  if (detected_simd_level() == SimdLevel::avx512) out.push_back(SimdLevel::avx512);
  return out;
}

// Expected margin for row r, group g, as the double our API returns.
double expected_margin(const Case& c, int64_t r, int g, int G) {
  if (c.margin.dtype() == DType::f32) return double(c.margin.data<float>()[r * G + g]);
  return c.margin.data<double>()[r * G + g];
}

// Checks one compiled forest against the fixture; returns the number of mismatches.
int64_t check_forest(const CompiledForest& base, const Case& c, const std::string& label) {
  const int64_t n = c.x.dim(0);
  const int G = int(base.num_groups());
  const int W = base.output_width();
  EXPECT_EQ(int64_t(c.x.dim(1)), int64_t(base.num_features())) << label;
  const float* x = c.x.data<float>();
  int64_t bad = 0;
  ThreadPool pool(2);
  for (SimdLevel level : levels()) {
    CompiledForest cf = base;
    cf.set_simd_level(level);
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<double> m(size_t(n) * G);
      cf.predict_margin(x, n, m.data(), p);
      for (int64_t r = 0; r < n; ++r)
        for (int g = 0; g < G; ++g) {
          const double want = expected_margin(c, r, g, G);
          if (std::memcmp(&m[r * G + g], &want, 8) != 0) {
            if (bad++ < 5)
              ADD_FAILURE() << label << " " << simd_level_name(level) << " row " << r << " group "
                            << g << ": margin " << m[r * G + g] << " != " << want;
          }
        }
      std::vector<float> out(size_t(n) * W);
      cf.predict(x, n, out.data(), false, p);
      const float* want = c.pred.data<float>();
      for (int64_t i = 0; i < n * W; ++i)
        if (out[i] != want[i] && bad++ < 5)
          ADD_FAILURE() << label << " " << simd_level_name(level) << " output " << i << ": "
                        << out[i] << " != " << want[i];
    }
  }
  std::vector<float> row_out(static_cast<size_t>(W));
  for (SimdLevel level : levels()) {
    CompiledForest cf = base;
    cf.set_simd_level(level);
    for (int64_t r = 0; r < n; ++r) {
      cf.predict_row(x + r * base.num_features(), row_out.data());
      for (int k = 0; k < W; ++k)
        if (row_out[k] != c.pred.data<float>()[r * W + k] && bad++ < 5)
          ADD_FAILURE() << label << " " << simd_level_name(level) << " predict_row row " << r << ": "
                        << row_out[k] << " != " << c.pred.data<float>()[r * W + k];
    }
  }
  return bad;
}

void check_reference_evaluator(const Forest& f, const Case& c) {
  const int64_t n = c.x.dim(0);
  const int G = int(f.num_groups);
  std::vector<double> m(static_cast<size_t>(G));
  for (int64_t r = 0; r < n; ++r) {
    reference_margin(f, c.x.data<float>() + r * f.num_features, m.data());
    for (int g = 0; g < G; ++g)
      ASSERT_EQ(m[g], expected_margin(c, r, g, G)) << c.name << " reference row " << r;
  }
}

void check_slimf_round_trips(const CompiledForest& cf, const Case& c) {
  const std::string tmp = testing::env_or("SLIM_TEST_TMP", "/tmp");
  std::filesystem::create_directories(tmp);
  for (SlimfEncoding enc : {SlimfEncoding::plain, SlimfEncoding::compact}) {
    const std::string path = tmp + "/" + c.name + (enc == SlimfEncoding::plain ? ".plain" : ".compact") +
                             std::to_string(::getpid()) + ".slimf";
    save_slimf(cf, path, enc);
    CompiledForest back = load_slimf(path);
    EXPECT_EQ(check_forest(back, c, c.name + (enc == SlimfEncoding::plain ? " plain" : " compact")), 0);
    std::filesystem::remove(path);
  }
}

// Lossless threshold ranks: where the model allows the ranked layout, it must give the
// very same outputs, in fewer bytes; returns 1 when the model was checked ranked.
int check_ranked(const Forest& f, const CompiledForest& plain, const Case& c, const std::string& label) {
  const std::string why = ranked_layout_blocker(f);
  if (!why.empty()) {
    EXPECT_THROW(compile_forest(f, true), Error) << label;
    return 0;
  }
  CompiledForest ranked = compile_forest(f, true);
  EXPECT_TRUE(ranked.ranked());
  EXPECT_EQ(ranked.node_bytes(), 8);
  EXPECT_LE(ranked.payload_size(), plain.payload_size()) << label;  // tiny models: same cache lines
  EXPECT_EQ(check_forest(ranked, c, label + " ranked"), 0);
  check_slimf_round_trips(ranked, c);
  return 1;
}

// Inputs exactly on thresholds, both zeros, infinities, NaN and their neighbours take
// the same branch in the ranked layout as in the plain one, on every SIMD level.
TEST(ForestExactness, RankedBinsRouteEdgeValuesLikeFloatCompares) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> thresholds = {-1.5f, -0.0f, 0.0f, 1e-30f, 1.0f, 2.5f, 3e38f, inf};
  Forest f;
  f.num_features = 2;
  f.base_margin = {0.0};
  // One chain per threshold over feature t % 2; leaves record where a value went.
  for (size_t t = 0; t < thresholds.size(); ++t) {
    Tree tree;
    TreeNode root;
    root.is_leaf = false;
    root.feature = uint32_t(t % 2);
    root.threshold = thresholds[t];
    root.default_left = t % 3 == 0;
    root.left = 1;
    root.right = 2;
    TreeNode l, r;
    l.leaf_value = double(1u << t);
    r.leaf_value = 0.0;
    tree.nodes = {root, l, r};
    f.trees.push_back(tree);
  }
  std::vector<float> values = {-inf, inf, std::nanf(""), 0.0f, -0.0f, 1e-30f, 3e38f};
  for (float t : thresholds)
    if (std::isfinite(t))
      for (float v : {t, std::nextafter(t, -inf), std::nextafter(t, inf)}) values.push_back(v);
  std::vector<float> x;
  for (float a : values)
    for (float b : values) x.insert(x.end(), {a, b});
  const int64_t n = int64_t(x.size() / 2);
  const CompiledForest plain = compile_forest(f), ranked = compile_forest(f, true);
  std::vector<double> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
  CompiledForest p = plain;
  p.set_simd_level(SimdLevel::scalar);
  p.predict_margin(x.data(), n, want.data());
  for (SimdLevel level : levels()) {
    CompiledForest r = ranked;
    r.set_simd_level(level);
    r.predict_margin(x.data(), n, got.data());
    EXPECT_EQ(got, want) << simd_level_name(level);
    for (int64_t i = 0; i < n; ++i) {
      float o;
      r.predict_row(x.data() + 2 * i, &o, true);
      ASSERT_EQ(o, float(want[size_t(i)])) << simd_level_name(level) << " row " << i;
    }
  }
}

// Random numeric forests over 7 to 100 features: the single-row SIMD walk holds rows of
// up to 64 inputs in registers and gathers wider ones; batches and single rows on every
// SIMD level, both layouts, must equal the reference evaluator.
TEST(ForestExactness, RandomForestsOfEveryWidthMatchTheReference) {
  std::mt19937 rng(5);
  for (uint32_t F : {7u, 32u, 33u, 64u, 65u, 100u}) {
    Forest f;
    f.num_features = F;
    f.base_margin = {0.25};
    std::normal_distribution<float> normal;
    for (int t = 0; t < 40; ++t) {
      Tree tree;
      const int depth = 1 + int(rng() % 7);
      // Grow breadth-first: each node splits with probability 0.8 above the depth limit.
      tree.nodes.push_back(TreeNode{});
      std::vector<int> node_depth = {0};
      for (size_t i = 0; i < tree.nodes.size(); ++i) {
        if (node_depth[i] >= depth || rng() % 5 == 0) {
          tree.nodes[i].leaf_value = double(normal(rng));
          continue;
        }
        TreeNode& n = tree.nodes[i];
        n.is_leaf = false;
        n.feature = uint32_t(rng() % F);
        n.threshold = normal(rng);
        n.default_left = rng() % 2;
        n.left = int32_t(tree.nodes.size());
        n.right = n.left + 1;
        const int d = node_depth[i] + 1;
        tree.nodes.resize(tree.nodes.size() + 2);
        node_depth.insert(node_depth.end(), {d, d});
      }
      f.trees.push_back(std::move(tree));
    }
    const int64_t n = 300;
    std::vector<float> x(size_t(n) * F);
    for (auto& v : x) v = rng() % 10 == 0 ? std::nanf("") : normal(rng);
    std::vector<double> want(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) reference_margin(f, x.data() + r * F, &want[size_t(r)]);
    for (bool ranked : {false, true}) {
      const CompiledForest base = compile_forest(f, ranked);
      for (SimdLevel level : levels()) {
        CompiledForest cf = base;
        cf.set_simd_level(level);
        const std::string label = "F=" + std::to_string(F) + (ranked ? " ranked " : " plain ") + simd_level_name(level);
        std::vector<double> got(static_cast<size_t>(n));
        cf.predict_margin(x.data(), n, got.data());
        EXPECT_EQ(got, want) << label;
        for (int64_t r = 0; r < n; ++r) {
          float o;
          cf.predict_row(x.data() + r * F, &o, true);
          ASSERT_EQ(o, float(want[size_t(r)])) << label << " row " << r;
        }
      }
    }
  }
}

// The batch walks' special cases against the scalar walk and the reference evaluator:
// trees of every depth from 0 (a lone leaf) to 6 or 11, with leaves at every level (the AVX2
// walk takes levels 0-5 from per-path tables and reads the leaves of trees up to depth 6
// from a table), float and double sums, one and three groups, both layouts, blocks of
// rows with and without NaN inputs (a NaN-free block takes a shorter split test), inputs
// equal to thresholds and their neighbours, and row counts that leave tails of every
// kind (fewer than a vector, part of a vector, part of a 256-row block).
TEST(ForestExactness, BatchWalksOfEveryDepthMatchTheScalarWalk) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const uint32_t F = 23;
  std::vector<float> pool;  // thresholds come from here; inputs hit them exactly or next to them
  for (int i = 0; i < 60; ++i) pool.push_back(normal(rng));
  // Forests no deeper than 6 take the AVX2 walk's table-only path (ranked ones on float
  // rows, without bins); deeper ones gather nodes past level 5.
  for (int max_depth : {6, 11})
  for (bool dbl : {false, true}) {
    for (uint32_t G : {1u, 3u}) {
      Forest f;
      f.num_features = F;
      f.num_groups = G;
      f.accumulate_double = dbl;
      for (uint32_t g = 0; g < G; ++g) f.base_margin.push_back(0.125 * g - 0.5);
      for (int depth = 0; depth <= max_depth; ++depth) {
        for (int copy = 0; copy < 3; ++copy) {
          Tree tree;
          tree.group = uint32_t(depth * 3 + copy) % G;
          tree.nodes.push_back(TreeNode{});
          std::vector<int> node_depth = {0};
          // The first copy is complete to its depth; the others stop early at random.
          for (size_t i = 0; i < tree.nodes.size(); ++i) {
            if (node_depth[i] >= depth || (copy > 0 && i > 0 && rng() % 6 == 0)) {
              tree.nodes[i].leaf_value = double(normal(rng)) / 7.0;
              continue;
            }
            TreeNode& n = tree.nodes[i];
            n.is_leaf = false;
            n.feature = uint32_t(rng() % F);
            n.threshold = pool[rng() % pool.size()];
            n.default_left = rng() % 2;
            n.left = int32_t(tree.nodes.size());
            n.right = n.left + 1;
            const int d = node_depth[i] + 1;
            tree.nodes.resize(tree.nodes.size() + 2);
            node_depth.insert(node_depth.end(), {d, d});
          }
          f.trees.push_back(std::move(tree));
        }
      }
      const int64_t n = 1000;
      std::vector<float> x(size_t(n) * F);
      for (int64_t r = 0; r < n; ++r)
        for (uint32_t c = 0; c < F; ++c) {
          const float t = pool[rng() % pool.size()];
          const uint32_t how = rng() % 8;
          float v = how < 2 ? t : how == 2 ? std::nextafter(t, -1e9f) : how == 3 ? std::nextafter(t, 1e9f) : normal(rng);
          // Rows 256-511 (the second block) and the last rows carry NaN; the rest do not.
          if (((r >= 256 && r < 512) || r >= 990) && rng() % 9 == 0) v = std::nanf("");
          x[size_t(r) * F + c] = v;
        }
      std::vector<double> want(size_t(n) * G);
      for (int64_t r = 0; r < n; ++r) reference_margin(f, x.data() + r * F, want.data() + r * G);
      for (bool ranked : {false, true}) {
        const CompiledForest base = compile_forest(f, ranked);
        ASSERT_EQ(base.max_depth(), uint32_t(max_depth));
        ThreadPool pool2(2);
        for (SimdLevel level : levels()) {
          CompiledForest cf = base;
          cf.set_simd_level(level);
          const std::string label = "depth " + std::to_string(max_depth) + (dbl ? " double" : " float") + " G=" + std::to_string(G) +
                                    (ranked ? " ranked " : " plain ") + simd_level_name(level);
          for (int64_t rows : {int64_t(5), int64_t(8), int64_t(13), int64_t(263), int64_t(600), n}) {
            // Starting at row 400 puts NaN rows in the first block of some batches.
            for (int64_t start : {int64_t(0), int64_t(400)}) {
              if (start + rows > n) continue;
              for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool2}) {
                std::vector<double> got(size_t(rows) * G);
                cf.predict_margin(x.data() + start * F, rows, got.data(), p);
                for (int64_t i = 0; i < rows * int64_t(G); ++i)
                  ASSERT_EQ(got[size_t(i)], want[size_t(start * G + i)])
                      << label << " rows " << rows << " from " << start << " value " << i;
              }
            }
          }
          std::vector<float> o(G);
          for (int64_t r = 0; r < n; r += 7) {
            cf.predict_row(x.data() + r * F, o.data(), true);
            for (uint32_t g = 0; g < G; ++g)
              ASSERT_EQ(o[g], float(want[size_t(r * G + g)])) << label << " predict_row " << r;
          }
        }
      }
    }
  }
}

// A feature with 5,000 distinct thresholds (a four-level binning tree) and one with 17
// (two levels, the second block nearly empty): bins of values on, between and beyond the
// thresholds route like the float compares on every SIMD level.
TEST(ForestExactness, RankedBinningOfManyThresholds) {
  Forest f;
  f.num_features = 2;
  f.base_margin = {0.0};
  std::vector<float> thresholds[2];
  for (int i = 0; i < 5000; ++i) thresholds[0].push_back(float(i) * 0.37f - 900.0f);
  for (int i = 0; i < 17; ++i) thresholds[1].push_back(float(i * i) - 50.0f);
  for (uint32_t feat = 0; feat < 2; ++feat)
    for (size_t i = 0; i < thresholds[feat].size(); ++i) {
      Tree tree;
      TreeNode root;
      root.is_leaf = false;
      root.feature = feat;
      root.threshold = thresholds[feat][i];
      root.default_left = i % 2;
      root.left = 1;
      root.right = 2;
      TreeNode l, r;
      l.leaf_value = 1.0 / double(1 + i % 7);
      r.leaf_value = -0.5 / double(1 + i % 5);
      tree.nodes = {root, l, r};
      f.trees.push_back(tree);
    }
  std::mt19937 rng(3);
  std::vector<float> x;
  for (int k = 0; k < 400; ++k) {
    const float a = thresholds[0][rng() % 5000], b = thresholds[1][rng() % 17];
    const int how = k % 5;
    x.push_back(how == 0 ? a : how == 1 ? std::nextafter(a, 1e9f) : how == 2 ? std::nextafter(a, -1e9f)
                : how == 3 ? float(int(rng() % 4000) - 2000) : std::nanf(""));
    x.push_back(how == 4 ? std::numeric_limits<float>::infinity() : how == 3 ? -1e9f : b);
  }
  const int64_t n = int64_t(x.size() / 2);
  CompiledForest plain = compile_forest(f);
  plain.set_simd_level(SimdLevel::scalar);
  std::vector<double> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
  plain.predict_margin(x.data(), n, want.data());
  const CompiledForest ranked = compile_forest(f, true);
  ASSERT_TRUE(ranked.ranked());
  for (SimdLevel level : levels()) {
    CompiledForest r = ranked;
    r.set_simd_level(level);
    r.predict_margin(x.data(), n, got.data());
    EXPECT_EQ(got, want) << simd_level_name(level);
  }
}

TEST(ForestExactness, XGBoostMatchesItsOwnPredictions) {
  const std::string dir = fixture_dir("forest_xgb_fixtures.py");
  const auto names = fixture_names(dir);
  ASSERT_GE(names.size(), 12u);
  int64_t rows = 0;
  int ranked_models = 0;
  for (const auto& name : names) {
    for (const char* ext : {".json", ".ubj"}) {
      if (!std::filesystem::exists(dir + "/" + name + ext)) continue;
      SCOPED_TRACE(name + ext);
      Case c = load_case(dir, name, ext);
      Forest f = load_forest_source(c.model);
      check_reference_evaluator(f, c);
      CompiledForest cf = compile_forest(f);
      EXPECT_EQ(check_forest(cf, c, name + ext), 0);
      check_slimf_round_trips(cf, c);
      ranked_models += check_ranked(f, cf, c, name + ext);
      rows += c.x.dim(0);
    }
  }
  RecordProperty("rows_checked", int(rows));
  EXPECT_GE(ranked_models, 16);  // every numeric-only fixture, JSON and UBJSON
}

TEST(ForestExactness, LightGBMMatchesTheReferenceEvaluator) {
  const std::string dir = fixture_dir("forest_lgbm_fixtures.py");
  const auto names = fixture_names(dir);
  ASSERT_GE(names.size(), 7u);
  int simd_models = 0, ranked_models = 0;
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    Case c = load_case(dir, name, ".txt");
    Forest f = load_forest_source(c.model);
    EXPECT_EQ(f.source, SourceKind::lightgbm);
    check_reference_evaluator(f, c);
    CompiledForest cf = compile_forest(f);
    EXPECT_EQ(check_forest(cf, c, name), 0);
    check_slimf_round_trips(cf, c);
    simd_models += !(cf.header().flags & (kHasCategorical | kHasZeroMissing));
    ranked_models += check_ranked(f, cf, c, name);
  }
  EXPECT_GE(simd_models, 2);  // the double-sum SIMD walks are exercised too
  EXPECT_EQ(ranked_models, simd_models);
}

TEST(ForestExactness, XGBoostCategoricalSendsListedCategoriesRight) {
  const std::string dir = fixture_dir("forest_xgb_fixtures.py");
  Forest f = load_forest_source(dir + "/xgb_categorical.json");
  EXPECT_FALSE(f.category_sets.empty());
  CompiledForest cf = compile_forest(f);
  EXPECT_TRUE(cf.header().flags & kHasCategorical);
}

}  // namespace
}  // namespace slim::forest
