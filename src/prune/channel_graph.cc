// The channel dependency graph: seeds at every Conv/ConvTranspose/Gemm/MatMul with
// constant weights, then a worklist over values that carry channels. Each node met is
// explained once by a rule that names the channel axis of each of its inputs and outputs,
// couples slots (same channel) and claims tensor slices; a node no rule explains freezes
// the channels that reach it, with the reason.
#include "prune/channel_graph.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <numeric>
#include <set>

#include "slim/core/error.h"
#include "slim/onnx/importer.h"

namespace slim::prune::detail {

int64_t ChannelGraph::find(int64_t s) {
  while (parent[size_t(s)] != s) {
    parent[size_t(s)] = parent[size_t(parent[size_t(s)])];
    s = parent[size_t(s)];
  }
  return s;
}

void ChannelGraph::unite(int64_t a, int64_t b) {
  a = find(a), b = find(b);
  if (a != b) parent[size_t(std::max(a, b))] = std::min(a, b);
}

namespace {

const std::set<std::string> kUnary = {
    "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Softplus",
    "Softsign", "Exp", "Log", "Abs", "Neg", "Sqrt", "Reciprocal", "Erf", "Identity", "Cast", "Floor", "Ceil",
    "Round", "Sign", "Gelu", "Mish", "ThresholdedRelu", "Sin", "Cos", "Clip", "Dropout"};
const std::set<std::string> kPool = {"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool",
                                     "GlobalLpPool"};
const std::set<std::string> kElementwise = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean",
                                            "PRelu", "Where"};
const std::set<std::string> kReshape = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"};

int64_t prod(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to && i < s.size(); ++i) p *= s[i];
  return p;
}

// What one rule wants: spaces by (value, axis), slot couplings, members, fixes.
struct Plan {
  std::vector<std::pair<std::string, int>> spaces;
  struct Couple { int a; int64_t off_a; int b; int64_t off_b, count, block; };  // b slot off_b + i*block + k <-> a slot off_a + i
  std::vector<Couple> couples;
  struct PMember { std::string tensor; int axis, space; int64_t offset; Member::Kind kind; bool depthwise; };
  std::vector<PMember> members;
  std::vector<std::pair<std::string, int64_t>> fix_tensor;  // with fix_space
  std::vector<int> fix_space;
  int depthwise_space = -1, bn_space = -1;
  MacNode mac;
  bool has_mac = false;

  int sp(const std::string& v, int axis) {
    for (size_t i = 0; i < spaces.size(); ++i)
      if (spaces[i].first == v && spaces[i].second == axis) return int(i);
    spaces.emplace_back(v, axis);
    return int(spaces.size() - 1);
  }
  void couple(int a, int b, int64_t count, int64_t off_b = 0) { couples.push_back({a, 0, b, off_b, count, 1}); }
  void member(const std::string& t, int axis, int space, Member::Kind kind, int64_t off = 0, bool dw = false) {
    members.push_back({t, axis, space, off, kind, dw});
  }
};

struct Fail {
  std::string reason;
};

class Builder {
 public:
  Builder(const Graph& g, const std::map<std::string, Shape>& shapes, int64_t opset)
      : g_(g), shapes_(shapes), opset_(opset) {
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      for (size_t k = 0; k < n.inputs.size(); ++k)
        if (!n.inputs[k].empty()) {
          consumers_[n.inputs[k]].push_back(int(i));
          uses_[n.inputs[k]]++;
        }
      for (const auto& o : n.outputs)
        if (!o.empty()) producer_[o] = int(i);
      for (const auto& [key, a] : n.attrs) {
        if (a.g) for (const auto& r : outer_scope_refs(*a.g)) captured_.insert(r);
        for (const auto& sg : a.graphs)
          for (const auto& r : outer_scope_refs(*sg)) captured_.insert(r);
      }
    }
    for (const auto& v : g.outputs) outputs_.insert(v.name);
    for (const auto& v : g.inputs) inputs_.insert(v.name);
    for (const auto& v : g.overridable_inputs) overridable_.insert(v.name);
  }

  ChannelGraph build() {
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const std::string& op = g_.nodes[i].op_type;
      if (g_.nodes[i].domain.empty() && (op == "Conv" || op == "ConvTranspose" || op == "Gemm" || op == "MatMul"))
        visit(int(i), -1);
    }
    while (!work_.empty()) {
      const int s = work_.front();
      work_.pop_front();
      const std::string v = cg_.spaces[size_t(s)].value;
      if (outputs_.count(v)) freeze(s, "'" + v + "' is a graph output");
      if (inputs_.count(v)) freeze(s, "'" + v + "' is a graph input");
      if (captured_.count(v)) freeze(s, "'" + v + "' is read inside a subgraph");
      auto p = producer_.find(v);
      if (p != producer_.end()) visit(p->second, s);
      auto c = consumers_.find(v);
      if (c != consumers_.end())
        for (int n : c->second) visit(n, s);
    }
    return std::move(cg_);
  }

 private:
  const Graph& g_;
  const std::map<std::string, Shape>& shapes_;
  int64_t opset_;
  std::map<std::string, std::vector<int>> consumers_;
  std::map<std::string, int> producer_, uses_;
  std::set<std::string> outputs_, inputs_, captured_, overridable_;
  std::map<int, std::string> failed_;              // node -> reason
  std::map<int, std::set<std::string>> explained_;  // node -> the values its rule gave a channel axis
  std::deque<int> work_;
  ChannelGraph cg_;

  void freeze(int s, const std::string& why) {
    if (cg_.spaces[size_t(s)].frozen.empty()) cg_.spaces[size_t(s)].frozen = why;
  }

  const Shape& shape(const std::string& v) const {
    auto it = shapes_.find(v);
    if (it == shapes_.end()) throw Fail{"the shape of '" + v + "' is not known"};
    return it->second;
  }
  const Tensor* constant(const std::string& v) const {
    if (overridable_.count(v)) return nullptr;
    auto it = g_.initializers.find(v);
    return it == g_.initializers.end() ? nullptr : &it->second;
  }
  // A weight-like constant that one node reads, so slicing it changes nothing else.
  const Tensor& own_constant(const Node& n, const std::string& v, const std::string& what) const {
    const Tensor* t = constant(v);
    if (!t) throw Fail{n.describe() + ": its " + what + " '" + v + "' is not a constant"};
    auto u = uses_.find(v);
    if (u != uses_.end() && u->second > 1) throw Fail{n.describe() + ": its " + what + " '" + v + "' is shared by several nodes"};
    if (t->dtype() != DType::f32 && (what == "weight" || what == "bias" || what == "parameter"))
      throw Fail{n.describe() + ": its " + what + " '" + v + "' is " + t->describe() + ", not float32"};
    return *t;
  }
  int norm_axis(int64_t a, size_t rank, const Node& n) const {
    if (a < 0) a += int64_t(rank);
    if (a < 0 || a >= int64_t(rank)) throw Fail{n.describe() + ": axis out of range"};
    return int(a);
  }
  std::vector<int64_t> const_ints(const std::string& v, const Node& n) const {
    const Tensor* t = constant(v);
    if (!t) throw Fail{n.describe() + ": '" + v + "' is not a constant"};
    std::vector<int64_t> out(size_t(t->numel()));
    const Tensor c = t->contiguous();
    for (int64_t i = 0; i < t->numel(); ++i) {
      switch (c.dtype()) {
        case DType::i64: out[size_t(i)] = c.data<int64_t>()[i]; break;
        case DType::i32: out[size_t(i)] = c.data<int32_t>()[i]; break;
        case DType::f32: out[size_t(i)] = int64_t(c.data<float>()[i]); break;
        default: throw Fail{n.describe() + ": '" + v + "' has an unexpected type"};
      }
    }
    return out;
  }
  std::vector<double> const_doubles(const std::string& v, const Node& n) const {
    const Tensor* t = constant(v);
    if (!t) throw Fail{n.describe() + ": '" + v + "' is not a constant"};
    const Tensor c = t->contiguous();
    std::vector<double> out(size_t(t->numel()));
    for (int64_t i = 0; i < t->numel(); ++i) {
      if (c.dtype() == DType::f32) out[size_t(i)] = c.data<float>()[i];
      else if (c.dtype() == DType::f64) out[size_t(i)] = c.data<double>()[i];
      else if (c.dtype() == DType::i64) out[size_t(i)] = double(c.data<int64_t>()[i]);
      else throw Fail{n.describe() + ": '" + v + "' has an unexpected type"};
    }
    return out;
  }

  // Where element `index` of the 1-D value `v` comes from: an initializer element that
  // this path alone reads, through Cast and Concat.
  std::pair<std::string, int64_t> trace_element(const std::string& v, int64_t index, const Node& n) const {
    auto u = uses_.find(v);
    if (u != uses_.end() && u->second > 1) throw Fail{n.describe() + ": its shape value '" + v + "' is shared"};
    if (constant(v)) return {v, index};
    auto p = producer_.find(v);
    if (p == producer_.end()) throw Fail{n.describe() + ": its shape '" + v + "' does not come from a constant"};
    const Node& src = g_.nodes[size_t(p->second)];
    if (src.op_type == "Cast" || src.op_type == "Identity") return trace_element(src.inputs[0], index, n);
    if (src.op_type == "Concat") {
      int64_t off = 0;
      for (const auto& in : src.inputs) {
        const Shape& s = shape(in);
        const int64_t len = s.empty() ? 1 : s[0];
        if (index < off + len) return trace_element(in, index - off, n);
        off += len;
      }
    }
    throw Fail{n.describe() + ": its target shape element " + std::to_string(index) +
               " comes from a " + src.op_type + " node, not a constant"};
  }

  // Whether the values of Shape(x) only serve dims other than `axis`.
  bool shape_use_ok(const std::string& v, int axis, int depth = 0) const {
    auto c = consumers_.find(v);
    if (outputs_.count(v) || depth > 8) return false;
    if (c == consumers_.end()) return true;
    for (int ni : c->second) {
      const Node& n = g_.nodes[size_t(ni)];
      if (n.op_type == "Cast" || n.op_type == "Identity") {
        if (!shape_use_ok(n.outputs[0], axis, depth + 1)) return false;
      } else if (n.op_type == "Slice") {
        std::vector<int64_t> starts, ends, axes, steps;
        try {
          if (opset_ < 10) {
            starts = n.attr_ints("starts"), ends = n.attr_ints("ends"), axes = n.attr_ints("axes");
          } else {
            starts = const_ints(n.inputs.at(1), n), ends = const_ints(n.inputs.at(2), n);
            if (n.inputs.size() > 3 && !n.inputs[3].empty()) axes = const_ints(n.inputs[3], n);
            if (n.inputs.size() > 4 && !n.inputs[4].empty()) steps = const_ints(n.inputs[4], n);
          }
        } catch (const Fail&) {
          return false;
        }
        if (starts.size() != 1 || ends.size() != 1 || (!axes.empty() && axes[0] != 0) ||
            (!steps.empty() && steps[0] != 1))
          return false;
        const int64_t rank = int64_t(shape(v).empty() ? 0 : shape(v)[0]);
        int64_t b = starts[0] < 0 ? starts[0] + rank : starts[0], e = ends[0] < 0 ? ends[0] + rank : ends[0];
        e = std::min(e, rank);
        if (b <= axis && axis < e) return false;
      } else if (n.op_type == "Gather") {
        if (n.attr_int("axis", 0) != 0) return false;
        try {
          for (int64_t i : const_ints(n.inputs.at(1), n))
            if (i == axis || i + int64_t(shape(v).empty() ? 0 : shape(v)[0]) == axis) return false;
        } catch (const Fail&) {
          return false;
        }
      } else {
        return false;
      }
    }
    return true;
  }

  // The channel axis `from` has in the node's output, for rank-preserving and
  // broadcasting nodes.
  int out_axis(const Node& n, int from) const {
    const Space& s = cg_.spaces[size_t(from)];
    const size_t r = shape(n.outputs[0]).size();
    if (s.value == n.outputs[0]) return s.axis;
    return s.axis + int(r) - int(shape(s.value).size());
  }

  void unused_extra_outputs(const Node& n) const {
    for (size_t k = 1; k < n.outputs.size(); ++k)
      if (!n.outputs[k].empty() && (consumers_.count(n.outputs[k]) || outputs_.count(n.outputs[k])))
        throw Fail{n.describe() + ": its output '" + n.outputs[k] + "' is used"};
  }

  Plan rule(int ni, int from) {
    const Node& n = g_.nodes[size_t(ni)];
    const std::string& op = n.op_type;
    Plan p;
    if (!n.domain.empty()) throw Fail{n.describe() + " (domain " + n.domain + ") is not understood"};
    if (op == "Conv" || op == "ConvTranspose") {
      const Tensor& w = own_constant(n, n.inputs.at(1), "weight");
      const Shape& xs = shape(n.inputs[0]);
      const Shape& ys = shape(n.outputs.at(0));
      if (w.rank() < 3 || xs.size() != size_t(w.rank()) || ys.size() != xs.size())
        throw Fail{n.describe() + ": unexpected ranks"};
      const int64_t group = n.attr_int("group", 1);
      const int64_t cin = xs[1], cout = ys[1];
      const int x = p.sp(n.inputs[0], 1), y = p.sp(n.outputs[0], 1);
      const bool tr = op == "ConvTranspose";
      int64_t k = 1;
      for (int d = 2; d < w.rank(); ++d) k *= w.shape()[size_t(d)];
      p.has_mac = true;
      p.mac = {ni, 0, cin, cout, group, x, y, false, tr};
      p.mac.per = tr ? prod(xs, 2, xs.size()) * k : prod(ys, 2, ys.size()) * k;
      const bool has_b = n.inputs.size() > 2 && !n.inputs[2].empty();
      if (has_b) own_constant(n, n.inputs[2], "bias");
      if (group == 1) {
        p.member(n.inputs[1], tr ? 0 : 1, x, Member::consume);
        p.member(n.inputs[1], tr ? 1 : 0, y, Member::produce);
      } else if (group == cin && cout == cin) {
        p.couple(x, y, cin);
        p.member(n.inputs[1], 0, y, Member::produce, 0, true);
        p.depthwise_space = y;
        p.mac.depthwise = true;
      } else {
        throw Fail{n.describe() + ": grouped convolution (group " + std::to_string(group) + " of " +
                   std::to_string(cin) + " channels)"};
      }
      if (has_b) p.member(n.inputs[2], 0, y, Member::param);
      if (tr && n.has_attr("output_shape") && n.attr_ints("output_shape").size() > xs.size() - 2)
        throw Fail{n.describe() + ": output_shape names the channels"};
      return p;
    }
    if (op == "Gemm" || op == "MatMul") {
      const Shape& as = shape(n.inputs.at(0));
      const Shape& ys = shape(n.outputs.at(0));
      if (!constant(n.inputs.at(1)) && from >= 0 && cg_.spaces[size_t(from)].value == n.inputs[1])
        throw Fail{n.describe() + ": a product of two activations"};
      const Tensor& w = own_constant(n, n.inputs.at(1), "weight");
      if (w.rank() != 2 || as.size() < 2 || (op == "Gemm" && as.size() != 2)) throw Fail{n.describe() + ": unexpected ranks"};
      if (op == "Gemm" && n.attr_int("transA", 0)) throw Fail{n.describe() + ": transA"};
      const bool tb = op == "Gemm" && n.attr_int("transB", 0);
      const int a = p.sp(n.inputs[0], int(as.size()) - 1), y = p.sp(n.outputs[0], int(ys.size()) - 1);
      p.member(n.inputs[1], tb ? 1 : 0, a, Member::consume);
      p.member(n.inputs[1], tb ? 0 : 1, y, Member::produce);
      if (op == "Gemm" && n.inputs.size() > 2 && !n.inputs[2].empty()) {
        const Tensor& c = own_constant(n, n.inputs[2], "bias");
        if (c.rank() >= 1 && c.shape().back() == ys.back() && ys.back() > 1) p.member(n.inputs[2], c.rank() - 1, y, Member::param);
        else if (c.numel() != 1) throw Fail{n.describe() + ": bias of shape " + c.describe()};
      }
      p.has_mac = true;
      p.mac = {ni, prod(as, 0, as.size() - 1), as.back(), ys.back(), 1, a, y, false, false};
      return p;
    }
    if (op == "BatchNormalization" || op == "InstanceNormalization") {
      unused_extra_outputs(n);
      if (out_axis(n, from) != 1) throw Fail{n.describe() + ": normalizes another axis than the channels"};
      const int x = p.sp(n.inputs.at(0), 1), y = p.sp(n.outputs.at(0), 1);
      p.couple(x, y, shape(n.inputs[0])[1]);
      for (size_t k = 1; k < n.inputs.size(); ++k) {
        const Tensor& t = own_constant(n, n.inputs[k], "parameter");
        if (t.rank() != 1) throw Fail{n.describe() + ": parameter '" + n.inputs[k] + "' is not 1-D"};
        p.member(n.inputs[k], 0, y, Member::param);
      }
      if (op == "BatchNormalization") p.bn_space = y;
      return p;
    }
    if (kUnary.count(op) || kPool.count(op)) {
      unused_extra_outputs(n);
      const int a = out_axis(n, from);
      if (kPool.count(op) && a != 1) throw Fail{n.describe() + ": pools over the channel axis"};
      if (shape(n.inputs[0]).size() != shape(n.outputs[0]).size()) throw Fail{n.describe() + ": changes the rank"};
      for (size_t k = 1; k < n.inputs.size(); ++k)
        if (!n.inputs[k].empty() && (!constant(n.inputs[k]) || constant(n.inputs[k])->numel() > 1))
          throw Fail{n.describe() + ": input '" + n.inputs[k] + "' is not a scalar constant"};
      const int x = p.sp(n.inputs[0], a), y = p.sp(n.outputs[0], a);
      p.couple(x, y, shape(n.inputs[0])[size_t(a)]);
      return p;
    }
    if (op == "Resize" || op == "Upsample") {
      const int a = out_axis(n, from);
      const Shape& xs = shape(n.inputs.at(0));
      const std::string scales = opset_ >= 11 && op == "Resize" ? (n.inputs.size() > 2 ? n.inputs[2] : "")
                                                                 : (n.inputs.size() > 1 ? n.inputs[1] : "");
      const std::string sizes = opset_ >= 11 && op == "Resize" && n.inputs.size() > 3 ? n.inputs[3] : "";
      if (n.has_attr("axes")) throw Fail{n.describe() + ": axes"};
      const int x = p.sp(n.inputs[0], a), y = p.sp(n.outputs[0], a);
      if (!scales.empty() && constant(scales) && constant(scales)->numel() > 0) {
        const auto s = const_doubles(scales, n);
        if (s.size() != xs.size() || s[size_t(a)] != 1.0) throw Fail{n.describe() + ": scales the channel axis"};
      } else if (!sizes.empty()) {
        own_constant(n, sizes, "sizes");
        p.fix_tensor.emplace_back(sizes, a);
        p.fix_space.push_back(y);
      } else if (op == "Upsample" && n.has_attr("scales")) {
        if (n.attr_floats("scales").at(size_t(a)) != 1.0f) throw Fail{n.describe() + ": scales the channel axis"};
      } else {
        throw Fail{n.describe() + ": neither constant scales nor sizes"};
      }
      p.couple(x, y, xs[size_t(a)]);
      return p;
    }
    if (op == "Pad") {
      const int a = out_axis(n, from);
      const size_t r = shape(n.inputs.at(0)).size();
      std::vector<int64_t> pads = opset_ < 11 ? n.attr_ints("pads") : const_ints(n.inputs.at(1), n);
      if (n.inputs.size() > 3 && !n.inputs[3].empty()) throw Fail{n.describe() + ": axes"};
      if (pads.size() != 2 * r || pads[size_t(a)] != 0 || pads[size_t(a) + r] != 0)
        throw Fail{n.describe() + ": pads the channel axis"};
      if (n.inputs.size() > 2 && !n.inputs[2].empty() && (!constant(n.inputs[2]) || constant(n.inputs[2])->numel() > 1))
        throw Fail{n.describe() + ": its pad value is not a scalar constant"};
      const int x = p.sp(n.inputs[0], a), y = p.sp(n.outputs[0], a);
      p.couple(x, y, shape(n.inputs[0])[size_t(a)]);
      return p;
    }
    if (kElementwise.count(op)) {
      const int a = out_axis(n, from);
      const Shape& ys = shape(n.outputs.at(0));
      const int64_t c = ys[size_t(a)];
      const int y = p.sp(n.outputs[0], a);
      for (const auto& in : n.inputs) {
        if (in.empty()) continue;
        const Shape& s = shape(in);
        const int pos = a - int(ys.size() - s.size());
        if (pos < 0 || (s[size_t(pos)] == 1 && (c != 1 || constant(in)))) {
          if (!constant(in) && op == "Where") throw Fail{n.describe() + ": Where"};
          continue;
        }
        if (s[size_t(pos)] != c) throw Fail{n.describe() + ": input '" + in + "' does not broadcast over the channels"};
        if (constant(in)) {
          own_constant(n, in, "operand");
          p.member(in, pos, y, Member::param);
        } else {
          p.couple(p.sp(in, pos), y, c);
        }
      }
      return p;
    }
    if (op == "Concat") {
      const int a = out_axis(n, from);
      const Shape& ys = shape(n.outputs.at(0));
      const int ca = norm_axis(n.attr_int("axis", 0), ys.size(), n);
      const int y = p.sp(n.outputs[0], a);
      int64_t off = 0;
      for (const auto& in : n.inputs) {
        const int64_t d = shape(in)[size_t(a)];
        if (constant(in)) {
          own_constant(n, in, "operand");
          p.member(in, a, y, Member::param, ca == a ? off : 0);
        } else {
          p.couple(p.sp(in, a), y, d, ca == a ? off : 0);
        }
        if (ca == a) off += d;
      }
      return p;
    }
    if (op == "Transpose") {
      const Space& s = cg_.spaces[size_t(from)];
      const size_t r = shape(n.inputs.at(0)).size();
      std::vector<int64_t> perm = n.attr_ints("perm");
      if (perm.empty())
        for (size_t i = 0; i < r; ++i) perm.push_back(int64_t(r - 1 - i));
      int ax = -1, ay = -1;
      if (s.value == n.inputs[0]) {
        ax = s.axis;
        for (size_t b = 0; b < perm.size(); ++b)
          if (perm[b] == ax) ay = int(b);
      } else {
        ay = s.axis;
        ax = int(perm.at(size_t(ay)));
      }
      if (ax < 0 || ay < 0) throw Fail{n.describe() + ": bad perm"};
      p.couple(p.sp(n.inputs[0], ax), p.sp(n.outputs[0], ay), shape(n.inputs[0])[size_t(ax)]);
      return p;
    }
    if (op == "Softmax" || op == "LogSoftmax") {
      const int a = out_axis(n, from);
      const size_t r = shape(n.outputs.at(0)).size();
      const int sa = norm_axis(n.attr_int("axis", opset_ < 13 ? 1 : -1), r, n);
      if (opset_ < 13 ? a >= sa : a == sa) throw Fail{n.describe() + ": normalizes over the channels"};
      const int x = p.sp(n.inputs[0], a), y = p.sp(n.outputs[0], a);
      p.couple(x, y, shape(n.inputs[0])[size_t(a)]);
      return p;
    }
    if (kReshape.count(op)) return reshape_rule(n, from);
    if (op == "Shape") {
      const Space& s = cg_.spaces[size_t(from)];
      if (n.has_attr("start") || n.has_attr("end")) throw Fail{n.describe() + ": start/end"};
      if (!shape_use_ok(n.outputs.at(0), s.axis))
        throw Fail{n.describe() + ": the channel count is used as a value"};
      p.sp(s.value, s.axis);
      return p;
    }
    throw Fail{n.describe() + " is not understood"};
  }

  Plan reshape_rule(const Node& n, int from) {
    Plan p;
    const Shape& xs = shape(n.inputs.at(0));
    const Shape& ys = shape(n.outputs.at(0));
    if (n.op_type == "Squeeze" && !n.has_attr("axes") && n.inputs.size() < 2)
      throw Fail{n.describe() + ": without axes (a channel count of 1 would vanish)"};
    const Space& s = cg_.spaces[size_t(from)];
    const bool from_x = s.value == n.inputs[0];
    // (a in x) -> (b in y): the prefix products agree and either the dim is the same
    // (direct) or y's dim merges x's channel with every dim after it (block).
    const Shape& src = from_x ? xs : ys;
    const Shape& dst = from_x ? ys : xs;
    const int sa = s.axis;
    const int64_t pre = prod(src, 0, size_t(sa)), c = src[size_t(sa)], suffix = prod(src, size_t(sa) + 1, src.size());
    int b = -1;
    int64_t block = 1;
    for (size_t d = 0; d < dst.size(); ++d) {
      if (prod(dst, 0, d) != pre) continue;
      if (dst[d] == c) { b = int(d); block = 1; break; }
      if (from_x && dst[d] == c * suffix && suffix > 1 && b < 0) b = int(d), block = suffix;
      if (!from_x && dst[d] > 1 && c % dst[d] == 0 && dst[d] * prod(dst, d + 1, dst.size()) == c && b < 0)
        b = int(d), block = c / dst[d];
    }
    if (b < 0) throw Fail{n.describe() + ": mixes the channel axis with others"};
    const int ax = from_x ? sa : b, ay = from_x ? b : sa;
    const int x = p.sp(n.inputs[0], ax), y = p.sp(n.outputs[0], ay);
    p.couples.push_back({x, 0, y, 0, xs[size_t(ax)], block});
    if (n.op_type == "Reshape") {
      const auto where = trace_element(n.inputs.at(1), ay, n);
      const int64_t v = const_ints(where.first, n).at(size_t(where.second));
      if (v != -1 && v != 0) {
        if (v != ys[size_t(ay)]) throw Fail{n.describe() + ": target shape disagrees with the inferred one"};
        p.fix_tensor.emplace_back(where.first, where.second);
        p.fix_space.push_back(y);
      } else if (v == 0 && block != 1) {
        throw Fail{n.describe() + ": a 0 in the target shape at a merged axis"};
      }
    }
    return p;
  }

  int space(const std::string& v, int axis) {
    auto it = cg_.space_of.find(v);
    if (it != cg_.space_of.end()) return it->second;
    const Shape& s = shape(v);
    Space sp;
    sp.value = v;
    sp.axis = axis;
    sp.size = s.at(size_t(axis));
    sp.base = cg_.slots;
    cg_.slots += sp.size;
    for (int64_t i = 0; i < sp.size; ++i) cg_.parent.push_back(sp.base + i);
    cg_.spaces.push_back(sp);
    const int id = int(cg_.spaces.size() - 1);
    cg_.space_of[v] = id;
    work_.push_back(id);
    return id;
  }

  void visit(int ni, int from) {
    if (from >= 0) {
      auto f = failed_.find(ni);
      if (f != failed_.end()) return freeze(from, f->second);
      auto e = explained_.find(ni);
      if (e != explained_.end()) {
        if (!e->second.count(cg_.spaces[size_t(from)].value))
          freeze(from, g_.nodes[size_t(ni)].describe() + " reads it as something else than channels");
        return;
      }
    } else if (failed_.count(ni) || explained_.count(ni)) {
      return;
    }
    Plan p;
    try {
      p = rule(ni, from);
      // Axis conflicts with spaces already made.
      for (const auto& [v, axis] : p.spaces) {
        if (constant(v)) throw Fail{"'" + v + "' is a constant"};
        auto it = cg_.space_of.find(v);
        if (it != cg_.space_of.end() && cg_.spaces[size_t(it->second)].axis != axis)
          throw Fail{g_.nodes[size_t(ni)].describe() + ": '" + v + "' has channels on two axes"};
        const Shape& s = shape(v);
        if (axis < 0 || size_t(axis) >= s.size()) throw Fail{g_.nodes[size_t(ni)].describe() + ": axis out of range"};
      }
      for (const auto& c : p.couples) {
        const int64_t na = shape(p.spaces[size_t(c.a)].first)[size_t(p.spaces[size_t(c.a)].second)];
        const int64_t nb = shape(p.spaces[size_t(c.b)].first)[size_t(p.spaces[size_t(c.b)].second)];
        if (c.off_a + c.count > na || c.off_b + c.count * c.block > nb)
          throw Fail{g_.nodes[size_t(ni)].describe() + ": channel counts disagree"};
      }
      for (const auto& m : p.members) {
        const Tensor* t = constant(m.tensor);
        const int64_t ns = shape(p.spaces[size_t(m.space)].first)[size_t(p.spaces[size_t(m.space)].second)];
        if (!t || m.axis >= t->rank() || m.offset + t->shape()[size_t(m.axis)] > ns)
          throw Fail{g_.nodes[size_t(ni)].describe() + ": '" + m.tensor + "' does not match the channels"};
      }
    } catch (const Fail& f) {
      failed_[ni] = f.reason;
      if (from >= 0) freeze(from, f.reason);
      else cg_.seed_failures.push_back(f.reason);
      return;
    } catch (const Error& e) {  // a malformed attribute: that node is not understood
      failed_[ni] = e.what();
      if (from >= 0) freeze(from, e.what());
      return;
    }
    std::vector<int> ids;
    auto& names = explained_[ni];
    for (const auto& [v, axis] : p.spaces) {
      ids.push_back(space(v, axis));
      names.insert(v);
    }
    if (from >= 0 && !names.count(cg_.spaces[size_t(from)].value))
      freeze(from, g_.nodes[size_t(ni)].describe() + " reads it as something else than channels");
    for (const auto& c : p.couples) {
      const Space& a = cg_.spaces[size_t(ids[size_t(c.a)])];
      const Space& b = cg_.spaces[size_t(ids[size_t(c.b)])];
      for (int64_t i = 0; i < c.count; ++i)
        for (int64_t k = 0; k < c.block; ++k)
          cg_.unite(a.base + c.off_a + i, b.base + c.off_b + i * c.block + k);
    }
    for (const auto& m : p.members)
      cg_.members.push_back({m.tensor, m.axis, ids[size_t(m.space)], m.offset, m.kind, ni, m.depthwise});
    for (size_t k = 0; k < p.fix_tensor.size(); ++k)
      cg_.shape_fixes.push_back({p.fix_tensor[k].first, p.fix_tensor[k].second, ids[size_t(p.fix_space[k])]});
    if (p.depthwise_space >= 0) cg_.depthwise_fixes.emplace_back(ni, ids[size_t(p.depthwise_space)]);
    if (p.bn_space >= 0) cg_.bns.push_back({ni, ids[size_t(p.bn_space)]});
    if (p.has_mac) {
      MacNode m = p.mac;
      m.in_space = ids[size_t(m.in_space)];
      m.out_space = ids[size_t(m.out_space)];
      cg_.macs.push_back(m);
    }
  }
};

}  // namespace

ChannelGraph build_channel_graph(const Graph& g, const std::map<std::string, Shape>& shapes, int64_t opset) {
  return Builder(g, shapes, opset).build();
}

}  // namespace slim::prune::detail
