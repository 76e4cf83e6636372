// Control flow: If, Loop, Scan and SequenceMap. Their subgraphs are compiled by the
// session into plans of their own when the kernel is built (KernelBuildInfo::
// compile_subgraph); compute() only runs those plans. An If whose condition compile
// knows never gets here: the session inlines its taken branch.
#include <climits>

#include "runtime/ref/ref_kernels.h"
#include "runtime/ref/ref_util.h"

namespace slim::ref {

namespace {

std::unique_ptr<SubgraphPlan> compile(const KernelBuildInfo& info, const std::string& attr,
                                      const std::vector<NodeInputInfo>& formal = {}) {
  if (!info.compile_subgraph)
    throw Error(ErrorCode::unsupported,
                info.node.describe() + ": subgraphs run only inside a Session");
  return info.compile_subgraph(attr, formal);
}

// The one bool of a condition input or output; `what` names it in the error.
bool truth(const KernelContext& ctx, const Tensor& t, const std::string& what) {
  if (t.dtype() != DType::boolean || t.numel() != 1)
    ctx.fail(ErrorCode::invalid_argument, what + " must be a bool scalar, got " + t.describe());
  return *static_cast<const bool*>(t.raw_data());
}

// ---------------------------------------------------------------------------------- If

class IfKernel final : public OpKernel {
 public:
  explicit IfKernel(const KernelBuildInfo& info)
      : then_(compile(info, "then_branch")), else_(compile(info, "else_branch")) {
    for (const auto* b : {then_.get(), else_.get()})
      check(b->num_outputs() == int(info.node.outputs.size()), ErrorCode::invalid_model,
            info.node.describe() + ": a branch has " + std::to_string(b->num_outputs()) +
                " outputs, the node " + std::to_string(info.node.outputs.size()));
  }

  void compute(KernelContext& ctx) const override {
    SubgraphPlan& branch = truth(ctx, ctx.required_input(0), "the condition") ? *then_ : *else_;
    std::vector<Value> outs = branch.run(ctx, {});
    for (int i = 0; i < ctx.num_outputs(); ++i)
      if (ctx.output_wanted(i)) ctx.set_output(i, std::move(outs[size_t(i)]));
  }

  // Known when both branches agree on it.
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    const auto dt = then_->output_dtype(i), de = else_->output_dtype(i);
    const auto st = then_->output_shape(i), se = else_->output_shape(i);
    if (!dt || !st || dt != de || st != se) return false;
    *dtype = *dt;
    *shape = *st;
    return true;
  }

 private:
  std::unique_ptr<SubgraphPlan> then_, else_;
};

}  // namespace

void register_control_flow_kernels(KernelRegistry& r) {
  KernelDef if_def{"If", "", 1, INT_MAX, nullptr, {}};
  if_def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    return std::make_unique<IfKernel>(info);
  };
  r.add(std::move(if_def));
}

}  // namespace slim::ref
