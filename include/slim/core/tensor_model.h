// TensorModel: the one interface the server uses to host any model that maps named
// tensors to named tensors (ONNX sessions, tree ensembles). It says what it expects and
// what it returns, and runs a batch; how the model computes is its own business.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "slim/core/tensor.h"

namespace slim {

// One named input or output. A dim of -1 is free (usually the batch dimension).
struct TensorSpec {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  bool rank_known = true;  // false: the model does not say (shape is then empty)
};

class TensorModel {
 public:
  virtual ~TensorModel() = default;
  virtual std::vector<TensorSpec> input_specs() const = 0;
  virtual std::vector<TensorSpec> output_specs() const = 0;
  // Runs one batch. Throws invalid_argument when an input is missing or its dtype/shape
  // does not match its spec. Safe to call from several threads at once.
  virtual std::map<std::string, Tensor> predict(
      const std::map<std::string, Tensor>& inputs) const = 0;
};

}  // namespace slim
