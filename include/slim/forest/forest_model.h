// ForestModel: a compiled forest behind the TensorModel interface, so the server hosts
// tree ensembles like any other model: f32 "input" [N, F] in, f32 "output" [N] (one
// output column) or [N, C] out. Also the CSV reading the CLI feeds it with.
#pragma once

#include <string>
#include <vector>

#include "slim/core/tensor_model.h"
#include "slim/forest/compiled_forest.h"

namespace slim::forest {

class ForestModel : public TensorModel {
 public:
  explicit ForestModel(CompiledForest forest, bool margin = false)
      : forest_(std::move(forest)), margin_(margin) {}
  std::vector<TensorSpec> input_specs() const override;
  std::vector<TensorSpec> output_specs() const override;
  std::map<std::string, Tensor> predict(const std::map<std::string, Tensor>& inputs) const override;
  const CompiledForest& forest() const { return forest_; }

 private:
  int width() const { return margin_ ? int(forest_.num_groups()) : forest_.output_width(); }
  CompiledForest forest_;
  bool margin_;
};

// A numeric CSV table. Empty cells, "NA", "nan" and "?" read as NaN. The first line is a
// header when any of its cells is not a number.
struct CsvTable {
  std::vector<std::string> columns;  // empty without a header
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> values;  // rows x cols
};
CsvTable read_csv(const std::string& path);

// Feature rows to predict: a CSV (read_csv) or a 2-D .npy array (f32 or f64), every column
// but the label column (a CSV header name, or a column index; "" for none). With
// `label_optional` a label column named but absent is fine when the columns are exactly
// the features (calibration rows). Errors
// (invalid_argument, naming the file): no such label column, a feature count other than
// `features`, an .npy that is not 2-D numbers.
struct FeatureRows {
  int64_t n = 0, f = 0;
  std::vector<float> x, labels;  // n x f; n labels, or none
};
FeatureRows read_feature_rows(const std::string& path, const std::string& label_column, uint32_t features,
                              bool label_optional = false);

}  // namespace slim::forest
