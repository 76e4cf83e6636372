// QDQ export in ONNX Runtime's layout: a quantized activation t gets QuantizeLinear ->
// DequantizeLinear right after its producer and every reader reads the dequantized value;
// weights are stored as int8 initializers behind a DequantizeLinear (per channel: axis),
// biases of Conv/Gemm as int32 with scale s_x·s_w. Ops that only move or select values
// (Concat, MaxPool, Reshape, ...) share one scale across their inputs and outputs, so
// the 8-bit values pass through them unchanged. With asymmetric activations a Relu or
// Clip after a quantized node is dropped: the QuantizeLinear of its output range clamps
// the same values.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "quant/quant_internal.h"
#include "slim/core/error.h"
#include "slim/onnx/importer.h"

namespace slim::quant::detail {

Attribute int_attr(int64_t v) {
  Attribute a;
  a.kind = Attribute::Kind::i;
  a.i = v;
  return a;
}

namespace {

Attribute float_attr(float v) {
  Attribute a;
  a.kind = Attribute::Kind::f;
  a.f = v;
  return a;
}

struct UnionFind {
  std::map<std::string, std::string> parent;
  std::string find(const std::string& x) {
    auto it = parent.find(x);
    if (it == parent.end() || it->second == x) return x;
    return it->second = find(it->second);
  }
  void join(const std::string& a, const std::string& b) {
    const std::string ra = find(a), rb = find(b);
    if (ra != rb) parent[std::max(ra, rb)] = std::min(ra, rb);
  }
};

// A Relu, or a Clip with constant bounds around 0: the range it clamps to, when the
// QuantizeLinear of its output can do the clamping.
std::optional<Range> clamp_range(const Graph& g, const GraphIndex& index, const Node& n) {
  const double inf = std::numeric_limits<double>::infinity();
  if (n.op_type == "Relu") return Range{0, inf};
  if (n.op_type != "Clip") return std::nullopt;
  Range r{-inf, inf};
  for (size_t i = 1; i < n.inputs.size() && i < 3; ++i) {
    if (n.inputs[i].empty()) continue;
    const Tensor* t = index.constant(g, n.inputs[i]);
    if (!t || t->dtype() != DType::f32 || t->numel() != 1) return std::nullopt;
    (i == 1 ? r.lo : r.hi) = t->contiguous().data<float>()[0];
  }
  if (r.lo > 0 || r.hi < 0) return std::nullopt;
  return r;
}

const std::set<std::string> kBoundedOps = {"Softmax", "Sigmoid", "HardSigmoid", "Tanh"};

// Biases stay below 2^30 int32 steps, half the range, leaving room for a bias correction
// made after the check and for the integer kernels' sums.
constexpr double kBiasLimit = double(1 << 30);

struct Plan {
  std::set<std::string> quantized;  // activations that get a Q/DQ pair
  UnionFind groups;                 // of activations that share one scale
};

// What the mean of x times the weight's rounding error adds to each output channel.
std::vector<double> bias_shift(const Node& n, const Tensor& w, const Tensor& wq,
                               const std::vector<double>& mean) {
  const float* a = w.data<float>();
  const float* b = wq.data<float>();
  if (n.op_type == "Conv") {
    const int64_t out = w.shape()[0], cin = w.shape()[1], k = w.numel() / out / cin;
    const int64_t groups = n.attr_int("group", 1);
    if (groups <= 0 || out % groups || int64_t(mean.size()) != cin * groups) return {};
    std::vector<double> d(size_t(out), 0.0);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t c = 0; c < cin; ++c) {
        const double m = mean[size_t((o / (out / groups)) * cin + c)];
        for (int64_t i = 0; i < k; ++i) {
          const int64_t e = (o * cin + c) * k + i;
          d[size_t(o)] += (double(b[e]) - double(a[e])) * m;
        }
      }
    return d;
  }
  const bool trans = n.op_type == "Gemm" && n.attr_int("transB", 0);
  const int64_t rows = w.shape()[0], cols = w.shape()[1];
  const int64_t k = trans ? cols : rows, out = trans ? rows : cols;
  if (int64_t(mean.size()) != k) return {};
  std::vector<double> d(size_t(out), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t e = r * cols + c;
      d[size_t(trans ? r : c)] += (double(b[e]) - double(a[e])) * mean[size_t(trans ? c : r)];
    }
  const double alpha = n.op_type == "Gemm" ? n.attr_float("alpha", 1.0f) : 1.0;
  for (double& v : d) v *= alpha;
  return d;
}

Tensor minus(const Tensor* base, const std::vector<double>& d, double divide = 1.0) {
  Tensor out(DType::f32, {int64_t(d.size())});
  float* o = out.data<float>();
  const Tensor b = base ? base->contiguous() : Tensor();
  for (size_t i = 0; i < d.size(); ++i)
    o[i] = float((base ? double(b.data<float>()[i]) : 0.0) - d[i] / divide);
  return out;
}

bool is_vector(const Tensor* t, int64_t n) {
  return t && t->dtype() == DType::f32 && t->rank() >= 1 && t->numel() == n &&
         t->shape().back() == n;
}

}  // namespace

void insert_qdq(Model& model, const StatsMap& stats, const QuantizeOptions& o,
                QuantizeReport& rep) {
  Graph& g = model.graph;
  {  // topological order, so each value's Q/DQ pair can follow its producer
    const std::vector<size_t> order = validate_graph(g, model.path);
    std::vector<Node> sorted;
    for (size_t i : order) sorted.push_back(std::move(g.nodes[i]));
    g.nodes = std::move(sorted);
  }
  NameSet names(g);
  const auto& ops = o.op_types.empty() ? default_op_types() : o.op_types;
  auto selected = [&](const Node& n) {
    return n.domain.empty() && ops.count(n.op_type) && !o.exclude_nodes.count(n.name) &&
           !o.int4_nodes.count(n.name);
  };
  auto usable = [&](const std::string& t) {
    auto it = stats.find(t);
    return it != stats.end() && it->second.count > 0;
  };

  // The activations to quantize: what selected nodes read and write, unless it only
  // leaves the graph.
  auto plan_groups = [&](const GraphIndex& index) {
    Plan plan;
    for (const auto& n : g.nodes) {
      if (!selected(n)) continue;
      std::vector<std::string> members;
      for (size_t i : activation_inputs(g, index, n))
        if (usable(n.inputs[i])) members.push_back(n.inputs[i]);
      for (const auto& out : n.outputs)
        if (!out.empty() && usable(out) && index.consumers.count(out)) members.push_back(out);
      plan.quantized.insert(members.begin(), members.end());
      if (shares_input_scale(n.op_type))
        for (size_t k = 1; k < members.size(); ++k) plan.groups.join(members[0], members[k]);
    }
    return plan;
  };

  // Relu / Clip whose clamp the QuantizeLinear of their output does: the node that
  // feeds them writes their output instead. That holds while every tensor sharing the
  // output's scale stays within the clamp's range; a removal that breaks it is undone.
  std::set<std::string> kept_activations;
  Plan plan;
  for (;;) {
    const Graph before = o.activations.symmetric ? Graph() : g;
    std::map<std::string, std::pair<std::string, Range>> removed;  // node -> its output, range
    if (!o.activations.symmetric) {
      const GraphIndex index(g);
      std::vector<bool> dropped(g.nodes.size(), false);
      for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& r = g.nodes[i];
        if (!selected(r) || kept_activations.count(r.name) || r.inputs.empty() ||
            r.outputs.size() != 1)
          continue;
        const auto range = clamp_range(g, index, r);
        if (!range) continue;
        const std::string& t = r.inputs[0];
        const std::string& y = r.outputs[0];
        auto p = index.producer.find(t);
        if (p == index.producer.end() || !selected(g.nodes[p->second]) || dropped[p->second])
          continue;
        if (index.consumers.at(t).size() != 1 || index.graph_outputs.count(t) ||
            index.captured.count(t))
          continue;
        if (index.graph_outputs.count(y) || index.captured.count(y) || !usable(y) ||
            !index.consumers.count(y))
          continue;
        for (auto& out : g.nodes[p->second].outputs)
          if (out == t) out = y;
        dropped[i] = true;
        removed[r.name] = {y, *range};
      }
      std::vector<Node> kept;
      for (size_t i = 0; i < g.nodes.size(); ++i)
        if (!dropped[i]) kept.push_back(std::move(g.nodes[i]));
      g.nodes = std::move(kept);
    }
    plan = plan_groups(GraphIndex(g));
    bool undo = false;
    for (const auto& [node, out] : removed)
      for (const auto& t : plan.quantized)
        if (plan.groups.find(t) == plan.groups.find(out.first) &&
            (stats.at(t).min < out.second.lo || stats.at(t).max > out.second.hi)) {
          kept_activations.insert(node);
          undo = true;
        }
    if (!undo) {
      rep.activations_removed = int64_t(removed.size());
      break;
    }
    g = before;
  }
  const GraphIndex index(g);
  const std::set<std::string>& quantized = plan.quantized;
  UnionFind& groups = plan.groups;

  // One range per group: the members' statistics merged.
  std::map<std::string, TensorStats> merged;
  std::map<std::string, std::vector<std::string>> members_of;
  for (const auto& t : quantized) {
    TensorStats s = stats.at(t);
    s.channels = {};  // a group's members may have different channel counts
    merged[groups.find(t)].merge(s);
    members_of[groups.find(t)].push_back(t);
  }
  const DType act = o.activations.dtype;
  std::map<std::string, std::pair<std::string, std::string>>
      param_names;  // group -> scale, zero point
  std::map<std::string, QuantParams> params;
  for (const auto& [root, s] : merged) {
    QuantizeReport::ActivationRange info;
    info.names = members_of[root];
    info.min = s.min;
    info.max = s.max;
    // Outputs of bounded activations (attention weights, gates) keep their whole range:
    // the values near the bound carry the decision, and clipping them costs more than
    // the finer steps gain.
    bool bounded = false;
    for (const auto& t : info.names) {
      auto p = index.producer.find(t);
      bounded |= p != index.producer.end() && kBoundedOps.count(g.nodes[p->second].op_type);
    }
    info.range = bounded ? Range{s.min, s.max} : calibrate(s, o.calibrator, o.activations);
    info.params = quantization_params(info.range, o.activations);
    params[root] = info.params;
    const std::string scale = names.fresh(root + "_scale"), zp = names.fresh(root + "_zero_point");
    g.initializers[scale] = Tensor::scalar<float>(info.params.scale);
    g.initializers[zp] = act == DType::u8 ? Tensor::scalar<uint8_t>(uint8_t(info.params.zero_point))
                                          : Tensor::scalar<int8_t>(int8_t(info.params.zero_point));
    param_names[root] = {scale, zp};
    rep.ranges.push_back(std::move(info));
  }
  rep.activations_quantized = int64_t(quantized.size());

  std::vector<Node> front;  // weight and bias DequantizeLinear nodes, then graph inputs' pairs
  std::map<std::string, std::string> dequantized;  // activation -> its DequantizeLinear output
  auto qdq_pair = [&](const std::string& t, std::vector<Node>& out) {
    const auto& [scale, zp] = param_names.at(groups.find(t));
    const std::string q = names.fresh(t + "_QuantizeLinear_Output"),
                      dq = names.fresh(t + "_DequantizeLinear_Output");
    out.push_back(
        Node{names.fresh(t + "_QuantizeLinear"), "QuantizeLinear", "", {t, scale, zp}, {q}, {}});
    out.push_back(Node{
        names.fresh(t + "_DequantizeLinear"), "DequantizeLinear", "", {q, scale, zp}, {dq}, {}});
    dequantized[t] = dq;
  };
  for (const auto& in : g.inputs)
    if (quantized.count(in.name)) qdq_pair(in.name, front);

  // Weights (and biases, after bias correction) of the selected weighted nodes.
  struct WeightEntry {
    std::string output, scale;  // the DequantizeLinear's output, the scale initializer
    QuantizedWeight q;
  };
  std::map<std::pair<std::string, int>, WeightEntry> weights;
  std::set<std::string> replaced;  // float initializers the quantized ones stand for
  std::set<std::string> weighted;  // nodes whose weight was quantized
  for (auto& n : g.nodes) {
    if (!selected(n) || weight_input(g, index, n) < 0) continue;
    const std::string wname = n.inputs[1];
    const int axis = o.per_channel ? weight_channel_axis(g, n) : -1;
    WeightEntry& entry = weights[{wname, axis}];
    const Tensor& w = g.initializers.at(wname);
    if (entry.output.empty()) {
      entry.q = quantize_weight(w, axis, o.reduce_range ? 64 : 127);
      const std::string qn = names.fresh(wname + "_quantized"),
                        zn = names.fresh(wname + "_zero_point");
      entry.scale = names.fresh(wname + "_scale");
      g.initializers[qn] = entry.q.values;
      const int64_t c = int64_t(entry.q.scales.size());
      g.initializers[zn] = axis >= 0 ? Tensor(DType::i8, {c}) : Tensor::scalar<int8_t>(0);
      entry.output = names.fresh(wname + "_DequantizeLinear_Output");
      Node dq{names.fresh(wname + "_DequantizeLinear"),
              "DequantizeLinear",
              "",
              {qn, entry.scale, zn},
              {entry.output},
              {}};
      if (axis >= 0) dq.attrs["axis"] = int_attr(axis);
      front.push_back(std::move(dq));
      rep.weights_quantized++;
      rep.weight_bytes_float += int64_t(w.nbytes());
      rep.weight_bytes_quantized += int64_t(entry.q.values.nbytes());
    }
    QuantizedWeight& q = entry.q;
    n.inputs[1] = entry.output;
    replaced.insert(wname);
    weighted.insert(n.name);

    // The bias becomes int32 at scale s_x·s_w when the input is quantized. A channel whose
    // weights are all near 0 has a tiny s_w, and b / (s_x·s_w) may not fit: its s_w grows
    // until the bias fits with room to spare (ONNX Runtime's quantizer does the same).
    const int64_t channels =
        w.shape()[size_t(n.op_type == "Gemm"            ? (n.attr_int("transB", 0) ? 0 : 1)
                         : n.op_type == "ConvTranspose" ? 1
                                                        : 0)];
    // The bias (a constant [channels]) when it will be stored as int32, else nullptr.
    auto int32_bias = [&]() -> const Tensor* {
      const Tensor* b = n.inputs.size() > 2 ? index.constant(g, n.inputs[2]) : nullptr;
      const bool ok = n.op_type != "MatMul" && quantized.count(n.inputs[0]) && b &&
                      b->dtype() == DType::f32 && b->rank() == 1 && b->numel() == channels &&
                      (n.op_type != "ConvTranspose" || n.attr_int("group", 1) == 1) &&
                      (n.op_type != "Gemm" || n.attr_float("beta", 1.0f) == 1.0f);
      return ok ? b : nullptr;
    };
    const float sx =
        quantized.count(n.inputs[0]) ? params.at(groups.find(n.inputs[0])).scale : 1.0f;
    if (const Tensor* bias = int32_bias()) {
      const Tensor b = bias->contiguous();
      for (int64_t c = 0; c < channels; ++c)
        widen_weight_scale(w, q, q.scales.size() == 1 ? 0 : c,
                           float(std::fabs(b.data<float>()[c]) / (double(sx) * kBiasLimit)));
    }
    g.initializers[entry.scale] =
        axis >= 0 ? Tensor::from_vector<float>({int64_t(q.scales.size())}, q.scales)
                  : Tensor::scalar<float>(q.scales[0]);

    if (o.bias_correction && n.op_type != "ConvTranspose") {
      auto st = stats.find(n.inputs[0]);
      if (st != stats.end() && st->second.channels.count_per_channel > 0) {
        const ChannelStats& cs = st->second.channels;
        std::vector<double> mean(cs.sum.size());
        for (size_t c = 0; c < mean.size(); ++c) mean[c] = cs.sum[c] / double(cs.count_per_channel);
        const std::vector<double> d = bias_shift(n, w.contiguous(), dequantize_weight(q), mean);
        const int64_t out = int64_t(d.size());
        const Tensor* bias = n.inputs.size() > 2 ? index.constant(g, n.inputs[2]) : nullptr;
        const bool no_bias = n.inputs.size() < 3 || n.inputs[2].empty();
        bool done = false;
        if (!d.empty() && n.op_type == "Conv" && (no_bias || is_vector(bias, out))) {
          n.inputs.resize(3);
          const std::string name =
              names.fresh((no_bias ? n.name + "_bias" : n.inputs[2]) + "_corrected");
          g.initializers[name] = minus(bias, d);
          n.inputs[2] = name;
          done = true;
        } else if (!d.empty() && n.op_type == "Gemm" && (no_bias || is_vector(bias, out))) {
          const double beta = no_bias ? 1.0 : n.attr_float("beta", 1.0f);
          if (beta != 0) {
            n.inputs.resize(3);
            const std::string name =
                names.fresh((no_bias ? n.name + "_bias" : n.inputs[2]) + "_corrected");
            g.initializers[name] = minus(bias, d, beta);
            n.inputs[2] = name;
            if (no_bias) n.attrs["beta"] = float_attr(1.0f);
            done = true;
          }
        } else if (!d.empty() && n.op_type == "MatMul" && index.consumers.count(n.outputs[0]) &&
                   index.consumers.at(n.outputs[0]).size() == 1 &&
                   !index.graph_outputs.count(n.outputs[0])) {
          Node& add = g.nodes[index.consumers.at(n.outputs[0])[0]];
          if (add.op_type == "Add" && add.domain.empty() && add.inputs.size() == 2) {
            const int c = is_vector(index.constant(g, add.inputs[1]), out)   ? 1
                          : is_vector(index.constant(g, add.inputs[0]), out) ? 0
                                                                             : -1;
            if (c >= 0) {
              const Tensor& old = g.initializers.at(add.inputs[size_t(c)]);
              Tensor corrected = minus(&old, d).reshape(old.shape());
              const std::string name = names.fresh(add.inputs[size_t(c)] + "_corrected");
              g.initializers[name] = corrected;
              add.inputs[size_t(c)] = name;
              done = true;
            }
          }
        }
        rep.bias_corrected += done;
      }
    }

    const Tensor* bias = int32_bias();  // bias correction may have replaced or added it
    if (!bias) continue;
    const Tensor b = bias->contiguous();
    Tensor qb(DType::i32, {channels});
    std::vector<float> scales(static_cast<size_t>(channels));
    for (int64_t c = 0; c < channels; ++c) {
      const float s = sx * q.scales[q.scales.size() == 1 ? 0 : size_t(c)];
      scales[size_t(c)] = s;
      const double v = std::nearbyint(b.data<float>()[c] / s);
      qb.data<int32_t>()[c] = int32_t(std::clamp(v, double(std::numeric_limits<int32_t>::min()),
                                                 double(std::numeric_limits<int32_t>::max())));
    }
    const std::string bname = n.inputs[2];
    const std::string qn = names.fresh(bname + "_quantized"),
                      sn = names.fresh(bname + "_quantized_scale"),
                      zn = names.fresh(bname + "_quantized_zero_point"),
                      out = names.fresh(bname + "_DequantizeLinear_Output");
    const bool per_channel = q.scales.size() > 1;
    g.initializers[qn] = qb;
    g.initializers[sn] = per_channel ? Tensor::from_vector<float>({channels}, scales)
                                     : Tensor::scalar<float>(scales[0]);
    g.initializers[zn] = per_channel ? Tensor(DType::i32, {channels}) : Tensor::scalar<int32_t>(0);
    Node dq{
        names.fresh(bname + "_DequantizeLinear"), "DequantizeLinear", "", {qn, sn, zn}, {out}, {}};
    if (per_channel) dq.attrs["axis"] = int_attr(0);
    front.push_back(std::move(dq));
    n.inputs[2] = out;
    replaced.insert(bname);
    rep.biases_quantized++;
  }

  // The nodes in order: each reads the dequantized form of quantized activations, and
  // Q/DQ pairs follow the node that produces their value.
  std::vector<Node> nodes = std::move(front);
  for (auto& n : g.nodes) {
    bool touched = weighted.count(n.name) != 0;
    for (auto& in : n.inputs) {
      auto it = dequantized.find(in);
      if (it != dequantized.end()) {
        in = it->second;
        touched = true;
      }
    }
    std::vector<Node> after;
    for (const auto& out : n.outputs)
      if (quantized.count(out)) {
        qdq_pair(out, after);
        touched = true;
      }
    if (touched && selected(n)) rep.nodes_quantized[n.op_type]++;
    nodes.push_back(std::move(n));
    for (auto& a : after) nodes.push_back(std::move(a));
  }
  g.nodes = std::move(nodes);
  // Float initializers that only the quantized weights and biases read go.
  erase_unread_initializers(g, index, replaced);
}

}  // namespace slim::quant::detail
