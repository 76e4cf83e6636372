#include "slim/runtime/session_model.h"

namespace slim {
namespace {

TensorSpec spec_of(const ValueInfo& vi, const Session& session) {
  TensorSpec spec;
  spec.name = vi.name;
  spec.dtype = vi.dtype ? *vi.dtype : session.static_dtype(vi.name).value_or(DType::f32);
  if (vi.shape) {
    for (const Dim& d : *vi.shape) spec.shape.push_back(d.is_fixed() ? d.value : -1);
  } else if (auto s = session.static_shape(vi.name)) {
    spec.shape = *s;
  } else {
    spec.rank_known = false;
  }
  return spec;
}

}  // namespace

SessionModel::SessionModel(std::unique_ptr<Session> session) : session_(std::move(session)) {
  for (const ValueInfo& vi : session_->inputs()) inputs_.push_back(spec_of(vi, *session_));
  for (const ValueInfo& vi : session_->outputs()) outputs_.push_back(spec_of(vi, *session_));
}

std::map<std::string, Tensor> SessionModel::predict(const std::map<std::string, Tensor>& inputs) const {
  return session_->run(inputs);
}

}  // namespace slim
