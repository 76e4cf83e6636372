// SmoothQuant (Xiao et al. 2023): a matrix product's input channels with outliers are
// divided by s_j and the weight rows multiplied by it, which leaves x·W unchanged and
// moves the range problem from the activations (quantized per tensor) to the weights
// (per channel). The division folds into the producer of x where it is a normalization's
// affine part; elsewhere a Mul by 1/s is inserted.
#include <algorithm>
#include <cmath>

#include "quant/quant_internal.h"
#include "slim/core/error.h"

namespace slim::quant::detail {

namespace {

// A constant of K values that broadcasts along the last axis only ([K], [1, K], ...).
bool is_channel_vector(const Tensor* t, int64_t k) {
  if (!t || t->dtype() != DType::f32 || t->rank() < 1 || t->shape().back() != k) return false;
  return t->numel() == k;
}

Tensor divided(const Tensor& t, const std::vector<double>& s) {
  Tensor out = t.clone();
  float* v = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i)
    v[i] = float(double(v[i]) / s[size_t(i % int64_t(s.size()))]);
  return out;
}

// Channel j's |x| at `percentile` from its histogram (its max at 100).
double channel_max(const ChannelStats& cs, size_t j, double percentile) {
  const double absmax = cs.absmax[j];
  if (percentile >= 100 || j >= cs.hist.size() || cs.hist[j].empty()) return absmax;
  const std::vector<double> a = cs.hist[j].abs_counts();
  double total = 0;
  for (double v : a) total += v;
  const double target = percentile / 100.0 * total;
  double cum = 0;
  size_t k = 0;
  for (; k + 1 < a.size(); ++k) {
    cum += a[k];
    if (cum >= target) break;
  }
  return std::min(absmax, double(k + 1) * cs.hist[j].bin_width());
}

}  // namespace

int64_t smooth_quant(Model& model, const StatsMap& stats, const QuantizeOptions& options) {
  const double alpha = options.smoothquant_alpha;
  Graph& g = model.graph;
  const GraphIndex index(g);
  NameSet names(g);
  const auto& ops = options.op_types.empty() ? default_op_types() : options.op_types;
  // Matrix products by the activation they read.
  std::map<std::string, std::vector<size_t>> groups;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if ((n.op_type != "MatMul" && n.op_type != "Gemm") || !n.domain.empty() ||
        !ops.count(n.op_type) || options.exclude_nodes.count(n.name) ||
        weight_input(g, index, n) < 0)
      continue;
    if (n.op_type == "Gemm" && n.attr_int("transA", 0)) continue;
    if (g.initializers.at(n.inputs[1]).rank() != 2) continue;
    auto st = stats.find(n.inputs[0]);
    if (st == stats.end() || st->second.channels.absmax.empty()) continue;
    groups[n.inputs[0]].push_back(i);
  }
  int64_t smoothed = 0;
  std::vector<std::pair<size_t, Node>> inserted;  // (before node index, node)
  for (const auto& [x, members] : groups) {
    const ChannelStats& cs = stats.at(x).channels;
    const int64_t k = int64_t(cs.absmax.size());
    bool fits = true;
    for (size_t i : members) {
      const Node& n = g.nodes[i];
      const Tensor& w = g.initializers.at(n.inputs[1]);
      const bool trans = n.op_type == "Gemm" && n.attr_int("transB", 0);
      fits &= w.shape()[trans ? 1 : 0] == k;
    }
    if (!fits) continue;
    std::vector<double> wmax(size_t(k), 0.0);
    for (size_t i : members) {
      const Node& n = g.nodes[i];
      const Tensor w = g.initializers.at(n.inputs[1]).contiguous();
      const bool trans = n.op_type == "Gemm" && n.attr_int("transB", 0);
      const int64_t rows = w.shape()[0], cols = w.shape()[1];
      const float* v = w.data<float>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const size_t j = size_t(trans ? c : r);
          wmax[j] = std::max(wmax[j], double(std::fabs(v[r * cols + c])));
        }
    }
    std::vector<double> s(size_t(k), 1.0);
    for (size_t j = 0; j < size_t(k); ++j) {
      const double a = channel_max(cs, j, options.smooth_clip);
      if (a > 0 && wmax[j] > 0)
        s[j] = std::clamp(std::pow(a, alpha) / std::pow(wmax[j], 1 - alpha), 1e-5, 1e5);
    }
    for (size_t i : members) {
      Node& n = g.nodes[i];
      Tensor w = g.initializers.at(n.inputs[1]).clone();
      const bool trans = n.op_type == "Gemm" && n.attr_int("transB", 0);
      const int64_t cols = w.shape()[1];
      float* v = w.data<float>();
      for (int64_t e = 0; e < w.numel(); ++e)
        v[e] = float(double(v[e]) * s[size_t(trans ? e % cols : e / cols)]);
      const std::string name = names.fresh(n.inputs[1] + "_smoothed");
      g.initializers[name] = std::move(w);
      n.inputs[1] = name;
      ++smoothed;
    }
    // x / s: into the producer's per-channel affine map when nothing else reads x.
    const auto& readers = index.consumers.at(x);
    const bool only_group = readers.size() == members.size() && !index.graph_outputs.count(x) &&
                            !index.captured.count(x);
    auto prod = index.producer.find(x);
    bool folded = false;
    if (only_group && prod != index.producer.end()) {
      Node& p = g.nodes[prod->second];
      auto replace = [&](Node& node, size_t slot) {
        const std::string name = names.fresh(node.inputs[slot] + "_smoothed");
        g.initializers[name] = divided(g.initializers.at(node.inputs[slot]), s);
        node.inputs[slot] = name;
      };
      if (p.op_type == "LayerNormalization" && p.domain.empty() && p.attr_int("axis", -1) == -1 &&
          is_channel_vector(index.constant(g, p.inputs.size() > 1 ? p.inputs[1] : ""), k) &&
          (p.inputs.size() < 3 || p.inputs[2].empty() ||
           is_channel_vector(index.constant(g, p.inputs[2]), k))) {
        replace(p, 1);
        if (p.inputs.size() > 2 && !p.inputs[2].empty()) replace(p, 2);
        folded = true;
      } else if (p.op_type == "Add" && p.domain.empty() && p.inputs.size() == 2) {
        // A normalization written out: Add(Mul(z, gamma), beta) with constant gamma, beta.
        const int c = is_channel_vector(index.constant(g, p.inputs[1]), k)   ? 1
                      : is_channel_vector(index.constant(g, p.inputs[0]), k) ? 0
                                                                             : -1;
        if (c >= 0) {
          const std::string y = p.inputs[size_t(1 - c)];
          auto mp = index.producer.find(y);
          if (mp != index.producer.end() && index.consumers.at(y).size() == 1 &&
              !index.graph_outputs.count(y)) {
            Node& m = g.nodes[mp->second];
            const int gc = m.op_type != "Mul" || m.inputs.size() != 2             ? -1
                           : is_channel_vector(index.constant(g, m.inputs[1]), k) ? 1
                           : is_channel_vector(index.constant(g, m.inputs[0]), k) ? 0
                                                                                  : -1;
            if (gc >= 0 && m.domain.empty()) {
              replace(p, size_t(c));
              replace(m, size_t(gc));
              folded = true;
            }
          }
        }
      }
    }
    if (folded) continue;
    std::vector<float> invf(s.size());
    for (size_t j = 0; j < s.size(); ++j) invf[j] = float(1.0 / s[j]);
    const std::string scale = names.fresh(x + "_smooth_scale"), xs = names.fresh(x + "_smoothed");
    g.initializers[scale] = Tensor::from_vector<float>({k}, invf);
    Node mul{names.fresh(x + "_smooth"), "Mul", "", {x, scale}, {xs}, {}};
    size_t first = g.nodes.size();
    for (size_t i : members) {
      g.nodes[i].inputs[0] = xs;
      first = std::min(first, i);
    }
    inserted.emplace_back(first, std::move(mul));
  }
  // Insert the Mul nodes before their first reader, from the back so indices hold.
  std::sort(inserted.begin(), inserted.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  for (auto& [pos, node] : inserted)
    g.nodes.insert(g.nodes.begin() + std::ptrdiff_t(pos), std::move(node));
  return smoothed;
}

}  // namespace slim::quant::detail
