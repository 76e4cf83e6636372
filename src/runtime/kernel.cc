#include "slim/runtime/kernel.h"

#include <set>

#include "slim/onnx/importer.h"
#include "slim/runtime/provider.h"

namespace slim {

KernelContext::KernelContext(const Node& node, const std::vector<const Tensor*>& inputs,
                             std::vector<Tensor>* outputs, const std::vector<Tensor>* planned,
                             ThreadPool* pool)
    : node_(node), inputs_(&inputs), outputs_(outputs), planned_(planned), pool_(pool) {
  if (!pool_) pool_ = &default_thread_pool();
}

const Tensor* KernelContext::input(int i) const {
  if (i < 0 || i >= int(inputs_->size())) return nullptr;
  const Tensor* t = (*inputs_)[size_t(i)];
  if (t && t->defined()) return t;
  // A sequence or optional where a tensor is expected is an error, not an absent input.
  if (value_inputs_ && size_t(i) < value_inputs_->size() && (*value_inputs_)[size_t(i)])
    fail(ErrorCode::invalid_argument, "input " + std::to_string(i) + " is " +
                                          (*value_inputs_)[size_t(i)]->describe() +
                                          ", expected a tensor");
  return nullptr;
}

const Tensor& KernelContext::required_input(int i) const {
  const Tensor* t = input(i);
  if (!t) fail(ErrorCode::invalid_model, "required input " + std::to_string(i) + " is missing");
  return *t;
}

bool KernelContext::output_wanted(int i) const {
  return i >= 0 && i < int(node_.outputs.size()) && !node_.outputs[size_t(i)].empty();
}

Tensor& KernelContext::output(int i, DType dtype, const Shape& shape) {
  if (i < 0 || i >= num_outputs())
    fail(ErrorCode::internal, "output index " + std::to_string(i) + " out of range");
  Tensor& out = (*outputs_)[size_t(i)];
  if (planned_ && size_t(i) < planned_->size()) {
    const Tensor& p = (*planned_)[size_t(i)];
    if (p.defined() && p.dtype() == dtype && p.shape() == shape) {
      // A session keeps a step's planned outputs between runs: no copy then.
      if (!(out.storage() == p.storage() && out.raw_data() == p.raw_data() && out.dtype() == dtype &&
            out.shape() == shape && out.is_contiguous()))
        out = p;
      return out;
    }
  }
  out = Tensor(dtype, shape);
  return out;
}

void KernelContext::set_output(int i, Tensor t) {
  if (i < 0 || i >= num_outputs())
    fail(ErrorCode::internal, "output index " + std::to_string(i) + " out of range");
  (*outputs_)[size_t(i)] = std::move(t);
}

void KernelContext::set_values(const std::vector<const Value*>* inputs,
                               std::vector<Value>* outputs,
                               const std::vector<Value>* captures) {
  value_inputs_ = inputs;
  value_outputs_ = outputs;
  captures_ = captures;
}

Value KernelContext::value(int i) const {
  if (value_inputs_ && i >= 0 && size_t(i) < value_inputs_->size() && (*value_inputs_)[size_t(i)])
    return *(*value_inputs_)[size_t(i)];
  const Tensor* t = input(i);
  return t ? Value(*t) : Value();
}

void KernelContext::set_output(int i, Value v) {
  if (v.is_tensor()) return set_output(i, std::move(v.tensor()));
  if (i < 0 || i >= num_outputs())
    fail(ErrorCode::internal, "output index " + std::to_string(i) + " out of range");
  if (!value_outputs_)
    fail(ErrorCode::internal, "produced " + v.describe() + " outside a session");
  (*value_outputs_)[size_t(i)] = std::move(v);
}

const std::vector<Value>& KernelContext::captures() const {
  static const std::vector<Value> kNone;
  return captures_ ? *captures_ : kNone;
}

std::vector<std::string> node_captures(const Node& node) {
  std::set<std::string> outer;
  for (const auto& [key, a] : node.attrs) {
    if (a.kind == Attribute::Kind::g && a.g) {
      const auto refs = outer_scope_refs(*a.g);
      outer.insert(refs.begin(), refs.end());
    }
    if (a.kind == Attribute::Kind::graphs)
      for (const auto& sg : a.graphs)
        if (sg) {
          const auto refs = outer_scope_refs(*sg);
          outer.insert(refs.begin(), refs.end());
        }
  }
  return {outer.begin(), outer.end()};
}

void KernelContext::fail(ErrorCode code, const std::string& msg) const {
  throw Error(code, node_.describe() + ": " + msg);
}

void KernelRegistry::add(KernelDef def) { defs_.push_back(std::move(def)); }

const KernelDef* KernelRegistry::find(const std::string& op_type, const std::string& domain,
                                      int64_t opset) const {
  const KernelDef* best = nullptr;
  for (const auto& d : defs_) {
    if (d.op_type != op_type || d.domain != domain) continue;
    if (opset < d.since_version || opset > d.until_version) continue;
    if (!best || d.since_version > best->since_version) best = &d;
  }
  return best;
}

bool KernelRegistry::has_op(const std::string& op_type, const std::string& domain) const {
  for (const auto& d : defs_)
    if (d.op_type == op_type && d.domain == domain) return true;
  return false;
}

const NodeInputInfo& KernelBuildInfo::input(int i) const {
  static const NodeInputInfo kAbsent;
  return i >= 0 && i < int(inputs.size()) ? inputs[size_t(i)] : kAbsent;
}

ProviderChoice choose_provider(const std::vector<const KernelRegistry*>& providers,
                               const KernelBuildInfo& info) {
  ProviderChoice choice;
  const Node& node = info.node;
  for (const auto* r : providers) {
    const KernelDef* def = r->find(node.op_type, node.domain, info.opset);
    if (!def) {
      choice.declined.push_back(r->provider() + ": " +
                                (r->has_op(node.op_type, node.domain)
                                     ? "no kernel for opset " + std::to_string(info.opset)
                                     : std::string("op not implemented")));
      continue;
    }
    if (def->claim) {
      const Claim c = def->claim(info);
      if (!c.taken) {
        choice.declined.push_back(r->provider() + ": " + c.reason);
        continue;
      }
    }
    choice.def = def;
    choice.provider = r->provider();
    return choice;
  }
  return choice;
}

std::unique_ptr<OpKernel> build_kernel(const KernelDef& def, const KernelBuildInfo& info) {
  return def.build ? def.build(info) : def.factory(info.node, info.opset);
}

}  // namespace slim
