// prune_channels: shapes at the analysis input, the channel graph, units and groups,
// importance, the MAC/parameter budget, then the surgery (tensor slices, depthwise
// groups, shape constants, bias correction) on the model.
#include "slim/prune/channel_prune.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <queue>
#include <set>

#include "prune/channel_graph.h"
#include "slim/core/error.h"
#include "slim/onnx/exporter.h"
#include "slim/onnx/importer.h"
#include "slim/runtime/session.h"

namespace slim::prune {

using detail::ChannelGraph;
using detail::Member;

Criterion parse_criterion(const std::string& name) {
  if (name == "l1") return Criterion::l1;
  if (name == "l2") return Criterion::l2;
  if (name == "bn") return Criterion::bn;
  if (name == "output") return Criterion::output;
  throw Error(ErrorCode::invalid_argument, "unknown pruning criterion '" + name + "' (l1, l2, bn or output)");
}

std::string criterion_name(Criterion c) {
  switch (c) {
    case Criterion::l1: return "l1";
    case Criterion::l2: return "l2";
    case Criterion::bn: return "bn";
    case Criterion::output: return "output";
  }
  return "?";
}

namespace {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

// Constant nodes with a tensor (or scalar/list) value become initializers.
void constants_to_initializers(Graph& g) {
  std::vector<Node> kept;
  for (auto& n : g.nodes) {
    if (n.op_type != "Constant" || !n.domain.empty() || n.outputs.size() != 1) {
      kept.push_back(std::move(n));
      continue;
    }
    Tensor t;
    if (const Tensor* v = n.attr_tensor("value")) t = *v;
    else if (n.has_attr("value_float")) t = Tensor::scalar<float>(n.attr_float("value_float", 0));
    else if (n.has_attr("value_int")) t = Tensor::scalar<int64_t>(n.attr_int("value_int", 0));
    else if (n.has_attr("value_floats")) {
      auto v = n.attr_floats("value_floats");
      t = Tensor::from_vector<float>({int64_t(v.size())}, v);
    } else if (n.has_attr("value_ints")) {
      auto v = n.attr_ints("value_ints");
      t = Tensor::from_vector<int64_t>({int64_t(v.size())}, v);
    }
    if (!t.defined()) {
      kept.push_back(std::move(n));
      continue;
    }
    g.initializers[n.outputs[0]] = t;
  }
  g.nodes = std::move(kept);
}

// The model with its symbolic input dims fixed to the feeds' shapes.
Model fixed_inputs(const Model& m, const std::map<std::string, Shape>& input_shapes) {
  Model fixed = m;
  for (auto& in : fixed.graph.inputs) {
    auto it = input_shapes.find(in.name);
    if (!in.shape || it == input_shapes.end() || it->second.size() != in.shape->size()) continue;
    for (size_t d = 0; d < in.shape->size(); ++d) (*in.shape)[d].value = it->second[d];
  }
  return fixed;
}

std::map<std::string, Shape> analysis_input_shapes(const Model& m, const ChannelPruneOptions& o, std::string& text) {
  std::map<std::string, Shape> out;
  for (const auto& in : m.graph.inputs) {
    Shape s;
    if (!o.calibration.empty()) {
      auto it = o.calibration[0].find(in.name);
      check(it != o.calibration[0].end(), ErrorCode::invalid_argument,
            "prune: the calibration samples lack the model input '" + in.name + "'");
      s = it->second.shape();
      if (!s.empty() && in.shape && !in.shape->empty() && !(*in.shape)[0].is_fixed()) s[0] = 1;
    } else {
      check(bool(in.shape), ErrorCode::invalid_argument,
            "prune: the model input '" + in.name + "' has no shape: give calibration samples (--calib)");
      for (size_t d = 0; d < in.shape->size(); ++d) {
        const Dim& dim = (*in.shape)[d];
        check(dim.is_fixed() || d == 0, ErrorCode::invalid_argument,
              "prune: the model input '" + in.name + "' is " + in.describe() +
                  ": give calibration samples (--calib) so that its shape is known");
        s.push_back(dim.is_fixed() ? dim.value : 1);
      }
    }
    out[in.name] = s;
    text += (text.empty() ? "" : ", ") + in.name + ": " + shape_str(s);
  }
  return out;
}

std::map<std::string, Shape> infer_shapes(const Model& m, const std::map<std::string, Shape>& inputs, int threads) {
  SessionOptions so;
  so.num_threads = threads;
  so.optimize = false;
  auto session = Session::compile(fixed_inputs(m, inputs), so);
  std::map<std::string, Shape> shapes = inputs;
  for (const auto& [name, t] : m.graph.initializers) shapes[name] = t.shape();
  for (const auto& n : m.graph.nodes)
    for (const auto& o : n.outputs)
      if (!o.empty())
        if (auto s = session->static_shape(o)) shapes[o] = *s;
  return shapes;
}

// Per slot of a value's channel axis: mean and mean square over calibration samples.
struct ChannelStats {
  std::vector<double> sum, sumsq;
  int64_t count = 0;  // elements per channel seen
};

// `values`: name -> channel axis.
std::map<std::string, ChannelStats> collect_stats(const Model& m, const std::map<std::string, int>& values,
                                                  const ChannelPruneOptions& o, const std::string& stage) {
  std::map<std::string, ChannelStats> stats;
  if (values.empty()) return stats;
  Model probe = m;
  std::set<std::string> outs;
  for (const auto& v : probe.graph.outputs) outs.insert(v.name);
  for (const auto& [v, axis] : values)
    if (!outs.count(v)) {
      ValueInfo vi;
      vi.name = v;
      probe.graph.outputs.push_back(vi);
    }
  std::map<std::string, std::unique_ptr<Session>> sessions;
  SessionOptions so;
  so.num_threads = o.threads;
  std::vector<std::string> names;
  for (const auto& [v, axis] : values) names.push_back(v);
  for (size_t i = 0; i < o.calibration.size(); ++i) {
    if (o.progress && !stage.empty()) o.progress(stage, int64_t(i), int64_t(o.calibration.size()));
    const auto& feeds = o.calibration[i];
    std::string key;
    std::map<std::string, Shape> in_shapes;
    for (const auto& [name, t] : feeds) key += name + shape_str(t.shape()) + ";", in_shapes[name] = t.shape();
    auto& s = sessions[key];
    if (!s) s = Session::compile(fixed_inputs(probe, in_shapes), so);
    const TensorMap out = s->run(feeds, names);
    for (const auto& [name, t] : out) {
      if (t.dtype() != DType::f32) continue;
      const int axis = values.at(name);
      const Tensor c = t.contiguous();
      if (axis >= c.rank()) continue;
      const int64_t size = c.shape()[size_t(axis)];
      int64_t outer = 1, inner = 1;
      for (int d = 0; d < axis; ++d) outer *= c.shape()[size_t(d)];
      for (int d = axis + 1; d < c.rank(); ++d) inner *= c.shape()[size_t(d)];
      auto& st = stats[name];
      st.sum.resize(size_t(size)), st.sumsq.resize(size_t(size));
      const float* x = c.data<float>();
      for (int64_t a = 0; a < outer; ++a)
        for (int64_t ch = 0; ch < size; ++ch) {
          const float* p = x + (a * size + ch) * inner;
          double s1 = 0, s2 = 0;
          for (int64_t k = 0; k < inner; ++k) s1 += p[k], s2 += double(p[k]) * p[k];
          st.sum[size_t(ch)] += s1, st.sumsq[size_t(ch)] += s2;
        }
      st.count += outer * inner;
    }
  }
  if (o.progress && !stage.empty()) o.progress(stage, int64_t(o.calibration.size()), int64_t(o.calibration.size()));
  return stats;
}

Tensor as_f32(const Tensor& t, const std::string& name) {
  check(t.dtype() == DType::f32, ErrorCode::unsupported, "prune: '" + name + "' is " + t.describe() + ", not float32");
  return t.contiguous();
}

// Per index along `axis`: the sum of |w| (p = 1) or w^2 (p = 2) over the rest.
std::vector<double> slice_norms(const Tensor& w, int axis, int p) {
  const Tensor c = w.contiguous();
  const int64_t n = c.shape()[size_t(axis)];
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= c.shape()[size_t(d)];
  for (int d = axis + 1; d < c.rank(); ++d) inner *= c.shape()[size_t(d)];
  std::vector<double> out(static_cast<size_t>(n));
  const float* x = c.data<float>();
  for (int64_t a = 0; a < outer; ++a)
    for (int64_t j = 0; j < n; ++j) {
      const float* q = x + (a * n + j) * inner;
      double s = 0;
      for (int64_t k = 0; k < inner; ++k) s += p == 1 ? std::fabs(q[k]) : double(q[k]) * q[k];
      out[size_t(j)] += s;
    }
  return out;
}

// The indices `keep` of `t` along `axis`, any dtype.
Tensor gather_axis(const Tensor& t, int axis, const std::vector<int64_t>& keep) {
  const Tensor c = t.contiguous();
  Shape s = c.shape();
  const int64_t n = s[size_t(axis)];
  s[size_t(axis)] = int64_t(keep.size());
  Tensor out(c.dtype(), s);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= c.shape()[size_t(d)];
  for (int d = axis + 1; d < c.rank(); ++d) inner *= c.shape()[size_t(d)];
  const size_t es = c.element_size(), row = size_t(inner) * es;
  const auto* src = static_cast<const uint8_t*>(c.raw_data());
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  for (int64_t a = 0; a < outer; ++a)
    for (size_t j = 0; j < keep.size(); ++j)
      std::memcpy(dst + (size_t(a) * keep.size() + j) * row, src + size_t(a * n + keep[j]) * row, row);
  return out;
}

void set_element(Tensor& t, int64_t index, int64_t value) {
  t = t.clone();
  switch (t.dtype()) {
    case DType::i64: t.data<int64_t>()[index] = value; break;
    case DType::i32: t.data<int32_t>()[index] = int32_t(value); break;
    case DType::f32: t.data<float>()[index] = float(value); break;
    case DType::f64: t.data<double>()[index] = double(value); break;
    default: throw Error(ErrorCode::unsupported, "prune: shape constant of type " + t.describe());
  }
}

int64_t static_macs(const Node& n, const std::map<std::string, Shape>& shapes, const Graph& g) {
  auto sh = [&](const std::string& v) -> const Shape* {
    auto it = shapes.find(v);
    return it == shapes.end() ? nullptr : &it->second;
  };
  if (!n.domain.empty() || n.inputs.size() < 2) return 0;
  const Shape *x = sh(n.inputs[0]), *w = sh(n.inputs[1]), *y = n.outputs.empty() ? nullptr : sh(n.outputs[0]);
  if (!x || !w || !y) return 0;
  (void)g;
  auto prod = [](const Shape& s, size_t from) {
    int64_t p = 1;
    for (size_t i = from; i < s.size(); ++i) p *= s[i];
    return p;
  };
  if (n.op_type == "Conv" && w->size() >= 3) return prod(*y, 0) * prod(*w, 1);
  if (n.op_type == "ConvTranspose" && w->size() >= 3) return prod(*x, 0) * prod(*w, 1);
  if ((n.op_type == "Gemm" || n.op_type == "MatMul") && !x->empty()) return prod(*y, 0) * x->back();
  return 0;
}

struct Unit {
  std::vector<int64_t> slots;
  std::vector<int> spaces;  // sorted, unique
  std::vector<std::pair<int, int64_t>> members;  // (member, index along its axis)
  bool blocked = false;
  double score = 0, norm = 0;
  int group = -1;
};

// Layer by layer in graph order: each reading layer's kept output channels get the mean
// and standard deviation they had in the original model, on the calibration samples.
void recalibrate(Model& model, const ChannelGraph& cg, const std::vector<char>& slot_kept, const std::set<int>& readers,
                 const std::map<std::string, ChannelStats>& original, const ChannelPruneOptions& o,
                 ChannelPruneReport& r) {
  Graph& g = model.graph;
  std::vector<int> order;
  for (size_t i : validate_graph(g, "prune")) if (readers.count(int(i))) order.push_back(int(i));
  int64_t done = 0;
  for (int ni : order) {
    if (o.progress) o.progress("recalibrate", done++, int64_t(order.size()));
    const Node& n = g.nodes[size_t(ni)];
    const std::string& y = n.outputs[0];
    auto ys = cg.space_of.find(y);
    auto os = original.find(y);
    if (ys == cg.space_of.end() || os == original.end() || !os->second.count) continue;
    const auto& sp = cg.spaces[size_t(ys->second)];
    std::vector<int64_t> kept;
    for (int64_t i = 0; i < sp.size; ++i)
      if (slot_kept[size_t(sp.base + i)]) kept.push_back(i);
    const auto now = collect_stats(model, {{y, sp.axis}}, o, "");
    auto ps = now.find(y);
    if (ps == now.end() || !ps->second.count || ps->second.sum.size() != kept.size()) continue;
    const bool tb = n.op_type == "Gemm" && n.attr_int("transB", 0);
    const double beta = n.op_type == "Gemm" ? n.attr_float("beta", 1.0f) : 1.0;
    if (n.inputs.size() < 3 || n.inputs[2].empty() || beta == 0) continue;
    Tensor w = g.initializers.at(n.inputs[1]).clone();
    Tensor b = g.initializers.at(n.inputs[2]).clone();
    if (w.dtype() != DType::f32 || b.dtype() != DType::f32 || b.numel() != int64_t(kept.size())) continue;
    const int out_axis = n.op_type == "Gemm" && !tb ? 1 : 0;
    const int64_t nout = w.shape()[size_t(out_axis)];
    int64_t inner = 1;
    for (int d = out_axis + 1; d < w.rank(); ++d) inner *= w.shape()[size_t(d)];
    const int64_t outer = w.numel() / (nout * inner);
    for (size_t k = 0; k < kept.size(); ++k) {
      const double cnt_o = double(os->second.count), cnt_p = double(ps->second.count);
      const double mo = os->second.sum[size_t(kept[k])] / cnt_o, mp = ps->second.sum[k] / cnt_p;
      const double so = std::sqrt(std::max(0.0, os->second.sumsq[size_t(kept[k])] / cnt_o - mo * mo));
      const double spd = std::sqrt(std::max(0.0, ps->second.sumsq[k] / cnt_p - mp * mp));
      const double a = spd > 1e-12 && so > 1e-12 ? std::clamp(so / spd, 0.25, 4.0) : 1.0;
      const double c = mo - a * mp;
      for (int64_t q = 0; q < outer; ++q)
        for (int64_t i = 0; i < inner; ++i) w.data<float>()[(q * nout + int64_t(k)) * inner + i] *= float(a);
      b.data<float>()[k] = float((a * beta * b.data<float>()[k] + c) / beta);
    }
    g.initializers[n.inputs[1]] = w;
    g.initializers[n.inputs[2]] = b;
    r.recalibrated++;
  }
  if (o.progress) o.progress("recalibrate", done, int64_t(order.size()));
}

}  // namespace

ChannelPruneReport prune_channels(Model& model, const ChannelPruneOptions& o) {
  check(o.target_flops > 0 && o.target_flops <= 1, ErrorCode::invalid_argument,
        "prune: --target-flops must be in (0, 1], got " + std::to_string(o.target_flops));
  check(o.target_params > 0 && o.target_params <= 1, ErrorCode::invalid_argument,
        "prune: --target-params must be in (0, 1], got " + std::to_string(o.target_params));
  check(o.channel_multiple >= 1, ErrorCode::invalid_argument, "prune: the channel multiple must be at least 1");
  check(o.criterion != Criterion::output || !o.calibration.empty(), ErrorCode::invalid_argument,
        "prune: --criterion output measures channels on calibration data: give --calib");
  ChannelPruneReport r;
  r.criterion = o.criterion;
  Graph& g = model.graph;
  constants_to_initializers(g);
  if (o.progress) o.progress("shapes", 0, 1);
  const auto input_shapes = analysis_input_shapes(model, o, r.input_shape);
  const auto shapes = infer_shapes(model, input_shapes, o.threads);
  ChannelGraph cg = detail::build_channel_graph(g, shapes, model.opset(""));

  // Units: union-find components of slots.
  std::vector<int> slot_space(size_t(cg.slots));
  for (size_t s = 0; s < cg.spaces.size(); ++s)
    for (int64_t i = 0; i < cg.spaces[s].size; ++i) slot_space[size_t(cg.spaces[s].base + i)] = int(s);
  std::map<int64_t, int> unit_of_root;
  std::vector<Unit> units;
  std::vector<int> unit_of(size_t(cg.slots));
  for (int64_t s = 0; s < cg.slots; ++s) {
    const int64_t root = cg.find(s);
    auto [it, fresh] = unit_of_root.emplace(root, int(units.size()));
    if (fresh) units.emplace_back();
    Unit& u = units[size_t(it->second)];
    u.slots.push_back(s);
    unit_of[size_t(s)] = it->second;
    const int sp = slot_space[size_t(s)];
    if (std::find(u.spaces.begin(), u.spaces.end(), sp) == u.spaces.end()) u.spaces.push_back(sp);
    if (!cg.spaces[size_t(sp)].frozen.empty()) u.blocked = true;
  }
  for (size_t m = 0; m < cg.members.size(); ++m) {
    const Member& mb = cg.members[m];
    const int64_t n = g.initializers.at(mb.tensor).shape()[size_t(mb.axis)];
    for (int64_t j = 0; j < n; ++j)
      units[size_t(unit_of[size_t(cg.spaces[size_t(mb.space)].base + mb.offset + j)])].members.emplace_back(int(m), j);
  }
  // Groups: units with the same spaces.
  std::map<std::vector<int>, int> group_of;
  for (auto& u : units) {
    std::sort(u.spaces.begin(), u.spaces.end());
    auto [it, fresh] = group_of.emplace(u.spaces, int(r.groups.size()));
    if (fresh) {
      ChannelGroup grp;
      for (int sp : u.spaces) grp.values.push_back(cg.spaces[size_t(sp)].value);
      grp.prunable = true;
      r.groups.push_back(grp);
    }
    u.group = it->second;
    ChannelGroup& grp = r.groups[size_t(u.group)];
    grp.channels++;
    if (u.blocked) {
      grp.prunable = false;
      for (int sp : u.spaces)
        if (grp.reason.empty() && !cg.spaces[size_t(sp)].frozen.empty()) grp.reason = cg.spaces[size_t(sp)].frozen;
    }
  }

  if (r.groups.empty())
    r.notes.push_back(cg.seed_failures.empty()
                          ? "no Conv, ConvTranspose, Gemm or MatMul with a constant weight: nothing to prune"
                          : "no channels to prune: " + std::to_string(cg.seed_failures.size()) +
                                " weighted nodes could not be analysed, e.g. " + cg.seed_failures[0]);

  // Statistics on calibration data: what the weight layers read.
  const bool correct = o.bias_correction && !o.calibration.empty();
  std::map<std::string, int> observe;
  if (o.criterion == Criterion::output || correct)
    for (const auto& mb : cg.members)
      if (mb.kind == Member::consume) {
        observe[cg.spaces[size_t(mb.space)].value] = cg.spaces[size_t(mb.space)].axis;
        const Node& n = g.nodes[size_t(mb.node)];
        auto ys = cg.space_of.find(n.outputs[0]);
        if (correct && o.recalibrate && (n.op_type == "Conv" || n.op_type == "Gemm") && ys != cg.space_of.end())
          observe[n.outputs[0]] = cg.spaces[size_t(ys->second)].axis;  // what the reading layer gives
      }
  const auto stats = collect_stats(model, observe, o, "calibration");

  // Importance per unit.
  std::map<int, std::vector<double>> norms;  // member -> per index
  auto member_norms = [&](int m, int p) -> const std::vector<double>& {
    auto it = norms.find(m * 4 + p);
    if (it != norms.end()) return it->second;
    const Member& mb = cg.members[size_t(m)];
    return norms[m * 4 + p] = slice_norms(as_f32(g.initializers.at(mb.tensor), mb.tensor), mb.axis, p);
  };
  std::vector<double> bn_score(size_t(cg.slots), -1);
  for (const auto& bn : cg.bns) {
    const Node& n = g.nodes[size_t(bn.node)];
    const Tensor sc = as_f32(g.initializers.at(n.inputs[1]), n.inputs[1]);
    const Tensor var = as_f32(g.initializers.at(n.inputs[4]), n.inputs[4]);
    const float eps = n.attr_float("epsilon", 1e-5f);
    const auto& sp = cg.spaces[size_t(bn.space)];
    for (int64_t j = 0; j < sp.size; ++j)
      bn_score[size_t(sp.base + j)] =
          std::max(0.0, bn_score[size_t(sp.base + j)]) + std::fabs(sc.data<float>()[j]) / std::sqrt(var.data<float>()[j] + eps);
  }
  int64_t bn_fallback = 0;
  std::vector<char> group_bn(r.groups.size(), 1);
  if (o.criterion == Criterion::bn)
    for (const auto& u : units) {
      bool has = false;
      for (int64_t s : u.slots) has = has || bn_score[size_t(s)] >= 0;
      if (!has) group_bn[size_t(u.group)] = 0;
    }
  for (auto& u : units) {
    if (u.blocked) continue;
    double s = 0;
    if (o.criterion == Criterion::bn && group_bn[size_t(u.group)]) {
      for (int64_t sl : u.slots) s += std::max(0.0, bn_score[size_t(sl)]);
    } else if (o.criterion == Criterion::output) {
      for (const auto& [m, j] : u.members) {
        const Member& mb = cg.members[size_t(m)];
        if (mb.kind != Member::consume) continue;
        const auto st = stats.find(cg.spaces[size_t(mb.space)].value);
        if (st == stats.end() || !st->second.count) continue;
        const double ex2 = st->second.sumsq[size_t(mb.offset + j)] / double(st->second.count);
        s += member_norms(m, 2)[size_t(j)] * ex2;
      }
    } else {
      const int p = o.criterion == Criterion::l1 ? 1 : 2;
      for (const auto& [m, j] : u.members)
        if (cg.members[size_t(m)].kind != Member::param) s += member_norms(m, p)[size_t(j)];
    }
    u.score = s;
  }
  if (o.criterion == Criterion::bn)
    for (size_t k = 0; k < r.groups.size(); ++k)
      if (r.groups[k].prunable && !group_bn[k]) bn_fallback++;
  if (bn_fallback)
    r.notes.push_back(std::to_string(bn_fallback) + " prunable groups have no BatchNormalization: scored by l2 there");
  // Normalized within each group (by its mean), then ranked across groups.
  std::vector<double> gsum(r.groups.size()), gcount(r.groups.size());
  for (const auto& u : units) gsum[size_t(u.group)] += u.score, gcount[size_t(u.group)]++;
  for (auto& u : units) {
    const double mean = gsum[size_t(u.group)] / std::max(1.0, gcount[size_t(u.group)]);
    u.norm = mean > 0 ? u.score / mean : 0;
  }

  // Budget.
  std::vector<int64_t> space_kept(cg.spaces.size());
  for (size_t s = 0; s < cg.spaces.size(); ++s) space_kept[s] = cg.spaces[s].size;
  std::vector<int64_t> member_kept(cg.members.size());
  std::map<std::string, std::vector<int>> tensor_members;
  for (size_t m = 0; m < cg.members.size(); ++m) {
    member_kept[m] = g.initializers.at(cg.members[m].tensor).shape()[size_t(cg.members[m].axis)];
    tensor_members[cg.members[m].tensor].push_back(int(m));
  }
  auto tensor_params = [&](const std::string& t) {
    Shape s = g.initializers.at(t).shape();
    for (int m : tensor_members[t]) s[size_t(cg.members[size_t(m)].axis)] = member_kept[size_t(m)];
    int64_t p = 1;
    for (auto d : s) p *= d;
    return p;
  };
  auto mac_of = [&](const detail::MacNode& mn) -> int64_t {
    const double in = double(space_kept[size_t(mn.in_space)]), out = double(space_kept[size_t(mn.out_space)]);
    if (mn.depthwise) return mn.per * int64_t(out);
    return int64_t(double(mn.per) * in * out / double(mn.group));
  };
  for (const auto& [name, t] : g.initializers)
    if (t.dtype() == DType::f32 || t.dtype() == DType::f16 || t.dtype() == DType::bf16) r.params_before += t.numel();
  std::set<int> mac_nodes;
  for (const auto& mn : cg.macs) mac_nodes.insert(mn.node), r.macs_before += mac_of(mn);
  int64_t fixed_macs = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!mac_nodes.count(int(i))) fixed_macs += static_macs(g.nodes[i], shapes, g);
  r.macs_before += fixed_macs;
  std::vector<std::vector<int>> space_macs(cg.spaces.size());
  for (size_t k = 0; k < cg.macs.size(); ++k) {
    space_macs[size_t(cg.macs[k].in_space)].push_back(int(k));
    if (cg.macs[k].out_space != cg.macs[k].in_space) space_macs[size_t(cg.macs[k].out_space)].push_back(int(k));
  }
  int64_t macs = r.macs_before, params = r.params_before;
  std::vector<char> removed(units.size(), 0);
  auto remove_unit = [&](int ui) {
    Unit& u = units[size_t(ui)];
    removed[size_t(ui)] = 1;
    std::set<int> mac_touch;
    for (int sp : u.spaces)
      for (int k : space_macs[size_t(sp)]) mac_touch.insert(k);
    for (int k : mac_touch) macs -= mac_of(cg.macs[size_t(k)]);
    std::set<std::string> tensors;
    for (const auto& [m, j] : u.members) tensors.insert(cg.members[size_t(m)].tensor);
    for (const auto& t : tensors) params -= tensor_params(t);
    for (int64_t s : u.slots) space_kept[size_t(slot_space[size_t(s)])]--;
    for (const auto& [m, j] : u.members) member_kept[size_t(m)]--;
    for (int k : mac_touch) macs += mac_of(cg.macs[size_t(k)]);
    for (const auto& t : tensors) params += tensor_params(t);
  };
  auto reached = [&] {
    return double(macs) <= o.target_flops * double(r.macs_before) + 0.5 &&
           double(params) <= o.target_params * double(r.params_before) + 0.5;
  };
  std::vector<std::vector<int>> group_units(r.groups.size());
  for (size_t ui = 0; ui < units.size(); ++ui) group_units[size_t(units[ui].group)].push_back(int(ui));
  for (auto& gu : group_units)
    std::stable_sort(gu.begin(), gu.end(), [&](int a, int b) { return units[size_t(a)].norm < units[size_t(b)].norm; });
  std::vector<size_t> next(r.groups.size(), 0);
  const int64_t mult = o.channel_multiple;
  auto chunk = [&](size_t gi) -> int64_t {
    const int64_t n = int64_t(group_units[gi].size()), kept = n - int64_t(next[gi]);
    if (!r.groups[gi].prunable || n <= mult) return 0;
    if (kept <= mult) return 0;
    return kept % mult ? kept % mult : mult;
  };
  using Entry = std::pair<double, size_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  // MACs one unit of a group saves at the current counts.
  auto unit_cost = [&](const Unit& u) {
    double c = 0;
    for (int sp : u.spaces) {
      int64_t slots = 0;
      for (int64_t s : u.slots) slots += slot_space[size_t(s)] == sp;
      for (int k : space_macs[size_t(sp)]) {
        const auto& mn = cg.macs[size_t(k)];
        const double in = double(space_kept[size_t(mn.in_space)]), out = double(space_kept[size_t(mn.out_space)]);
        if (mn.depthwise) c += mn.out_space == sp ? double(mn.per) * double(slots) : 0;
        else if (mn.in_space == sp) c += double(mn.per) * out / double(mn.group) * double(slots);
        else c += double(mn.per) * in / double(mn.group) * double(slots);
      }
    }
    return c;
  };
  double mean_cost = 0, n_cost = 0;
  for (const auto& u : units)
    if (!u.blocked) mean_cost += unit_cost(u), n_cost++;
  mean_cost = n_cost ? mean_cost / n_cost : 1;
  auto priority = [&](size_t gi) {
    const int64_t c = chunk(gi);
    double s = 0;
    for (int64_t k = 0; k < c; ++k) s += units[size_t(group_units[gi][next[gi] + size_t(k)])].norm;
    s /= double(c);
    if (o.cost_weight > 0 && mean_cost > 0) {
      const double cost = unit_cost(units[size_t(group_units[gi][next[gi]])]) / mean_cost;
      s /= std::pow(std::max(cost, 1e-6), o.cost_weight);
    }
    return s;
  };
  auto push = [&](size_t gi) {
    if (chunk(gi)) queue.push({priority(gi), gi});
  };
  for (size_t gi = 0; gi < r.groups.size(); ++gi) push(gi);
  while (!reached() && !queue.empty()) {
    const auto [prio, gi] = queue.top();
    queue.pop();
    if (o.cost_weight > 0) {  // costs move as other groups shrink: re-rank a stale entry
      const double now = priority(gi);
      if (now > prio * (1 + 1e-9) && !queue.empty() && now > queue.top().first) {
        queue.push({now, gi});
        continue;
      }
    }
    const int64_t c = chunk(gi);
    for (int64_t k = 0; k < c; ++k) remove_unit(group_units[gi][next[gi]++]);
    push(gi);
  }
  r.target_reached = reached();

  // Surgery.
  std::vector<char> slot_kept(size_t(cg.slots), 1);
  for (size_t ui = 0; ui < units.size(); ++ui)
    if (removed[ui])
      for (int64_t s : units[ui].slots) slot_kept[size_t(s)] = 0;
  for (size_t gi = 0; gi < r.groups.size(); ++gi) r.groups[gi].kept = r.groups[gi].channels - int64_t(next[gi]);
  auto member_keep = [&](const Member& mb, bool keep) {
    std::vector<int64_t> idx;
    const int64_t n = g.initializers.at(mb.tensor).shape()[size_t(mb.axis)];
    for (int64_t j = 0; j < n; ++j)
      if (bool(slot_kept[size_t(cg.spaces[size_t(mb.space)].base + mb.offset + j)]) == keep) idx.push_back(j);
    return idx;
  };
  for (const auto& mb : cg.members)
    if (mb.kind == Member::consume) {
      auto gone = member_keep(mb, false);
      if (!gone.empty()) r.consumer_slices.push_back({mb.tensor, mb.axis, gone});
    }

  // Bias correction: each reading layer's bias takes the mean of what it no longer reads.
  std::set<std::string> names;
  for (const auto& n : g.nodes)
    for (const auto& v : n.outputs) names.insert(v);
  for (const auto& [k, v] : g.initializers) names.insert(k);
  auto fresh = [&](const std::string& base) {
    std::string s = base;
    for (int i = 1; names.count(s); ++i) s = base + "_" + std::to_string(i);
    names.insert(s);
    return s;
  };
  std::map<std::string, int> uses;
  for (const auto& n : g.nodes)
    for (const auto& v : n.inputs) uses[v]++;
  std::set<int> readers;  // Conv/Gemm nodes whose inputs lost channels
  if (correct) {
    for (const auto& mb : cg.members) {
      if (mb.kind != Member::consume) continue;
      const auto gone = member_keep(mb, false);
      const auto st = stats.find(cg.spaces[size_t(mb.space)].value);
      if (gone.empty() || st == stats.end() || !st->second.count) continue;
      Node& n = g.nodes[size_t(mb.node)];
      const Tensor w = as_f32(g.initializers.at(mb.tensor), mb.tensor);
      // delta[out] = sum over removed inputs j of (sum of w over the kernel) * mean_j.
      const int out_axis = mb.axis == 0 ? 1 : 0;
      const int64_t nout = w.shape()[size_t(out_axis)];
      int64_t inner = 1;
      for (int d = 2; d < w.rank(); ++d) inner *= w.shape()[size_t(d)];
      std::vector<double> delta(static_cast<size_t>(nout));
      const float* wp = w.data<float>();
      const int64_t nin = w.shape()[size_t(mb.axis)];
      for (int64_t j : gone) {
        const double mean = st->second.sum[size_t(mb.offset + j)] / double(st->second.count);
        for (int64_t oc = 0; oc < nout; ++oc) {
          const int64_t row = mb.axis == 1 ? oc * nin + j : j * nout + oc;
          double s = 0;
          for (int64_t k = 0; k < inner; ++k) s += wp[row * inner + k];
          delta[size_t(oc)] += s * mean;
        }
      }
      // Where the bias lives: Conv/ConvTranspose input 2, Gemm's C, or an Add after a MatMul.
      std::string bias;
      double scale = 1;
      if (n.op_type == "Conv" || n.op_type == "ConvTranspose" || n.op_type == "Gemm") {
        if (n.op_type == "Gemm") scale = n.attr_float("beta", 1.0f);
        if (n.inputs.size() < 3 || n.inputs[2].empty()) {
          n.inputs.resize(3);
          n.inputs[2] = fresh(n.name + ".bias");
          g.initializers[n.inputs[2]] = Tensor(DType::f32, {nout});
          if (n.op_type == "Gemm") {
            Attribute a;
            a.kind = Attribute::Kind::f;
            a.f = 1;
            n.attrs["beta"] = a;
            scale = 1;
          }
          auto ys = cg.space_of.find(n.outputs[0]);
          if (ys != cg.space_of.end())
            cg.members.push_back({n.inputs[2], 0, ys->second, 0, Member::param, mb.node, false});
          uses[n.inputs[2]] = 1;
        }
        bias = n.inputs[2];
      } else if (n.op_type == "MatMul") {
        for (auto& c : g.nodes)
          if (c.op_type == "Add" && uses[n.outputs[0]] == 1 && c.inputs.size() == 2)
            for (int k = 0; k < 2; ++k)
              if (c.inputs[size_t(k)] == n.outputs[0] && g.initializers.count(c.inputs[size_t(1 - k)]))
                bias = c.inputs[size_t(1 - k)];
      }
      if (bias.empty() || uses[bias] != 1 || scale == 0) continue;
      Tensor b = g.initializers.at(bias);
      if (b.dtype() != DType::f32 || (b.numel() != nout && b.numel() != 1)) continue;
      if (b.numel() == 1 && nout != 1) {
        Tensor full(DType::f32, {nout});
        for (int64_t k = 0; k < nout; ++k) full.data<float>()[k] = b.contiguous().data<float>()[0];
        b = full;
        auto ys = cg.space_of.find(n.outputs[0]);
        if (ys != cg.space_of.end() && n.op_type != "MatMul")
          cg.members.push_back({bias, 0, ys->second, 0, Member::param, mb.node, false});
      } else {
        b = b.clone();
      }
      for (int64_t k = 0; k < nout; ++k) b.data<float>()[k] += float(delta[size_t(k)] / scale);
      g.initializers[bias] = b;
      r.bias_corrected++;
      if (n.op_type == "Conv" || n.op_type == "Gemm") readers.insert(mb.node);
    }
  }

  // Slices of every member tensor, then the attributes and constants that count channels.
  std::map<std::string, std::map<int, std::vector<int64_t>>> cuts;
  for (const auto& mb : cg.members) {
    auto keep = member_keep(mb, true);
    if (int64_t(keep.size()) != g.initializers.at(mb.tensor).shape()[size_t(mb.axis)]) cuts[mb.tensor][mb.axis] = keep;
  }
  for (const auto& [t, axes] : cuts) {
    Tensor x = g.initializers.at(t);
    for (const auto& [axis, keep] : axes) x = gather_axis(x, axis, keep);
    g.initializers[t] = x;
  }
  std::vector<int64_t> kept_of(cg.spaces.size());
  for (size_t s = 0; s < cg.spaces.size(); ++s) {
    int64_t k = 0;
    for (int64_t i = 0; i < cg.spaces[s].size; ++i) k += slot_kept[size_t(cg.spaces[s].base + i)];
    kept_of[s] = k;
  }
  for (const auto& [node, sp] : cg.depthwise_fixes) {
    Attribute a;
    a.kind = Attribute::Kind::i;
    a.i = kept_of[size_t(sp)];
    g.nodes[size_t(node)].attrs["group"] = a;
  }
  for (const auto& fx : cg.shape_fixes) {
    const auto& sp = cg.spaces[size_t(fx.space)];
    if (kept_of[size_t(fx.space)] != sp.size) set_element(g.initializers.at(fx.tensor), fx.index, kept_of[size_t(fx.space)]);
  }
  bool stale_info = false;
  for (auto& vi : g.value_info) {
    auto it = cg.space_of.find(vi.name);
    if (it == cg.space_of.end() || !vi.shape || kept_of[size_t(it->second)] == cg.spaces[size_t(it->second)].size) continue;
    (*vi.shape)[size_t(cg.spaces[size_t(it->second)].axis)] = Dim{kept_of[size_t(it->second)], ""};
    stale_info = true;
  }
  if (stale_info) {
    model.path.clear();  // the template's value_info would describe the old channel counts
    r.notes.push_back("value_info rewritten from the pruned graph (the source file's shapes no longer hold)");
  }
  if (correct && o.recalibrate) recalibrate(model, cg, slot_kept, readers, stats, o, r);
  r.params_after = 0;
  for (const auto& [name, t] : g.initializers)
    if (t.dtype() == DType::f32 || t.dtype() == DType::f16 || t.dtype() == DType::bf16) r.params_after += t.numel();
  r.macs_after = macs;
  // MACs again from the pruned graph's shapes: the incremental count must agree.
  return r;
}

ChannelPruneReport prune_channels_file(const std::string& input, const std::string& output,
                                       const ChannelPruneOptions& options) {
  Model m = OnnxImporter::load_file(input);
  ChannelPruneReport r = prune_channels(m, options);
  OnnxExporter::save_file(m, output);
  return r;
}

}  // namespace slim::prune
