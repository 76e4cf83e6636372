// Control flow: If, Loop, Scan and SequenceMap. Their subgraphs are compiled by the
// session into plans of their own when the kernel is built (KernelBuildInfo::
// compile_subgraph); compute() only runs those plans. An If whose condition compile
// knows never gets here: the session inlines its taken branch.
#include <climits>
#include <cstring>

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
bool truth(const KernelContext& ctx, const Tensor& t, const char* what) {
  if (t.dtype() != DType::boolean || t.numel() != 1)
    ctx.fail(ErrorCode::invalid_argument, std::string(what) + " must be a bool scalar, got " + t.describe());
  return *static_cast<const bool*>(t.raw_data());
}

// The tensor in a value a subgraph returned; `what` and `index` ("scan output", 2) name it
// in the error.
const Tensor& tensor_of(const KernelContext& ctx, const Value& v, const char* what, int index = -1) {
  if (!v.is_tensor() || !v.defined())
    ctx.fail(ErrorCode::invalid_argument, std::string(what) + (index >= 0 ? " " + std::to_string(index) : "") +
                                              " must be a tensor, got " + v.describe());
  return v.tensor();
}

// x[..., i, ...] along `axis`: rank one lower, a view where x allows it.
Tensor take(const Tensor& x, int axis, int64_t i) {
  Shape shape = x.shape();
  shape.erase(shape.begin() + axis);
  return x.slice(axis, i, i + 1).contiguous().reshape(shape);
}

// Writes `part` into out[..., i, ...] along `axis`.
void put(Tensor& out, int axis, int64_t i, const Tensor& part) {
  Tensor dst = out.slice(axis, i, i + 1);
  dst.copy_from(part.reshape(dst.shape()));
}

Shape with_dim(Shape shape, int axis, int64_t dim) {
  shape.insert(shape.begin() + axis, dim);
  return shape;
}

// A loop body (Loop, Scan) is compiled first with the shapes its carried values start
// with, and that plan is kept when the body gives them back unchanged: one static plan
// (cpu kernels, folding, memory plan) for every iteration. Otherwise the carried shapes
// are left to the body's declarations, and the plan's shape specializations cover
// iterations that repeat shapes. `carried` pairs body inputs with the outputs that feed
// them next time.
struct BodyPlan {
  std::unique_ptr<SubgraphPlan> plan;
  bool invariant = false;  // the carried values keep the shapes they start with
};

BodyPlan compile_body(const KernelBuildInfo& info, std::vector<NodeInputInfo> formal,
                      const std::vector<std::pair<int, int>>& carried) {
  bool known = false;
  for (const auto& [in, out] : carried) known = known || formal[size_t(in)].shape.has_value();
  if (known) {
    std::unique_ptr<SubgraphPlan> plan;
    try {
      plan = compile(info, "body", formal);
    } catch (const Error& e) {
      // Shapes the body's declarations do not allow: those decide, below.
      if (e.code() == ErrorCode::unsupported) throw;
    }
    bool same = plan != nullptr;
    for (const auto& [in, out] : carried)
      if (same && formal[size_t(in)].shape)
        same = plan->output_dtype(out) == formal[size_t(in)].dtype &&
               plan->output_shape(out) == formal[size_t(in)].shape;
    if (same) return {std::move(plan), true};
  }
  for (const auto& [in, out] : carried) formal[size_t(in)].shape.reset();
  return {compile(info, "body", formal), carried.empty()};
}

NodeInputInfo scalar_info(DType dtype) {
  NodeInputInfo i;
  i.present = true;
  i.dtype = dtype;
  i.shape = Shape{};
  return i;
}

// The scan outputs of a run without iterations: no part to take the shape from, so the
// body's static output shape (or a rank-1 empty tensor) with 0 where the scan goes.
Tensor& empty_scan_output(KernelContext& ctx, const SubgraphPlan& body, int body_out, int out,
                          int axis, Shape prefix = {}) {
  const auto dtype = body.output_dtype(body_out);
  if (!dtype)
    ctx.fail(ErrorCode::unsupported, "ran no iteration and the type of scan output " +
                                         std::to_string(out) + " is unknown");
  Shape shape = body.output_shape(body_out).value_or(Shape{});
  shape = with_dim(shape, std::min<int>(axis, int(shape.size())), 0);
  shape.insert(shape.begin(), prefix.begin(), prefix.end());
  return ctx.output(out, *dtype, shape);
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


// -------------------------------------------------------------------------------- Loop

// Loop(M, cond, v...) runs body(i, cond, v...) -> (cond, v..., scan...) while i < M and
// cond hold (either may be absent, not both); the carried values v may be tensors,
// sequences or optionals, and the scan outputs are stacked along a new first axis.
class LoopKernel final : public OpKernel {
 public:
  explicit LoopKernel(const KernelBuildInfo& info) {
    const Node& node = info.node;
    has_max_ = info.has_input(0);
    has_cond_ = info.has_input(1);
    if (!has_max_ && !has_cond_)
      throw Error(ErrorCode::invalid_model,
                  node.describe() + ": has neither a trip count nor a condition, so it never ends");
    carried_ = std::max<int>(int(node.inputs.size()) - 2, 0);
    scans_ = int(node.outputs.size()) - carried_;
    if (scans_ < 0)
      throw Error(ErrorCode::invalid_model, node.describe() + ": " + std::to_string(carried_) +
                                                " carried values but only " +
                                                std::to_string(node.outputs.size()) + " outputs");
    std::vector<NodeInputInfo> formal = {scalar_info(DType::i64), scalar_info(DType::boolean)};
    std::vector<std::pair<int, int>> pairs;
    for (int k = 0; k < carried_; ++k) {
      NodeInputInfo in = info.input(2 + k);
      in.constant = nullptr;
      formal.push_back(in);
      initial_.push_back(in);
      pairs.emplace_back(2 + k, 1 + k);
    }
    body_ = compile_body(info, formal, pairs);
    check(body_.plan->num_inputs() == 2 + carried_ && body_.plan->num_outputs() == 1 + carried_ + scans_,
          ErrorCode::invalid_model,
          node.describe() + ": the body has " + std::to_string(body_.plan->num_inputs()) +
              " inputs and " + std::to_string(body_.plan->num_outputs()) + " outputs, the node needs " +
              std::to_string(2 + carried_) + " and " + std::to_string(1 + carried_ + scans_));
  }

  void compute(KernelContext& ctx) const override {
    int64_t max_trips = 0;
    if (const Tensor* m = ctx.input(0)) {
      if (m->dtype() != DType::i64 || m->numel() != 1)
        ctx.fail(ErrorCode::invalid_argument,
                 "the trip count (input 0) must be an int64 scalar, got " + m->describe());
      max_trips = *m->data<int64_t>();
    }
    bool cond = true;
    if (const Tensor* c = ctx.input(1)) cond = truth(ctx, *c, "the condition (input 1)");
    std::vector<Value> carried(static_cast<size_t>(carried_));
    for (int k = 0; k < carried_; ++k) {
      carried[size_t(k)] = ctx.value(2 + k);
      if (!carried[size_t(k)].defined())
        ctx.fail(ErrorCode::invalid_model, "carried value " + std::to_string(k) + " is missing");
    }
    std::vector<std::vector<Tensor>> scans(static_cast<size_t>(scans_));
    int64_t i = 0;
    for (; (!has_max_ || i < max_trips) && cond; ++i) {
      std::vector<Value> feeds;
      feeds.reserve(size_t(2 + carried_));
      feeds.emplace_back(Tensor::scalar<int64_t>(i));
      feeds.emplace_back(Tensor::scalar<bool>(cond));
      for (auto& v : carried) feeds.push_back(std::move(v));
      std::vector<Value> outs = body_.plan->run(ctx, std::move(feeds));
      // Without a condition input the body's condition output is ignored (a for loop).
      if (has_cond_)
        cond = truth(ctx, tensor_of(ctx, outs[0], "the body's condition"), "the body's condition");
      for (int k = 0; k < carried_; ++k) carried[size_t(k)] = std::move(outs[size_t(1 + k)]);
      for (int k = 0; k < scans_; ++k) {
        const Tensor& part = tensor_of(ctx, outs[size_t(1 + carried_ + k)], "scan output", k);
        auto& list = scans[size_t(k)];
        if (!list.empty() && (part.shape() != list[0].shape() || part.dtype() != list[0].dtype()))
          ctx.fail(ErrorCode::invalid_argument, "scan output " + std::to_string(k) + " is " +
                                                    part.describe() + " in iteration " +
                                                    std::to_string(i) + ", " + list[0].describe() +
                                                    " before");
        list.push_back(part);
      }
    }
    for (int k = 0; k < carried_; ++k)
      if (ctx.output_wanted(k)) ctx.set_output(k, std::move(carried[size_t(k)]));
    for (int k = 0; k < scans_; ++k) {
      const int out = carried_ + k;
      if (!ctx.output_wanted(out)) continue;
      const auto& list = scans[size_t(k)];
      if (list.empty()) {
        empty_scan_output(ctx, *body_.plan, 1 + carried_ + k, out, 0);
        continue;
      }
      Tensor& y = ctx.output(out, list[0].dtype(), with_dim(list[0].shape(), 0, i));
      for (int64_t t = 0; t < i; ++t) put(y, 0, t, list[size_t(t)]);
    }
  }

  // The carried values, when the body keeps the shapes they start with.
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    if (i >= carried_ || !body_.invariant) return false;
    const NodeInputInfo& in = initial_[size_t(i)];
    if (!in.dtype || !in.shape) return false;
    *dtype = *in.dtype;
    *shape = *in.shape;
    return true;
  }

 private:
  bool has_max_ = false, has_cond_ = false;
  int carried_ = 0, scans_ = 0;
  BodyPlan body_;
  std::vector<NodeInputInfo> initial_;
};

// -------------------------------------------------------------------------------- Scan

// Scan(states..., inputs...) runs body(states..., slices...) -> (states..., parts...)
// once per position along the inputs' scan axes and stacks the parts along each output's
// scan axis; a reverse direction walks an input, or fills an output, from the end.
// Opset 8 has a batch axis first (each batch item scanned on its own up to its
// sequence_lens entry, outputs zero past it), one `directions` list and the scan axis
// after the batch; opset 9 on has per-input and per-output axes and directions.
class ScanKernel final : public OpKernel {
 public:
  explicit ScanKernel(const KernelBuildInfo& info) : batched_(info.opset < 9) {
    const Node& node = info.node;
    const int first = batched_ ? 1 : 0;
    const int64_t m = node.attr_int("num_scan_inputs", -1);
    const int inputs = int(node.inputs.size()) - first;
    if (m < 1 || m > inputs)
      throw Error(ErrorCode::invalid_model, node.describe() + ": num_scan_inputs must be in [1, " +
                                                std::to_string(inputs) + "], got " + std::to_string(m));
    scan_inputs_ = int(m);
    states_ = inputs - scan_inputs_;
    scan_outputs_ = int(node.outputs.size()) - states_;
    if (scan_outputs_ < 0)
      throw Error(ErrorCode::invalid_model, node.describe() + ": " + std::to_string(states_) +
                                                " states but only " +
                                                std::to_string(node.outputs.size()) + " outputs");
    auto list = [&](const char* key, int n) {
      std::vector<int64_t> v = node.attr_ints(key, std::vector<int64_t>(size_t(n), 0));
      if (int(v.size()) != n)
        throw Error(ErrorCode::invalid_model, node.describe() + ": attribute '" + key + "' has " +
                                                  std::to_string(v.size()) + " entries, expected " +
                                                  std::to_string(n));
      return v;
    };
    if (batched_) {
      in_dirs_ = list("directions", scan_inputs_);
      in_axes_.assign(size_t(scan_inputs_), 0);
      out_axes_.assign(size_t(scan_outputs_), 0);
      out_dirs_.assign(size_t(scan_outputs_), 0);
    } else {
      in_dirs_ = list("scan_input_directions", scan_inputs_);
      in_axes_ = list("scan_input_axes", scan_inputs_);
      out_dirs_ = list("scan_output_directions", scan_outputs_);
      out_axes_ = list("scan_output_axes", scan_outputs_);
    }
    for (const auto* dirs : {&in_dirs_, &out_dirs_})
      for (int64_t d : *dirs)
        if (d != 0 && d != 1)
          throw Error(ErrorCode::invalid_model,
                      node.describe() + ": a direction must be 0 or 1, got " + std::to_string(d));
    // The body's inputs: the states and one slice of each scan input (less the batch axis).
    std::vector<NodeInputInfo> formal;
    std::vector<std::pair<int, int>> pairs;
    for (int k = 0; k < states_ + scan_inputs_; ++k) {
      NodeInputInfo in = info.input(first + k);
      in.constant = nullptr;
      initial_.push_back(in);
      if (in.shape && batched_) {
        if (in.shape->empty())
          in.shape.reset();
        else
          in.shape->erase(in.shape->begin());
      }
      if (in.shape && k >= states_) {
        const int64_t axis = in_axes_[size_t(k - states_)];
        const int rank = int(in.shape->size());
        if (axis < -rank || axis >= rank)
          in.shape.reset();
        else
          in.shape->erase(in.shape->begin() + (axis < 0 ? axis + rank : axis));
      }
      formal.push_back(in);
      if (k < states_) pairs.emplace_back(k, k);
    }
    body_ = compile_body(info, formal, pairs);
    check(body_.plan->num_inputs() == states_ + scan_inputs_ &&
              body_.plan->num_outputs() == states_ + scan_outputs_,
          ErrorCode::invalid_model,
          node.describe() + ": the body has " + std::to_string(body_.plan->num_inputs()) +
              " inputs and " + std::to_string(body_.plan->num_outputs()) + " outputs, the node needs " +
              std::to_string(states_ + scan_inputs_) + " and " + std::to_string(states_ + scan_outputs_));
  }

  void compute(KernelContext& ctx) const override {
    const int first = batched_ ? 1 : 0;
    std::vector<Tensor> states, inputs;
    for (int k = 0; k < states_; ++k) states.push_back(ctx.required_input(first + k));
    std::vector<int> axes;
    int64_t length = -1;
    for (int j = 0; j < scan_inputs_; ++j) {
      const Tensor& x = ctx.required_input(first + states_ + j);
      if (x.rank() < 1 + first)
        ctx.fail(ErrorCode::invalid_argument, "scan input " + std::to_string(j) + " is " +
                                                  x.describe() + ", it has no scan axis");
      // Opset 8 scans each batch item (axis 0) along axis 1, the item's axis 0.
      const int axis = batched_ ? 0 : normalize_axis(ctx, in_axes_[size_t(j)], x.rank());
      const int64_t n = x.shape()[size_t(axis + first)];
      if (length >= 0 && n != length)
        ctx.fail(ErrorCode::invalid_argument,
                 "scan input " + std::to_string(j) + " has " + std::to_string(n) +
                     " positions along its scan axis, scan input 0 " + std::to_string(length));
      length = n;
      inputs.push_back(x);
      axes.push_back(axis);
    }
    if (!batched_) {
      Scanned r = scan(ctx, states, inputs, axes, length);
      for (int k = 0; k < states_; ++k) ctx.set_output(k, r.states[size_t(k)]);
      for (int k = 0; k < scan_outputs_; ++k) {
        const int out = states_ + k;
        if (length == 0) {
          empty_scan_output(ctx, *body_.plan, out, out, int(out_axes_[size_t(k)]));
          continue;
        }
        const auto& parts = r.parts[size_t(k)];
        const int axis = normalize_axis(ctx, out_axes_[size_t(k)], parts[0].rank() + 1);
        Tensor& y = ctx.output(out, parts[0].dtype(), with_dim(parts[0].shape(), axis, length));
        for (int64_t t = 0; t < length; ++t) put(y, axis, t, parts[size_t(t)]);
      }
      return;
    }
    const int64_t batch = inputs[0].shape()[0];
    for (const auto* list : {&states, &inputs})
      for (const auto& t : *list)
        if (t.rank() < 1 || t.shape()[0] != batch)
          ctx.fail(ErrorCode::invalid_argument,
                   t.describe() + " does not start with the batch size " + std::to_string(batch));
    std::vector<int64_t> lens(size_t(batch), length);
    if (const Tensor* sl = ctx.input(0)) {
      if (sl->dtype() != DType::i64 || sl->numel() != batch)
        ctx.fail(ErrorCode::invalid_argument,
                 "sequence_lens must be int64 with one entry per batch item, got " + sl->describe());
      for (int64_t b = 0; b < batch; ++b) {
        lens[size_t(b)] = sl->data<int64_t>()[b];
        if (lens[size_t(b)] < 0 || lens[size_t(b)] > length)
          ctx.fail(ErrorCode::invalid_argument, "sequence_lens[" + std::to_string(b) + "] = " +
                                                    std::to_string(lens[size_t(b)]) + " is not in [0, " +
                                                    std::to_string(length) + "]");
      }
    }
    std::vector<Scanned> items;
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<Tensor> st, in;
      for (const auto& t : states) st.push_back(take(t, 0, b));
      for (const auto& t : inputs) in.push_back(take(t, 0, b));
      items.push_back(scan(ctx, st, in, axes, lens[size_t(b)]));
    }
    for (int k = 0; k < states_; ++k) {
      Tensor& y = ctx.output(k, states[size_t(k)].dtype(), states[size_t(k)].shape());
      for (int64_t b = 0; b < batch; ++b) put(y, 0, b, items[size_t(b)].states[size_t(k)]);
    }
    for (int k = 0; k < scan_outputs_; ++k) {
      const int out = states_ + k;
      const Tensor* part0 = nullptr;
      for (const auto& item : items)
        if (!part0 && !item.parts[size_t(k)].empty()) part0 = &item.parts[size_t(k)][0];
      if (!part0) {
        empty_scan_output(ctx, *body_.plan, out, out, 0, {batch});
        continue;
      }
      // Rows past a batch item's sequence length stay zero.
      Tensor& y = ctx.output(out, part0->dtype(), with_dim(with_dim(part0->shape(), 0, length), 0, batch));
      std::memset(y.raw_data(), 0, y.nbytes());
      for (int64_t b = 0; b < batch; ++b) {
        Tensor row = take(y, 0, b);
        const auto& parts = items[size_t(b)].parts[size_t(k)];
        for (size_t t = 0; t < parts.size(); ++t) {
          if (parts[t].shape() != part0->shape() || parts[t].dtype() != part0->dtype())
            ctx.fail(ErrorCode::invalid_argument, "scan output " + std::to_string(k) + " is " +
                                                      parts[t].describe() + " for one batch item, " +
                                                      part0->describe() + " for another");
          put(row, 0, int64_t(t), parts[t]);
        }
      }
    }
  }

  bool static_output(int i, DType* dtype, Shape* shape) const override {
    if (i < states_) {
      const NodeInputInfo& in = initial_[size_t(i)];
      if (!body_.invariant || !in.dtype || !in.shape) return false;
      *dtype = *in.dtype;
      *shape = *in.shape;
      return true;
    }
    const NodeInputInfo& x = initial_[size_t(states_)];
    const auto part_dtype = body_.plan->output_dtype(i);
    const auto part = body_.plan->output_shape(i);
    if (!x.shape || !part_dtype || !part) return false;
    const int xr = int(x.shape->size());
    const int64_t in_axis = batched_ ? 1 : in_axes_[0];
    if (in_axis < -xr || in_axis >= xr || xr < (batched_ ? 2 : 1)) return false;
    const int64_t length = (*x.shape)[size_t(in_axis < 0 ? in_axis + xr : in_axis)];
    const int r = int(part->size()) + 1;
    const int64_t axis = out_axes_[size_t(i - states_)];
    if (axis < -r || axis >= r) return false;
    *shape = with_dim(*part, int(axis < 0 ? axis + r : axis), length);
    if (batched_) shape->insert(shape->begin(), (*x.shape)[0]);
    *dtype = *part_dtype;
    return true;
  }

 private:
  struct Scanned {
    std::vector<Tensor> states;
    std::vector<std::vector<Tensor>> parts;  // per scan output, in output order
  };

  // Runs the body over the first `steps` positions of one sequence.
  Scanned scan(const KernelContext& ctx, std::vector<Tensor> states, const std::vector<Tensor>& inputs,
               const std::vector<int>& axes, int64_t steps) const {
    Scanned r;
    r.parts.assign(size_t(scan_outputs_), std::vector<Tensor>(size_t(steps)));
    for (int64_t t = 0; t < steps; ++t) {
      std::vector<Value> feeds(states.begin(), states.end());
      for (int j = 0; j < scan_inputs_; ++j)
        feeds.emplace_back(take(inputs[size_t(j)], axes[size_t(j)], in_dirs_[size_t(j)] ? steps - 1 - t : t));
      std::vector<Value> outs = body_.plan->run(ctx, std::move(feeds));
      for (int k = 0; k < states_; ++k) {
        const Tensor& s = tensor_of(ctx, outs[size_t(k)], "state", k);
        if (s.shape() != states[size_t(k)].shape() || s.dtype() != states[size_t(k)].dtype())
          ctx.fail(ErrorCode::invalid_argument, "the body turns state " + std::to_string(k) + " from " +
                                                    states[size_t(k)].describe() + " into " + s.describe());
        states[size_t(k)] = s;
      }
      for (int k = 0; k < scan_outputs_; ++k) {
        const Tensor& part = tensor_of(ctx, outs[size_t(states_ + k)], "scan output", k);
        auto& parts = r.parts[size_t(k)];
        const int64_t pos = out_dirs_[size_t(k)] ? steps - 1 - t : t;
        if (t > 0) {
          const Tensor& before = parts[size_t(out_dirs_[size_t(k)] ? pos + 1 : pos - 1)];
          if (part.shape() != before.shape() || part.dtype() != before.dtype())
            ctx.fail(ErrorCode::invalid_argument, "scan output " + std::to_string(k) + " is " +
                                                      part.describe() + " in step " + std::to_string(t) +
                                                      ", " + before.describe() + " before");
        }
        parts[size_t(pos)] = part;
      }
    }
    r.states = std::move(states);
    return r;
  }

  bool batched_;
  int states_ = 0, scan_inputs_ = 0, scan_outputs_ = 0;
  std::vector<int64_t> in_dirs_, in_axes_, out_dirs_, out_axes_;
  BodyPlan body_;
  std::vector<NodeInputInfo> initial_;
};


// --------------------------------------------------------------------------- SequenceMap

// SequenceMap(seq, more...) runs the body once per item of seq, giving it item i of each
// sequence input and every tensor input whole, and collects each body output into a
// sequence.
class SequenceMapKernel final : public OpKernel {
 public:
  explicit SequenceMapKernel(const KernelBuildInfo& info) {
    // Items differ in shape from call to call: what a tensor input is, is known.
    std::vector<NodeInputInfo> formal;
    for (size_t k = 0; k < info.node.inputs.size(); ++k) {
      NodeInputInfo in = info.input(int(k));
      in.constant = nullptr;
      if (k == 0 || !in.dtype) in = NodeInputInfo{};
      formal.push_back(in);
    }
    body_ = compile(info, "body", formal);
    check(body_->num_inputs() == int(info.node.inputs.size()) &&
              body_->num_outputs() == int(info.node.outputs.size()),
          ErrorCode::invalid_model,
          info.node.describe() + ": the body has " + std::to_string(body_->num_inputs()) + " inputs and " +
              std::to_string(body_->num_outputs()) + " outputs, the node " +
              std::to_string(info.node.inputs.size()) + " and " + std::to_string(info.node.outputs.size()));
  }

  void compute(KernelContext& ctx) const override {
    std::vector<Value> ins;
    for (int k = 0; k < ctx.num_inputs(); ++k) {
      ins.push_back(ctx.value(k));
      if (!ins.back().defined()) ctx.fail(ErrorCode::invalid_model, "input " + std::to_string(k) + " is missing");
    }
    if (!ins[0].is_sequence())
      ctx.fail(ErrorCode::invalid_argument, "input 0 must be a sequence, got " + ins[0].describe());
    const size_t n = ins[0].items().size();
    for (size_t k = 1; k < ins.size(); ++k)
      if (ins[k].is_sequence() && ins[k].items().size() != n)
        ctx.fail(ErrorCode::invalid_argument, "input " + std::to_string(k) + " has " +
                                                  std::to_string(ins[k].items().size()) + " items, input 0 " +
                                                  std::to_string(n));
    std::vector<std::vector<Tensor>> items(size_t(ctx.num_outputs()));
    for (size_t i = 0; i < n; ++i) {
      std::vector<Value> feeds;
      for (const auto& v : ins) feeds.push_back(v.is_sequence() ? Value(v.items()[i]) : v);
      std::vector<Value> outs = body_->run(ctx, std::move(feeds));
      for (size_t k = 0; k < items.size(); ++k) {
        const Tensor& t = tensor_of(ctx, outs[k], "body output", int(k));
        if (!items[k].empty() && t.dtype() != items[k][0].dtype())
          ctx.fail(ErrorCode::invalid_argument, "body output " + std::to_string(k) + " is " + t.describe() +
                                                    " for item " + std::to_string(i) + ", " +
                                                    items[k][0].describe() + " before");
        items[k].push_back(t);
      }
    }
    for (int k = 0; k < ctx.num_outputs(); ++k)
      ctx.set_output(k, Value::sequence(std::move(items[size_t(k)]), body_->output_dtype(k)));
  }

 private:
  std::unique_ptr<SubgraphPlan> body_;
};

template <typename K>
KernelDef control_flow(const char* op, int64_t since) {
  KernelDef def{op, "", since, INT_MAX, nullptr, {}};
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    return std::make_unique<K>(info);
  };
  return def;
}

}  // namespace

void register_control_flow_kernels(KernelRegistry& r) {
  r.add(control_flow<IfKernel>("If", 1));
  r.add(control_flow<LoopKernel>("Loop", 1));
  r.add(control_flow<ScanKernel>("Scan", 8));
  r.add(control_flow<SequenceMapKernel>("SequenceMap", 17));
}

}  // namespace slim::ref
