// Loader validation, the LightGBM threshold rewrite, .slimf integrity, compression,
// CSV reading and the TensorModel adapter.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>

#include "forest/forest_fixtures.h"
#include "slim/core/error.h"
#include "slim/forest/compress.h"
#include "slim/forest/forest_model.h"
#include "slim/forest/slimf.h"

namespace slim::forest {
float lightgbm_threshold_to_float(double d);  // lightgbm_loader.cc
namespace {

std::string tmp_path(const std::string& name) {
  const std::string dir = testing::env_or("SLIM_TEST_TMP", "/tmp");
  std::filesystem::create_directories(dir);
  return dir + "/forest_formats_" + std::to_string(::getpid()) + "_" + name;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Runs fn and returns the slim::Error it throws (failing the test if none).
template <typename Fn>
Error expect_error(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no slim::Error thrown";
  return Error(ErrorCode::internal, "");
}

// A two-split XGBoost model written by hand: f0 < 0.5 ? (f1 < -1 ? 1 : 2) : 3.
std::string tiny_xgb(const std::string& left_children = "[1,3,-1,-1,-1]",
                     const std::string& split_indices = "[0,1,0,0,0]",
                     const std::string& base_score = "\"5E-1\"") {
  return R"({"learner":{"feature_names":[],"feature_types":[],
  "gradient_booster":{"model":{"gbtree_model_param":{"num_trees":"1"},"tree_info":[0],
  "trees":[{"base_weights":[0,0,0,0,0],"categories":[],"categories_nodes":[],"categories_segments":[],
  "categories_sizes":[],"default_left":[1,0,0,0,0],"id":0,"left_children":)" + left_children +
         R"(,"loss_changes":[5,0.5,0,0,0],"parents":[2147483647,0,0,1,1],"right_children":[2,4,-1,-1,-1],
  "split_conditions":[0.5,-1,3,1,2],"split_indices":)" + split_indices +
         R"(,"split_type":[0,0,0,0,0],"sum_hessian":[10,6,4,3,3],
  "tree_param":{"num_deleted":"0","num_feature":"2","num_nodes":"5","size_leaf_vector":"0"}}]},"name":"gbtree"},
  "learner_model_param":{"base_score":)" + base_score + R"(,"num_class":"0","num_feature":"2","num_target":"1"},
  "objective":{"name":"reg:squarederror","reg_loss_param":{"scale_pos_weight":"1"}}},"version":[2,0,0]})";
}

TEST(ForestLoader, HandWrittenXGBoostModelPredictsItsLeaves) {
  Forest f = parse_xgboost_json_text(tiny_xgb(), "tiny.json");
  CompiledForest cf = compile_forest(f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float rows[][2] = {{0.0f, -2.0f}, {0.0f, 0.0f}, {0.5f, 0.0f}, {nan, -1.0f}, {nan, nan}};
  const float want[] = {1.5f, 2.5f, 3.5f, 2.5f, 2.5f};  // NaN at the root goes left (default_left)
  for (int i = 0; i < 5; ++i) {
    float out;
    cf.predict_row(rows[i], &out);
    EXPECT_EQ(out, want[i]) << "row " << i;
  }
}

TEST(ForestLoader, XGBoost31ListBaseScore) {
  Forest f = parse_xgboost_json_text(tiny_xgb("[1,3,-1,-1,-1]", "[0,1,0,0,0]", "\"[2.5E-1]\""), "t.json");
  EXPECT_EQ(f.base_margin[0], double(0.25f));
}

TEST(ForestLoader, BadChildIndexNamesTheNode) {
  Error e = expect_error([] { parse_xgboost_json_text(tiny_xgb("[1,9,-1,-1,-1]"), "bad.json"); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_model);
  EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("node[1]"), std::string::npos) << e.what();
}

TEST(ForestLoader, FeatureOutOfRangeIsRejected) {
  Error e = expect_error([] { parse_xgboost_json_text(tiny_xgb("[1,3,-1,-1,-1]", "[0,7,0,0,0]"), "f.json"); });
  EXPECT_NE(std::string(e.what()).find("split feature 7"), std::string::npos) << e.what();
}

TEST(ForestLoader, CycleIsRejected) {
  Error e = expect_error([] { parse_xgboost_json_text(tiny_xgb("[1,1,-1,-1,-1]"), "c.json"); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_model);
}

TEST(ForestLoader, TruncatedJsonAndUnknownFormat) {
  std::string text = tiny_xgb();
  EXPECT_EQ(expect_error([&] { parse_xgboost_json_text(text.substr(0, text.size() / 2), "t.json"); }).code(),
            ErrorCode::invalid_model);
  const std::string p = tmp_path("garbage.bin");
  write_file(p, "hello world");
  EXPECT_EQ(expect_error([&] { load_forest_source(p); }).code(), ErrorCode::invalid_model);
  EXPECT_EQ(expect_error([&] { load_forest_source(p + ".missing"); }).code(), ErrorCode::not_found);
  std::filesystem::remove(p);
}

TEST(ForestLoader, UnsupportedObjective) {
  std::string text = tiny_xgb();
  text.replace(text.find("reg:squarederror"), 16, "binary:hinge");
  EXPECT_EQ(expect_error([&] { parse_xgboost_json_text(text, "h.json"); }).code(), ErrorCode::unsupported);
}

const char* kLgbm = R"(tree
version=v3
num_class=1
num_tree_per_iteration=1
label_index=0
max_feature_idx=1
objective=regression

Tree=0
num_leaves=3
num_cat=0
split_feature=0 1
threshold=0.10000000000000001 1.0000000180025095e-35
decision_type=2 6
left_child=1 -1
right_child=-3 -2
leaf_value=1 2 3

end of trees
)";

TEST(ForestLoader, LightGBMTextAndErrors) {
  Forest f = parse_lightgbm_text(kLgbm, "m.txt");
  ASSERT_EQ(f.trees.size(), 1u);
  CompiledForest cf = compile_forest(f);
  float out;
  const float r0[2] = {0.1f, -5.0f};  // 0.1f > 0.1 (double): goes right -> leaf 2 (3)
  cf.predict_row(r0, &out);
  EXPECT_EQ(out, 3.0f);
  const float r1[2] = {0.09999999f, 0.0f};  // left, then zero is missing -> default left -> 1
  cf.predict_row(r1, &out);
  EXPECT_EQ(out, 1.0f);
  std::string bad = kLgbm;
  bad.replace(bad.find("left_child=1 -1"), 15, "left_child=1 -7");
  Error e = expect_error([&] { parse_lightgbm_text(bad, "m.txt"); });
  EXPECT_NE(std::string(e.what()).find("leaf child 6 out of range"), std::string::npos) << e.what();
  bad = kLgbm;
  bad.replace(bad.find("leaf_value=1 2 3"), 16, "leaf_value=1 2");
  e = expect_error([&] { parse_lightgbm_text(bad, "m.txt"); });
  EXPECT_NE(std::string(e.what()).find("leaf_value"), std::string::npos) << e.what();
}

TEST(ForestLoader, LightGBMThresholdRewriteRoutesEveryFloatAlike) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> normal;
  for (int i = 0; i < 20000; ++i) {
    double d = normal(rng) * std::pow(10.0, double(int(rng() % 20)) - 10);
    if (i % 7 == 0) d = double(float(d));  // exactly representable
    const float t = lightgbm_threshold_to_float(d);
    float x = float(d);
    for (int k = 0; k < 3; ++k) x = std::nextafter(x, -INFINITY);
    for (int k = 0; k < 7; ++k, x = std::nextafter(x, INFINITY))
      ASSERT_EQ(double(x) <= d, x < t) << "d=" << d << " x=" << x;
  }
  EXPECT_EQ(lightgbm_threshold_to_float(1e300), std::numeric_limits<float>::infinity());
  EXPECT_FALSE(std::numeric_limits<float>::infinity() < lightgbm_threshold_to_float(1e300));
}

TEST(ForestSlimf, CorruptionIsDetected) {
  CompiledForest cf = compile_forest(parse_xgboost_json_text(tiny_xgb(), "t.json"));
  const std::string bytes = encode_slimf(cf, SlimfEncoding::plain);
  const std::string p = tmp_path("c.slimf");
  std::string flipped = bytes;
  flipped[flipped.size() - 70] ^= 0x10;
  write_file(p, flipped);
  EXPECT_EQ(expect_error([&] { load_slimf(p); }).code(), ErrorCode::integrity);
  write_file(p, bytes.substr(0, bytes.size() - 8));
  EXPECT_EQ(expect_error([&] { load_slimf(p); }).code(), ErrorCode::invalid_model);
  std::string wrong_version = bytes;
  wrong_version[8] = 9;
  write_file(p, wrong_version);
  EXPECT_EQ(expect_error([&] { load_slimf(p); }).code(), ErrorCode::unsupported);
  std::filesystem::remove(p);
}

TEST(ForestSlimf, PayloadWithBadChildIsRejectedEvenWithAValidChecksum) {
  CompiledForest cf = compile_forest(parse_xgboost_json_text(tiny_xgb(), "t.json"));
  std::string payload(reinterpret_cast<const char*>(cf.payload()), cf.payload_size());
  int32_t bad_child = 1000;
  std::memcpy(&payload[cf.header().off_left], &bad_child, 4);
  auto storage = Storage::allocate(payload.size());
  std::memcpy(storage->data(), payload.data(), payload.size());
  Error e = expect_error([&] {
    CompiledForest::from_payload(static_cast<const uint8_t*>(storage->data()), payload.size(), storage, "p");
  });
  EXPECT_NE(std::string(e.what()).find("child outside its tree"), std::string::npos) << e.what();
}

// Plain float forests keep a copy of each leaf's value in its threshold slot (the SIMD
// walks read it with one gather); a copy that differs from the leaf table is rejected.
TEST(ForestSlimf, LeafValueCopiesMustMatchTheLeafTable) {
  CompiledForest cf = compile_forest(parse_xgboost_json_text(tiny_xgb(), "t.json"));
  const CompiledHeader& h = cf.header();
  ASSERT_TRUE(h.flags & kLeafInThreshold);
  EXPECT_FALSE(compile_forest(parse_xgboost_json_text(tiny_xgb(), "t.json"), true).header().flags & kLeafInThreshold);
  uint32_t leaf_node = 0;
  while (!(cf.packed()[leaf_node] & kNodeLeaf)) ++leaf_node;
  const float* leaves = static_cast<const float*>(cf.leaf_values());
  EXPECT_EQ(cf.threshold()[leaf_node], leaves[cf.packed()[leaf_node] & kNodeFeatureMask]);
  for (SimdLevel level : {SimdLevel::scalar, detected_simd_level()}) {
    std::string payload(reinterpret_cast<const char*>(cf.payload()), cf.payload_size());
    const float other = cf.threshold()[leaf_node] + 1.0f;
    std::memcpy(&payload[h.off_threshold + 4 * leaf_node], &other, 4);
    auto storage = Storage::allocate(payload.size());
    std::memcpy(storage->data(), payload.data(), payload.size());
    Error e = expect_error([&] {
      CompiledForest::from_payload(static_cast<const uint8_t*>(storage->data()), payload.size(), storage, "p", level);
    });
    EXPECT_NE(std::string(e.what()).find("leaf value copy differs"), std::string::npos) << e.what();
  }
}

TEST(ForestCompress, QuantizationBoundsThresholdsAndLosslessIsExact) {
  const std::string dir = testing::fixture_dir("forest_xgb_fixtures.py");
  Forest f = load_forest_source(dir + "/xgb_regression.json");
  Tensor x = read_npy(dir + "/xgb_regression.x.npy");
  QuantizeStats qs;
  Forest q = quantize_thresholds(f, 4, x.data<float>(), x.dim(0), &qs);
  EXPECT_GT(qs.features_changed, 0u);
  std::vector<std::set<float>> per_feature(f.num_features);
  for (const auto& t : q.trees)
    for (const auto& n : t.nodes)
      if (!n.is_leaf) per_feature[n.feature].insert(n.threshold);
  for (const auto& s : per_feature) EXPECT_LE(s.size(), 15u);
  // Lossless: the compact file is smaller and predicts the same.
  CompiledForest cf = compile_forest(f);
  const std::string p = tmp_path("l.slimf");
  save_slimf(cf, p, SlimfEncoding::compact);
  CompiledForest back = load_slimf(p);
  EXPECT_LT(std::filesystem::file_size(p) * 2, cf.payload_size());
  std::vector<double> a(size_t(x.dim(0))), b(size_t(x.dim(0)));
  cf.predict_margin(x.data<float>(), x.dim(0), a.data());
  back.predict_margin(x.data<float>(), x.dim(0), b.data());
  EXPECT_EQ(a, b);
  std::filesystem::remove(p);
}

TEST(ForestCompress, PruningMergesWeakSplitsWithCoverWeights) {
  Forest f = parse_xgboost_json_text(tiny_xgb(), "t.json");
  PruneStats st;
  Forest same = prune_forest(f, {0.1, 0}, &st);
  EXPECT_EQ(st.splits_merged, 0u);
  Forest p = prune_forest(f, {1.0, 0}, &st);  // the f1 split has gain 0.5
  EXPECT_EQ(st.splits_merged, 1u);
  EXPECT_EQ(p.num_nodes(), 3u);
  CompiledForest cf = compile_forest(p);
  const float row[2] = {0.0f, -2.0f};
  float out;
  cf.predict_row(row, &out);
  EXPECT_EQ(out, 0.5f + 1.5f);  // (3*1 + 3*2)/6 = 1.5
  Forest gone = prune_forest(f, {0, 10.0}, &st);
  EXPECT_EQ(st.trees_dropped, 1u);
  EXPECT_TRUE(gone.trees.empty());
}

// Three trees on one feature: a strong split (leaves -1 / +1 at x < 0), a constant 0.5
// and a weak split (-0.1 / +0.1 at x < 0.5). On rows {-1, 0.25, 1} dropping them alone
// changes the margins by squared sums 24/9, 0 and 6/225.
Forest three_trees() {
  Forest f;
  f.num_features = 1;
  f.base_margin = {0.25};
  f.accumulate_double = true;
  auto split = [](float thr, double lo, double hi) {
    Tree t;
    TreeNode root;
    root.is_leaf = false;
    root.left = 1;
    root.right = 2;
    root.threshold = thr;
    TreeNode l, r;
    l.leaf_value = lo;
    r.leaf_value = hi;
    t.nodes = {root, l, r};
    return t;
  };
  Tree constant;
  constant.nodes.resize(1);
  constant.nodes[0].leaf_value = 0.5;
  f.trees = {split(0.f, -1, 1), constant, split(0.5f, -0.1, 0.1)};
  f.validate("three_trees");
  return f;
}

TEST(ForestCompress, TreeDropsGrowTheMarginChangeLeastAndFoldTheirMeans) {
  const Forest f = three_trees();
  const std::vector<float> rows = {-1.f, 0.25f, 1.f};
  auto margins = [&](const Forest& g) {
    std::vector<double> m(3);
    for (size_t r = 0; r < 3; ++r) reference_margin(g, &rows[r], &m[r]);
    return m;
  };
  const std::vector<double> m0 = margins(f);
  // A margin limit only: the constant goes (its 0.5 joins the base, margins unchanged);
  // the weak split would move row 3 by 2/15 > 0.1 and stays.
  TreeDropStats st;
  Forest a = drop_trees(f, rows.data(), 3, {1, 0.1}, &st);
  EXPECT_EQ(st.trees_dropped, 1u);
  ASSERT_EQ(a.trees.size(), 2u);
  EXPECT_EQ(a.trees[1].nodes[2].leaf_value, 0.1);
  EXPECT_DOUBLE_EQ(a.base_margin[0], 0.75);
  EXPECT_EQ(margins(a), m0);
  // A budget of 4 of 7 nodes: the constant and then the weak split go; the weak split's
  // mean (-1/30) joins the base, and the margins move by its deviations.
  Forest b = drop_trees(f, rows.data(), 3, {4.0 / 7, 0}, &st);
  EXPECT_EQ(st.trees_dropped, 2u);
  EXPECT_EQ(st.nodes_before, 7u);
  EXPECT_EQ(st.nodes_after, 3u);
  EXPECT_TRUE(st.budget_met);
  EXPECT_NEAR(b.base_margin[0], 0.75 - 1.0 / 30, 1e-15);
  EXPECT_NEAR(st.max_margin_change, 2.0 / 15, 1e-15);
  const std::vector<double> mb = margins(b);
  const double want[3] = {-1.0 / 15, -1.0 / 15, 2.0 / 15};
  for (size_t r = 0; r < 3; ++r) EXPECT_NEAR(m0[r] - mb[r], want[r], 1e-12) << r;
  // The last tree always stays; a budget it cannot meet says so.
  Forest c = drop_trees(f, rows.data(), 3, {1.0 / 7, 0}, &st);
  EXPECT_EQ(c.trees.size(), 1u);
  EXPECT_FALSE(st.budget_met);
  // Nothing to limit: nothing dropped. Bad options are errors.
  EXPECT_EQ(drop_trees(f, rows.data(), 3, {1, 0}, &st).trees.size(), 3u);
  EXPECT_EQ(expect_error([&] { drop_trees(f, rows.data(), 3, {0, 0}); }).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(expect_error([&] { drop_trees(f, rows.data(), 0, {0.5, 0}); }).code(), ErrorCode::invalid_argument);
}

TEST(ForestCompress, AucMatchesHandComputedValues) {
  EXPECT_DOUBLE_EQ(roc_auc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(roc_auc({0.5f, 0.5f}, {0, 1}), 0.5);
  EXPECT_EQ(expect_error([] { roc_auc({0.5f}, {1}); }).code(), ErrorCode::invalid_argument);
}

TEST(ForestModelTest, TensorModelInterface) {
  ForestModel m(compile_forest(parse_xgboost_json_text(tiny_xgb(), "t.json")));
  ASSERT_EQ(m.input_specs().size(), 1u);
  EXPECT_EQ(m.input_specs()[0].shape, (Shape{-1, 2}));
  EXPECT_EQ(m.output_specs()[0].shape, (Shape{-1}));
  auto out = m.predict({{"input", Tensor::from_vector<float>({3, 2}, {0, -2, 0, 0, 1, 0})}});
  const float* o = out.at("output").data<float>();
  EXPECT_EQ(o[0], 1.5f);
  EXPECT_EQ(o[1], 2.5f);
  EXPECT_EQ(o[2], 3.5f);
  EXPECT_EQ(expect_error([&] { m.predict({{"input", Tensor::from_vector<float>({1, 3}, {0, 0, 0})}}); }).code(),
            ErrorCode::invalid_argument);
  EXPECT_EQ(expect_error([&] { m.predict({{"x", Tensor::from_vector<float>({1, 2}, {0, 0})}}); }).code(),
            ErrorCode::invalid_argument);
}

TEST(ForestCsv, HeaderMissingValuesAndRaggedRows) {
  const std::string p = tmp_path("t.csv");
  write_file(p, "a,b,label\n1.5,NA,1\n,2,0\n");
  CsvTable t = read_csv(p);
  EXPECT_EQ(t.columns, (std::vector<std::string>{"a", "b", "label"}));
  ASSERT_EQ(t.rows, 2);
  EXPECT_EQ(t.values[0], 1.5f);
  EXPECT_TRUE(std::isnan(t.values[1]));
  EXPECT_TRUE(std::isnan(t.values[3]));
  write_file(p, "1,2\n3\n");
  Error e = expect_error([&] { read_csv(p); });
  EXPECT_NE(std::string(e.what()).find(":2: has 1 cells"), std::string::npos) << e.what();
  std::filesystem::remove(p);
}

}  // namespace
}  // namespace slim::forest
