// Ref kernels of the recurrent layers RNN, GRU and LSTM (opsets 1, 3 for GRU, 7 and 14):
// every direction, sequence_lens, initial states, peepholes, layout, clip, input_forget,
// linear_before_reset and the eleven activation functions with their alpha and beta.
// Each direction and batch entry runs its own loop over time in double; outputs are
// rounded once.
#include "runtime/ref/rnn.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

double RnnActivation::operator()(double x) const {
  switch (kind) {
    case relu: return std::max(x, 0.0);
    case tanh: return std::tanh(x);
    case sigmoid: return 1 / (1 + std::exp(-x));
    case affine: return alpha * x + beta;
    case leaky_relu: return x >= 0 ? x : alpha * x;
    case thresholded_relu: return x > alpha ? x : 0;  // as the ThresholdedRelu op
    case scaled_tanh: return alpha * std::tanh(beta * x);
    case hard_sigmoid: return std::clamp(alpha * x + beta, 0.0, 1.0);
    case elu: return x >= 0 ? x : alpha * (std::exp(x) - 1);
    case softsign: return x / (1 + std::fabs(x));
    case softplus: return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
  }
  return x;
}

namespace {

using Act = RnnActivation;
constexpr float kNoDefault = std::numeric_limits<float>::quiet_NaN();

// The activations the recurrent ops accept. An alpha or beta missing from
// activation_alpha/beta takes the default of the ONNX op of the same name.
struct ActivationInfo {
  const char* name;
  Act::Kind kind;
  bool uses_alpha, uses_beta;
  float alpha, beta;
};
const ActivationInfo kActivations[] = {
    {"Relu", Act::relu, false, false, 0, 0},
    {"Tanh", Act::tanh, false, false, 0, 0},
    {"Sigmoid", Act::sigmoid, false, false, 0, 0},
    {"Affine", Act::affine, true, true, 1.f, 0.f},
    {"LeakyRelu", Act::leaky_relu, true, false, 0.01f, 0},
    {"ThresholdedRelu", Act::thresholded_relu, true, false, 1.f, 0},
    {"ScaledTanh", Act::scaled_tanh, true, true, kNoDefault, kNoDefault},
    {"HardSigmoid", Act::hard_sigmoid, true, true, 0.2f, 0.5f},
    {"Elu", Act::elu, true, false, 1.f, 0},
    {"Softsign", Act::softsign, false, false, 0, 0},
    {"Softplus", Act::softplus, false, false, 0, 0},
};

// Names compare case-insensitively, as ONNX Runtime does ("tanh" appears in exports).
bool same_name(const std::string& a, const char* b) {
  size_t i = 0;
  for (; i < a.size() && b[i]; ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return i == a.size() && !b[i];
}

}  // namespace

RnnAttrs parse_rnn_attrs(const Node& node, int64_t opset) {
  auto fail = [&](ErrorCode code, const std::string& msg) {
    throw Error(code, node.describe() + ": " + msg);
  };
  RnnAttrs a;
  a.kind = node.op_type == "LSTM" ? RnnKind::lstm : node.op_type == "GRU" ? RnnKind::gru : RnnKind::rnn;
  a.gates = a.kind == RnnKind::lstm ? 4 : a.kind == RnnKind::gru ? 3 : 1;
  const size_t max_inputs = a.kind == RnnKind::lstm ? 8 : 6, max_outputs = a.kind == RnnKind::lstm ? 3 : 2;
  if (node.inputs.size() > max_inputs || node.outputs.size() > max_outputs)
    fail(ErrorCode::invalid_model, "takes at most " + std::to_string(max_inputs) + " inputs and " +
                                       std::to_string(max_outputs) + " outputs");
  if (node.has_attr("hidden_size")) {
    a.hidden = node.attr_int("hidden_size", 0);
    if (a.hidden <= 0) fail(ErrorCode::invalid_model, "attribute hidden_size must be positive, got " + std::to_string(a.hidden));
  }
  const std::string dir = node.attr_string("direction", "forward");
  if (dir == "bidirectional") {
    a.directions = 2;
  } else if (dir == "reverse") {
    a.reverse = true;
  } else if (dir != "forward") {
    fail(ErrorCode::invalid_model, "attribute direction is '" + dir + "', expected forward, reverse or bidirectional");
  }
  if (opset >= 14) {
    a.layout = node.attr_int("layout", 0);
    if (a.layout != 0 && a.layout != 1)
      fail(ErrorCode::invalid_model, "attribute layout must be 0 or 1, got " + std::to_string(a.layout));
  }
  if (node.has_attr("clip")) {
    a.clip = node.attr_float("clip", 0);
    if (!(*a.clip > 0)) fail(ErrorCode::invalid_model, "attribute clip must be positive, got " + std::to_string(*a.clip));
  }
  if (a.kind == RnnKind::lstm) a.input_forget = node.attr_int("input_forget", 0) != 0;
  if (a.kind == RnnKind::gru && opset >= 3) a.linear_before_reset = node.attr_int("linear_before_reset", 0) != 0;
  // opset 1's output_sequence only says whether Y is produced, which the node's outputs say.

  const size_t per = size_t(a.activations_per_direction());
  std::vector<std::string> names = node.attr_strings("activations");
  if (names.empty()) {
    names = a.kind == RnnKind::lstm  ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
            : a.kind == RnnKind::gru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                     : std::vector<std::string>{"Tanh"};
  }
  // RNN's schema default lists Tanh twice, one per direction; one direction uses the first.
  if (a.kind == RnnKind::rnn && a.directions == 1 && names.size() == 2) names.resize(1);
  if (names.size() != per * size_t(a.directions) && !(a.directions == 2 && names.size() == per))
    fail(ErrorCode::invalid_model, "attribute activations has " + std::to_string(names.size()) + " entries, expected " +
                                       std::to_string(per * size_t(a.directions)));
  const std::vector<float> alphas = node.attr_floats("activation_alpha"), betas = node.attr_floats("activation_beta");
  size_t next_alpha = 0, next_beta = 0;  // consumed in order by the functions that take them
  for (const std::string& name : names) {
    const ActivationInfo* info = nullptr;
    for (const ActivationInfo& c : kActivations)
      if (same_name(name, c.name)) info = &c;
    if (!info)
      fail(ErrorCode::invalid_model, "activation '" + name + "' in attribute activations is not one of Relu, Tanh, "
                                     "Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, "
                                     "Softsign, Softplus");
    Act act;
    act.kind = info->kind;
    act.alpha = info->uses_alpha && next_alpha < alphas.size() ? alphas[next_alpha++] : info->alpha;
    act.beta = info->uses_beta && next_beta < betas.size() ? betas[next_beta++] : info->beta;
    if (std::isnan(act.alpha) || std::isnan(act.beta))
      fail(ErrorCode::unsupported, "activation ScaledTanh needs its alpha and beta in attributes "
                                   "activation_alpha and activation_beta (it has no defaults)");
    a.activations.push_back(act);
  }
  if (a.activations.size() < per * size_t(a.directions))  // one set given for both directions
    a.activations.insert(a.activations.end(), a.activations.begin(), a.activations.end());
  return a;
}

namespace {

void write_output(KernelContext& ctx, int index, DType dtype, const Shape& shape, const std::vector<double>& v) {
  if (!ctx.output_wanted(index)) return;
  Tensor& y = ctx.output(index, dtype, shape);
  visit_class<kFloat>(ctx, dtype, "X", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = elems_mut<T>(y);
    for (size_t i = 0; i < v.size(); ++i) out[i] = T(compute_t<T>(v[i]));
  });
}

double dot(const double* a, const double* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void compute_rnn(KernelContext& ctx, const RnnAttrs& a) {
  const Tensor& x = ctx.required_input(0);
  const Tensor& r = ctx.required_input(2);
  static const char* const kNames[] = {"X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"};
  for (int i = 0; i < ctx.num_inputs(); ++i)
    if (i != 4 && ctx.input(i) && !dtype_is_float(ctx.input(i)->dtype())) fail_dtype(ctx, ctx.input(i)->dtype(), kNames[i]);
  if (x.rank() != 3) ctx.fail(ErrorCode::invalid_argument, "X must be 3-D, got " + x.describe());
  if (r.rank() != 3) ctx.fail(ErrorCode::invalid_argument, "R must be 3-D, got " + r.describe());
  const bool batch_first = a.layout == 1;
  const int64_t T = x.dim(batch_first ? 1 : 0), N = x.dim(batch_first ? 0 : 1), I = x.dim(2);
  const int64_t D = a.directions, G = a.gates, GH = G * (a.hidden ? a.hidden : r.dim(2));
  const int64_t H = GH / G;
  const Shape state_shape = batch_first ? Shape{N, D, H} : Shape{D, N, H};
  const Shape shapes[] = {{}, {D, GH, I}, {D, GH, H}, {D, 2 * GH}, {N}, state_shape, state_shape, {D, 3 * H}};
  for (int i = 1; i < ctx.num_inputs(); ++i)
    if (const Tensor* t = ctx.input(i); t && t->shape() != shapes[i])
      ctx.fail(ErrorCode::invalid_argument, std::string(kNames[i]) + " must have shape " + shape_str(shapes[i]) +
                                                ", got " + t->describe());
  const Shape y_shape = batch_first ? Shape{N, T, D, H} : Shape{T, D, N, H};
  check_output_shape(ctx, y_shape);

  const std::vector<double> xv = tensor_to_doubles(x), wv = tensor_to_doubles(ctx.required_input(1)),
                            rv = tensor_to_doubles(r);
  auto optional_doubles = [&](int i, size_t n) {
    return ctx.input(i) ? tensor_to_doubles(*ctx.input(i)) : std::vector<double>(n, 0.0);
  };
  const std::vector<double> bv = optional_doubles(3, size_t(D * 2 * GH)), h0 = optional_doubles(5, size_t(D * N * H)),
                            c0 = optional_doubles(6, size_t(D * N * H)), pv = optional_doubles(7, size_t(D * 3 * H));
  std::vector<int64_t> lens(size_t(N), T);
  if (const Tensor* s = ctx.input(4)) {
    if (!dtype_is_integer(s->dtype())) fail_dtype(ctx, s->dtype(), "sequence_lens");
    lens = tensor_to_int64s(*s);
    for (int64_t len : lens)
      if (len < 0 || len > T)
        ctx.fail(ErrorCode::invalid_argument, "sequence_lens holds " + std::to_string(len) +
                                                  ", outside [0, " + std::to_string(T) + "]");
  }

  std::vector<double> y(size_t(shape_numel(y_shape)), 0.0), yh(size_t(D * N * H)), yc(size_t(D * N * H));
  const size_t hs = size_t(H), gs = size_t(GH);
  std::vector<double> h(hs), c(hs), hn(hs), gx(gs), gh(gs), rh(hs), zg(hs);
  auto clip = [&](double v) { return a.clip ? std::clamp(v, -double(*a.clip), double(*a.clip)) : v; };
  auto state_at = [&](int64_t d, int64_t n) { return size_t((batch_first ? n * D + d : d * N + n) * H); };
  for (int64_t d = 0; d < D; ++d) {
    const bool backwards = a.reverse || d == 1;
    const double *w = &wv[size_t(d * GH * I)], *rw = &rv[size_t(d * GH * H)];
    const double *wb = &bv[size_t(d * 2 * GH)], *rb = wb + GH, *p = &pv[size_t(d * 3 * H)];
    const int last = a.activations_per_direction() - 1;
    const Act &f = a.activation(int(d), 0), &g = a.activation(int(d), std::min(1, last)),
              &hf = a.activation(int(d), std::min(2, last));
    for (int64_t n = 0; n < N; ++n) {
      const int64_t len = lens[size_t(n)];
      std::copy_n(&h0[state_at(d, n)], H, h.begin());
      std::copy_n(&c0[state_at(d, n)], H, c.begin());
      for (int64_t s = 0; s < len; ++s) {
        const int64_t t = backwards ? len - 1 - s : s;
        const double* xt = &xv[size_t((batch_first ? n * T + t : t * N + n) * I)];
        for (int64_t j = 0; j < GH; ++j) {
          gx[size_t(j)] = wb[j] + dot(w + j * I, xt, I);
          gh[size_t(j)] = rb[j] + dot(rw + j * H, h.data(), H);
        }
        for (int64_t k = 0; k < H; ++k) {
          const size_t i = size_t(k);
          switch (a.kind) {
            case RnnKind::rnn: hn[i] = f(clip(gx[i] + gh[i])); break;
            case RnnKind::gru: {
              // Gates z, r, h. Without linear_before_reset, h's recurrent product is taken
              // of r (.) H after r is known (below).
              const double z = f(clip(gx[i] + gh[i])), rr = f(clip(gx[i + H] + gh[i + H]));
              if (a.linear_before_reset) hn[i] = (1 - z) * g(clip(gx[i + 2 * H] + rr * gh[i + 2 * H])) + z * h[i];
              zg[i] = z;
              rh[i] = rr * h[i];
              break;
            }
            case RnnKind::lstm: {
              // Gates i, o, f, c; peepholes P = [Pi, Po, Pf].
              const double ig = f(clip(gx[i] + gh[i] + p[k] * c[i]));
              const double fg = a.input_forget ? 1 - ig : f(clip(gx[i + 2 * H] + gh[i + 2 * H] + p[k + 2 * H] * c[i]));
              const double cell = fg * c[i] + ig * g(clip(gx[i + 3 * H] + gh[i + 3 * H]));
              const double og = f(clip(gx[i + H] + gh[i + H] + p[k + H] * cell));
              hn[i] = og * hf(cell);
              c[i] = cell;
              break;
            }
          }
        }
        if (a.kind == RnnKind::gru && !a.linear_before_reset)
          for (int64_t k = 0; k < H; ++k) {
            const size_t i = size_t(k);
            const double z = zg[i];
            hn[i] = (1 - z) * g(clip(gx[i + 2 * H] + rb[k + 2 * H] + dot(rw + (k + 2 * H) * H, rh.data(), H))) + z * h[i];
          }
        h.swap(hn);
        std::copy(h.begin(), h.end(), &y[size_t((batch_first ? (n * T + t) * D + d : (t * D + d) * N + n) * H)]);
      }
      // A sequence of length 0 ends in zero states, as in ONNX Runtime.
      if (len == 0) std::fill(h.begin(), h.end(), 0.0), std::fill(c.begin(), c.end(), 0.0);
      std::copy(h.begin(), h.end(), &yh[state_at(d, n)]);
      std::copy(c.begin(), c.end(), &yc[state_at(d, n)]);
    }
  }
  write_output(ctx, 0, x.dtype(), y_shape, y);
  write_output(ctx, 1, x.dtype(), state_shape, yh);
  write_output(ctx, 2, x.dtype(), state_shape, yc);
}

}  // namespace

void register_rnn_kernels(KernelRegistry& r) {
  for (const char* op : {"RNN", "GRU", "LSTM"}) {
    KernelFactory f = [](const Node& node, int64_t opset) -> std::unique_ptr<OpKernel> {
      return make_kernel([a = parse_rnn_attrs(node, opset)](KernelContext& ctx) { compute_rnn(ctx, a); });
    };
    r.add(KernelDef{op, "", 1, INT_MAX, f, {}});
  }
}

}  // namespace slim::ref
