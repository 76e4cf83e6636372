// slim forest: gradient-boosted tree ensembles (XGBoost, LightGBM) loaded into one
// library-neutral form, compiled into a compact cache-friendly plan, and run with
// scores identical to the source library's. This header is the loaded form (step 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slim::forest {

// How the raw margin becomes the output the user sees.
enum class Transform : uint8_t {
  identity,  // regression, logitraw, ranking
  sigmoid,   // binary:logistic, reg:logistic, LightGBM binary (with sigmoid_scale)
  exp,       // count:poisson, gamma, tweedie
  softmax,   // multi:softprob, LightGBM multiclass
  argmax,    // multi:softmax: index of the largest margin
};

enum class SourceKind : uint8_t { xgboost, lightgbm };

// One node of a loaded tree. Numeric splits are normalized to "go left when x < threshold"
// on float32 inputs, whatever the source library compared (see lightgbm_loader.cc).
struct TreeNode {
  int32_t left = -1;   // child indices within the tree; -1 on leaves
  int32_t right = -1;
  uint32_t feature = 0;
  float threshold = 0;
  bool is_leaf = true;
  bool default_left = false;  // where NaN (and out-of-range categories) go
  // LightGBM missing type Zero: |x| <= 1e-35 and NaN take the default direction.
  bool zero_missing = false;
  int32_t category_set = -1;  // index into Forest::category_sets for categorical splits
  double leaf_value = 0;
  float gain = 0;   // split gain (loss change), used by pruning
  float cover = 0;  // hessian sum / sample weight, used by pruning to merge leaves
};

struct Tree {
  std::vector<TreeNode> nodes;  // node 0 is the root
  uint32_t group = 0;           // output column (class) the tree adds to
};

// Categories that go LEFT at a categorical split, as a bitset over [0, 32 * words.size()).
// A category outside that range, negative, or NaN takes the node's default direction.
struct CategorySet {
  std::vector<uint32_t> words;
};

struct Forest {
  SourceKind source = SourceKind::xgboost;
  std::string objective;  // the source library's name, e.g. "binary:logistic"
  Transform transform = Transform::identity;
  double sigmoid_scale = 1.0;  // LightGBM "sigmoid:" parameter
  uint32_t num_features = 0;
  uint32_t num_groups = 1;          // outputs per row before the transform
  std::vector<double> base_margin;  // one per group, already in margin space
  // XGBoost sums leaves in float32 in tree order; LightGBM sums in double.
  bool accumulate_double = false;
  // LightGBM casts a category to int before the range check (so -0.5 is category 0);
  // XGBoost rejects any negative value first.
  bool truncate_category_first = false;
  // LightGBM random forests average the trees instead of summing them.
  double average_divisor = 1.0;
  std::vector<Tree> trees;
  std::vector<CategorySet> category_sets;
  std::vector<std::string> feature_names;  // may be empty

  // Checks every index, count and child link; throws invalid_model naming `where`.
  void validate(const std::string& where) const;
  size_t num_nodes() const;
  size_t num_leaves() const;
  int max_depth() const;
};

// Loaders (step 1). Each reads and validates the whole file and throws slim::Error
// (invalid_model naming the file and field, not_found for a missing file).
Forest load_xgboost_json(const std::string& path);
Forest load_xgboost_ubjson(const std::string& path);
Forest parse_xgboost_json_text(std::string text, const std::string& name);
Forest load_lightgbm_text(const std::string& path);
Forest parse_lightgbm_text(const std::string& text, const std::string& name);
// Picks the loader by content: UBJSON ('{' then a UBJSON marker), JSON, LightGBM text.
// .slimf files are not handled here (see slimf.h).
Forest load_forest_source(const std::string& path);

// Reference evaluation on the loaded form, one row at a time, straight from the node
// lists. Slow; it is the oracle the compiled plan is tested against. out has
// num_groups values (margins, before the transform).
void reference_margin(const Forest& forest, const float* row, double* out);
// The leaf value one tree of the forest gives a row (the same walk).
double tree_leaf_value(const Forest& forest, const Tree& tree, const float* row);

// Applies the forest's transform to num_groups margins: float32 math for XGBoost (its
// margins are float32 values), double for LightGBM, rounded to float32 at the end.
void apply_transform(const Forest& forest, const double* margin, float* out);
int output_width(const Forest& forest);
// The same on bare parameters (used by the compiled form, which has no Forest).
void transform_margins(Transform transform, bool accumulate_double, double sigmoid_scale,
                       uint32_t num_groups, const double* margin, float* out);  // columns of the transformed output

}  // namespace slim::forest
