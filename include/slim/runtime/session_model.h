// SessionModel: a compiled ONNX Session behind the TensorModel interface, so the server
// hosts ONNX networks like any other model. Symbolic dims are -1 in the specs; an output
// whose rank the file does not declare has an empty shape and rank_known = false.
#pragma once

#include <memory>
#include <string>

#include "slim/core/tensor_model.h"
#include "slim/runtime/session.h"

namespace slim {

class SessionModel : public TensorModel {
 public:
  explicit SessionModel(std::unique_ptr<Session> session);
  std::vector<TensorSpec> input_specs() const override { return inputs_; }
  std::vector<TensorSpec> output_specs() const override { return outputs_; }
  // Session::run serializes concurrent calls; the server runs one SessionModel per
  // executor so that executors do not wait for each other.
  std::map<std::string, Tensor> predict(const std::map<std::string, Tensor>& inputs) const override;
  Session& session() const { return *session_; }

 private:
  std::unique_ptr<Session> session_;
  std::vector<TensorSpec> inputs_, outputs_;
};

}  // namespace slim
