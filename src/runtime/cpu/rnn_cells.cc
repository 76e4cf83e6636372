// The cpu provider's own RNN, GRU and LSTM cells for small batches. A speech model's
// recurrent core runs batch 1, often one step per call (a VAD's 2-layer LSTM of hidden
// 64), where oneDNN's RNN primitives spend longer setting up each step and waking their
// threads than multiplying (Silero-sized: 1.3x ONNX Runtime at 100 steps, and at two
// threads on a busy machine a barrier per step made a 20 us layer take 17 ms).
//
// Here the input projections of all steps come first, X [T*N, I] times W^T, as one
// register-tiled product; then each step adds h_{t-1} times R^T (a few rows against
// weights packed [H][gates * Hp] that stay in L2) and applies the gates with the vector
// math of simd.h. Gate blocks are padded to Hp, a multiple of 16 floats, so every vector
// op is whole. Threads take whole sequences (a direction, a group of batch rows) and never
// wait for each other within a run. Each batch row keeps its own sequence_lens.
#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "runtime/cpu/cpu_common.h"
#include "runtime/cpu/rnn.h"
#include "runtime/cpu/simd.h"
#include "slim/core/convert.h"

namespace slim::cpu {
namespace {

using ref::RnnActivation;
using ref::RnnKind;

constexpr int64_t kPad = 16;  // the widest vector, in floats

// Weights and work buffers start on a cache line: a vector load that straddles two
// lines costs two, which halved the recurrent product's speed (65 -> 120 GB/s from L2).
template <typename T>
struct LineAllocator {
  using value_type = T;
  LineAllocator() = default;
  template <typename U>
  LineAllocator(const LineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  bool operator==(const LineAllocator&) const { return true; }
};
using Floats = std::vector<float, LineAllocator<float>>;
// Input projections of at least this many rows (steps times batch) go to oneDNN's matmul,
// whose GEMM beats the tiles here several times over; fewer rows are a few dot products.
constexpr int64_t kDnnlRows = 8;
// Work (multiply-adds) worth a thread of its own. A parallel region ends in a barrier
// that waits for its slowest thread: on a busy machine, where a thread can wait several
// milliseconds for a core, a 2-thread projection of a 100-step LSTM took 15 ms instead
// of 0.1. Smaller work stays on one thread.
constexpr int64_t kParallelMacs = int64_t(1) << 23;
int64_t padded(int64_t n) { return (n + kPad - 1) / kPad * kPad; }

// x in every lane, as one broadcast: simd.h's element loop became W masked inserts here.
// (A -0 becomes +0, which no product or sum here can tell apart.)
template <int W>
SLIM_INLINE typename Vec<W>::F bcast(float x) {
  return typename Vec<W>::F{} + x;
}

// c[ROWS][NV * W] += a[ROWS][k] * b[k][NV * W]; b's rows are ldb floats apart.
template <int W, int ROWS, int NV>
SLIM_INLINE void mm_tile(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k, float* c, int64_t ldc) {
  using F = typename Vec<W>::F;
  F acc[ROWS][NV];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = load<W>(c + r * ldc + v * W);
  for (int64_t j = 0; j < k; ++j) {
    F bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load<W>(b + j * ldb + v * W);
    for (int r = 0; r < ROWS; ++r) {
      const F av = bcast<W>(a[r * lda + j]);
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) store<W>(c + r * ldc + v * W, acc[r][v]);
}

// Columns [0, n) of one panel (its rows ldb floats apart) for ROWS rows of a.
template <int W, int ROWS, int NV>
SLIM_INLINE void mm_rows(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t n, int64_t k, float* c,
                         int64_t ldc) {
  int64_t col = 0;
  for (; col + NV * W <= n; col += NV * W) mm_tile<W, ROWS, NV>(a, lda, b + col, ldb, k, c + col, ldc);
  for (; col < n; col += W) mm_tile<W, ROWS, 1>(a, lda, b + col, ldb, k, c + col, ldc);
}

// Packed weights are panels of up to kPanel columns, each k rows of its width one after
// the other, so a product streams through memory instead of striding over whole rows
// (the recurrent weights come from L2 at every step).
constexpr int64_t kPanel = 128;
size_t panel_at(int64_t row, int64_t col, int64_t k, int64_t n) {
  const int64_t p0 = col / kPanel * kPanel, w = std::min(kPanel, n - p0);
  return size_t(p0 * k + row * w + col - p0);
}

// c[rows][n] += a[rows][k] * b[k][n], b packed in panels, n a multiple of W. Four rows
// share each load of b; a single row (batch 1) keeps eight independent sums in flight
// instead. AVX2 has half AVX-512's registers, so its four-row tiles are half as wide.
template <int W>
SLIM_INLINE void matmul_acc(const float* a, int64_t lda, int64_t rows, const float* b, int64_t n, int64_t k, float* c,
                            int64_t ldc) {
  constexpr int kWide = W >= 16 ? 4 : 2;
  for (int64_t p0 = 0; p0 < n; p0 += kPanel) {
    const int64_t w = std::min(kPanel, n - p0);
    const float* panel = b + p0 * k;
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) mm_rows<W, 4, kWide>(a + r * lda, lda, panel, w, w, k, c + r * ldc + p0, ldc);
    for (; r < rows; ++r) mm_rows<W, 1, 8>(a + r * lda, lda, panel, w, w, k, c + r * ldc + p0, ldc);
  }
}

class CellRnnKernel final : public OpKernel {
 public:
  CellRnnKernel(const KernelBuildInfo& info, const RnnSetup& s)
      : s_(s), hp_(padded(s.H)), ghp_(s.a.gates * hp_) {
    const int64_t D = s.D, G = s.a.gates, H = s.H, I = s.I;
    const bool gru = s.a.kind == RnnKind::gru;
    const Tensor w = info.input(1).constant->contiguous(), r = info.input(2).constant->contiguous();
    wx_.assign(size_t(D * I * ghp_), 0.f);
    rec_.assign(size_t(D * H * rec_width()), 0.f);
    if (gru) rec_h_.assign(size_t(D * H * hp_), 0.f);
    bias_.assign(size_t(D * ghp_), 0.f);
    if (gru) rbh_.assign(size_t(D * hp_), 0.f);
    for (int64_t d = 0; d < D; ++d)
      for (int64_t g = 0; g < G; ++g)
        for (int64_t o = 0; o < H; ++o) {
          const int64_t row = d * G * H + g * H + o;
          for (int64_t i = 0; i < I; ++i)
            wx_[size_t(d * I * ghp_) + panel_at(i, g * hp_ + o, I, ghp_)] = w.data<float>()[row * I + i];
          for (int64_t i = 0; i < H; ++i) {
            const float v = r.data<float>()[row * H + i];
            if (gru && g == 2)
              rec_h_[size_t(d * H * hp_) + panel_at(i, o, H, hp_)] = v;
            else
              rec_[size_t(d * H * rec_width()) + panel_at(i, g * hp_ + o, H, rec_width())] = v;
          }
        }
    if (s.has_b) {
      const Tensor b = info.input(3).constant->contiguous();
      for (int64_t d = 0; d < D; ++d)
        for (int64_t g = 0; g < G; ++g)
          for (int64_t o = 0; o < H; ++o) {
            const float wb = b.data<float>()[d * 2 * G * H + g * H + o], rb = b.data<float>()[d * 2 * G * H + (G + g) * H + o];
            // GRU's Rbh sits inside the reset gate's product (or next to it): kept apart.
            bias_[size_t(d * ghp_ + g * hp_ + o)] = wb + (gru && g == 2 ? 0.f : rb);
            if (gru && g == 2) rbh_[size_t(d * hp_ + o)] = rb;
          }
    }
    if (s.has_p) {
      const Tensor p = info.input(7).constant->contiguous();
      peep_.assign(size_t(D * 3 * hp_), 0.f);
      for (int64_t d = 0; d < D; ++d)
        for (int64_t g = 0; g < 3; ++g)
          std::copy_n(p.data<float>() + (d * 3 + g) * H, H, &peep_[size_t((d * 3 + g) * hp_)]);
    }
    xw_.resize(size_t(D * s.T * s.N * ghp_));
    if (s.T * s.N >= kDnnlRows) dnnl_call(info.node, "RNN input projection setup", [&] { setup_projection(); return 0; });
    h_.resize(size_t(D * s.N * hp_));
    c_.resize(size_t(D * s.N * hp_));
  }

  bool static_output(int i, DType* dtype, Shape* shape) const override {
    if (i < 0 || i > (s_.a.kind == RnnKind::lstm ? 2 : 1)) return false;
    *dtype = DType::f32;
    *shape = i == 0 ? y_shape() : state_shape();
    return true;
  }

  void compute(KernelContext& ctx) const override {
    const bool batch_first = s_.a.layout == 1;
    const int64_t T = s_.T, N = s_.N, D = s_.D, H = s_.H, hp = hp_;
    check_input_shape(ctx, 0, batch_first ? Shape{N, T, s_.I} : Shape{T, N, s_.I});
    std::vector<int64_t> lens(size_t(N), T);
    if (const Tensor* l = ctx.input(4)) {
      if (!dtype_is_integer(l->dtype()) || l->shape() != Shape{N})
        ctx.fail(ErrorCode::invalid_argument, "sequence_lens must be an integer tensor of shape " + shape_str({N}) +
                                                  ", got " + l->describe());
      lens = tensor_to_int64s(*l);
      for (int64_t len : lens)
        if (len < 0 || len > T)
          ctx.fail(ErrorCode::invalid_argument, "sequence_lens holds " + std::to_string(len) + ", outside [0, " +
                                                    std::to_string(T) + "]");
    }
    const bool lstm = s_.a.kind == RnnKind::lstm;
    for (int k = 0; k < (lstm ? 2 : 1); ++k) {
      Floats& state = k == 0 ? h_ : c_;
      std::fill(state.begin(), state.end(), 0.f);
      if (const Tensor* t = ctx.input(5 + k)) {
        check_input_shape(ctx, 5 + k, state_shape());
        for (int64_t d = 0; d < D; ++d)
          for (int64_t n = 0; n < N; ++n)
            std::memcpy(&state[size_t((d * N + n) * hp)], t->data<float>() + state_at(d, n), size_t(H) * 4);
      }
    }
    float* y = ctx.output_wanted(0) ? ctx.output(0, DType::f32, y_shape()).data<float>() : nullptr;
    if (y && ctx.input(4)) std::fill_n(y, shape_numel(y_shape()), 0.f);  // steps past a length

    // The input projections of every step, then each direction and group of rows alone.
    const float* x = ctx.required_input(0).data<float>();
    if (proj_) {
      limit_dnnl_threads(ctx, proj_macs_, kParallelMacs);
      dnnl_call(ctx.node(), "RNN input projection", [&] {
        x_mem_.set_data_handle(const_cast<float*>(x));
        for (int64_t d = 0; d < D; ++d) {
          xw_mem_.set_data_handle(xw_.data() + d * T * N * ghp_);
          proj_.execute(stream_, {{DNNL_ARG_SRC, x_mem_}, {DNNL_ARG_WEIGHTS, proj_w_[size_t(d)]},
                                  {DNNL_ARG_BIAS, proj_b_[size_t(d)]}, {DNNL_ARG_DST, xw_mem_}});
        }
        stream_.wait();
        return 0;
      });
    } else {
      for (int64_t d = 0; d < D; ++d) project_any(x, d, T * N);
    }
    const int64_t groups = std::max<int64_t>(1, std::min<int64_t>(N, ctx.pool().num_threads() / D));
    parallel_items(ctx, D * groups, T * ((N + groups - 1) / groups) * ghp_ * H, kParallelMacs, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t d = item / groups, g = item % groups;
        run_any(d, N * g / groups, N * (g + 1) / groups, lens.data(), y);
      }
    });

    for (int k = 1; k < (lstm ? 3 : 2); ++k) {
      if (!ctx.output_wanted(k)) continue;
      float* out = ctx.output(k, DType::f32, state_shape()).data<float>();
      const Floats& state = k == 1 ? h_ : c_;
      for (int64_t d = 0; d < D; ++d)
        for (int64_t n = 0; n < N; ++n) {
          float* dst = out + state_at(d, n);
          // A sequence of length 0 ends in zero states, as in ref and ONNX Runtime.
          if (lens[size_t(n)] == 0)
            std::fill_n(dst, H, 0.f);
          else
            std::memcpy(dst, &state[size_t((d * N + n) * hp)], size_t(H) * 4);
        }
    }
  }

 private:
  Shape y_shape() const { return s_.a.layout == 1 ? Shape{s_.N, s_.T, s_.D, s_.H} : Shape{s_.T, s_.D, s_.N, s_.H}; }
  Shape state_shape() const { return s_.a.layout == 1 ? Shape{s_.N, s_.D, s_.H} : Shape{s_.D, s_.N, s_.H}; }
  int64_t state_at(int64_t d, int64_t n) const { return (s_.a.layout == 1 ? n * s_.D + d : d * s_.N + n) * s_.H; }
  // Columns of the packed recurrent weights: all gates, or GRU's z and r (h apart).
  int64_t rec_width() const { return s_.a.kind == RnnKind::gru ? 2 * hp_ : ghp_; }

  // The n rows of xw of direction d: bias + x W^T.
  template <int W>
  SLIM_INLINE void project(const float* x, int64_t d, int64_t n) const {
    float* out = const_cast<float*>(xw_.data()) + d * s_.T * s_.N * ghp_;
    for (int64_t r = 0; r < n; ++r) std::memcpy(out + r * ghp_, &bias_[size_t(d * ghp_)], size_t(ghp_) * 4);
    matmul_acc<W>(x, s_.I, n, &wx_[size_t(d * s_.I * ghp_)], ghp_, s_.I, out, ghp_);
  }

  // Runs direction d over all steps for batch rows [n0, n1).
  template <int W>
  SLIM_INLINE void run(int64_t d, int64_t n0, int64_t n1, const int64_t* lens, float* y) const {
    using F = typename Vec<W>::F;
    const int64_t T = s_.T, N = s_.N, D = s_.D, H = s_.H, hp = hp_, ghp = ghp_, rows = n1 - n0;
    const bool batch_first = s_.a.layout == 1, backwards = s_.a.reverse || d == 1;
    const RnnKind kind = s_.a.kind;
    const bool lbr = s_.a.linear_before_reset;
    float* h = const_cast<float*>(h_.data()) + (d * N + n0) * hp;
    float* c = const_cast<float*>(c_.data()) + (d * N + n0) * hp;
    const float* xw = xw_.data() + d * T * N * ghp;
    const float* rec = &rec_[size_t(d * H * rec_width())];
    const float* peep = s_.has_p ? &peep_[size_t(d * 3 * hp)] : nullptr;
    Floats g(size_t(rows * ghp)), gh, rh;
    if (kind == RnnKind::gru) gh.resize(size_t(rows * hp)), rh.resize(size_t(rows * hp));
    std::vector<int64_t> t_of(static_cast<size_t>(rows));
    const int64_t steps = *std::max_element(lens + n0, lens + n1);
    const F zero = splat<W>(0.f), one = splat<W>(1.f), alpha = bcast<W>(s_.alpha);
    for (int64_t s = 0; s < steps; ++s) {
      for (int64_t j = 0; j < rows; ++j) {
        const int64_t n = n0 + j, len = lens[n];
        t_of[size_t(j)] = s < len ? (backwards ? len - 1 - s : s) : -1;  // -1: this row has ended
        if (t_of[size_t(j)] >= 0)
          std::memcpy(&g[size_t(j * ghp)], xw + (batch_first ? n * T + t_of[size_t(j)] : t_of[size_t(j)] * N + n) * ghp,
                      size_t(ghp) * 4);
      }
      matmul_acc<W>(h, hp, rows, rec, rec_width(), H, g.data(), ghp);
      if (kind == RnnKind::gru) {
        const float* rec_h = &rec_h_[size_t(d * H * hp)];
        for (int64_t j = 0; j < rows; ++j) {
          float* gj = &g[size_t(j * ghp)];
          for (int64_t k = 0; k < hp; k += W) {
            store<W>(gj + k, vsigmoid<W>(load<W>(gj + k)));                  // z
            const F r = vsigmoid<W>(load<W>(gj + hp + k));
            store<W>(gj + hp + k, r);
            store<W>(&rh[size_t(j * hp + k)], r * load<W>(h + j * hp + k));
          }
          std::memcpy(&gh[size_t(j * hp)], &rbh_[size_t(d * hp)], size_t(hp) * 4);
        }
        // linear_before_reset: r (.) (h R_h^T + Rbh); otherwise (r (.) h) R_h^T + Rbh.
        matmul_acc<W>(lbr ? h : rh.data(), hp, rows, rec_h, hp, H, gh.data(), hp);
      }
      for (int64_t j = 0; j < rows; ++j) {
        const int64_t t = t_of[size_t(j)];
        if (t < 0) continue;
        float* gj = &g[size_t(j * ghp)];
        float* hj = h + j * hp;
        float* cj = c + j * hp;
        for (int64_t k = 0; k < hp; k += W) {
          switch (kind) {
            case RnnKind::lstm: {  // gates i, o, f, c; peepholes i, o, f
              F gi = load<W>(gj + k), go = load<W>(gj + hp + k), gf = load<W>(gj + 2 * hp + k);
              const F cp = load<W>(cj + k);
              if (peep) gi += load<W>(peep + k) * cp, gf += load<W>(peep + 2 * hp + k) * cp;
              const F cn = vsigmoid<W>(gf) * cp + vsigmoid<W>(gi) * vtanh<W>(load<W>(gj + 3 * hp + k));
              if (peep) go += load<W>(peep + hp + k) * cn;
              store<W>(cj + k, cn);
              store<W>(hj + k, vsigmoid<W>(go) * vtanh<W>(cn));
              break;
            }
            case RnnKind::gru: {
              const F z = load<W>(gj + k), r = load<W>(gj + hp + k), hh = load<W>(&gh[size_t(j * hp + k)]);
              const F cand = vtanh<W>(load<W>(gj + 2 * hp + k) + (lbr ? r * hh : hh));
              store<W>(hj + k, (one - z) * cand + z * load<W>(hj + k));
              break;
            }
            case RnnKind::rnn: {
              const F v = load<W>(gj + k);
              F out;
              switch (s_.activation) {
                case dnnl::algorithm::eltwise_logistic: out = vsigmoid<W>(v); break;
                case dnnl::algorithm::eltwise_relu: out = v >= zero ? v : alpha * v; break;
                default: out = vtanh<W>(v); break;
              }
              store<W>(hj + k, out);
              break;
            }
          }
        }
        if (y) {
          const int64_t n = n0 + j;
          std::memcpy(y + (batch_first ? (n * T + t) * D + d : (t * D + d) * N + n) * H, hj, size_t(H) * 4);
        }
      }
    }
  }

#if defined(__x86_64__)
  __attribute__((target("avx512f"))) void project_avx512(const float* x, int64_t d, int64_t n) const {
    project<16>(x, d, n);
  }
  __attribute__((target("avx2,fma"))) void project_avx2(const float* x, int64_t d, int64_t n) const {
    project<8>(x, d, n);
  }
  __attribute__((target("avx512f"))) void run_avx512(int64_t d, int64_t n0, int64_t n1, const int64_t* lens, float* y) const {
    run<16>(d, n0, n1, lens, y);
  }
  __attribute__((target("avx2,fma"))) void run_avx2(int64_t d, int64_t n0, int64_t n1, const int64_t* lens, float* y) const {
    run<8>(d, n0, n1, lens, y);
  }
#endif
  void project_any(const float* x, int64_t d, int64_t n) const {
    switch (detected_isa()) {
#if defined(__x86_64__)
      case Isa::avx512: return project_avx512(x, d, n);
      case Isa::avx2: return project_avx2(x, d, n);
#elif defined(__aarch64__)
      case Isa::neon: return project<4>(x, d, n);  // ASIMD is aarch64's baseline
#endif
      default: return project<1>(x, d, n);
    }
  }

  // oneDNN's matmul for the projections of many steps: W^T [I][ghp] and the bias packed
  // once per direction into the layout it picks.
  void setup_projection() {
    proj_macs_ = s_.D * s_.T * s_.N * s_.I * ghp_;
    limit_dnnl_threads_at_build(proj_macs_, kParallelMacs);
    const auto& eng = dnnl_engine();
    stream_ = dnnl::stream(eng);
    const int64_t rows = s_.T * s_.N, I = s_.I;
    using dnnl::memory;
    const memory::desc x_md = plain_md({rows, I}), y_md = plain_md({rows, ghp_}), b_md = plain_md({1, ghp_});
    const memory::desc w_md(to_dims({I, ghp_}), memory::data_type::f32, memory::format_tag::any);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(x_md, w_md, b_md, y_md), eng);
    proj_ = dnnl::matmul(pd);
    x_mem_ = memory(x_md, eng, DNNL_MEMORY_NONE);
    xw_mem_ = memory(y_md, eng, DNNL_MEMORY_NONE);
    std::vector<float> plain(size_t(I * ghp_));
    for (int64_t d = 0; d < s_.D; ++d) {
      for (int64_t i = 0; i < I; ++i)
        for (int64_t c = 0; c < ghp_; ++c)
          plain[size_t(i * ghp_ + c)] = wx_[size_t(d * I * ghp_) + panel_at(i, c, I, ghp_)];
      memory user(plain_md({I, ghp_}), eng, plain.data());
      proj_w_.push_back(owned_memory(pd.weights_desc(), eng, buffers_));
      dnnl::reorder(user, proj_w_.back()).execute(stream_, user, proj_w_.back());
      proj_b_.push_back(memory(b_md, eng, const_cast<float*>(&bias_[size_t(d * ghp_)])));
    }
    stream_.wait();
  }
  void run_any(int64_t d, int64_t n0, int64_t n1, const int64_t* lens, float* y) const {
    switch (detected_isa()) {
#if defined(__x86_64__)
      case Isa::avx512: return run_avx512(d, n0, n1, lens, y);
      case Isa::avx2: return run_avx2(d, n0, n1, lens, y);
#elif defined(__aarch64__)
      case Isa::neon: return run<4>(d, n0, n1, lens, y);
#endif
      default: return run<1>(d, n0, n1, lens, y);
    }
  }

  RnnSetup s_;
  int64_t hp_, ghp_;  // hidden and all gates, padded: gate g's block starts at g * hp_
  // Per direction, packed in panels: W^T [I][ghp]; R^T [H][rec_width()] and GRU's h
  // block [H][hp]. Then the input bias (Wb + Rb; GRU's h gate Wbh alone), GRU's Rbh and
  // the peepholes i, o, f.
  Floats wx_, rec_, rec_h_, bias_, rbh_, peep_;
  // The step projections [D][T*N][ghp] and the running states [D][N][hp].
  mutable Floats xw_, h_, c_;
  // From kDnnlRows rows on, oneDNN's matmul computes the projections.
  dnnl::matmul proj_;
  int64_t proj_macs_ = 0;
  std::vector<dnnl::memory> proj_w_, proj_b_;
  std::vector<std::shared_ptr<Storage>> buffers_;  // behind proj_w_
  mutable dnnl::memory x_mem_, xw_mem_;
  mutable dnnl::stream stream_;
};

}  // namespace

bool rnn_cells_suit(const RnnSetup& s) { return s.weights_constant && s.N <= 8; }

std::unique_ptr<OpKernel> make_rnn_cell_kernel(const KernelBuildInfo& info, const RnnSetup& s) {
  return std::make_unique<CellRnnKernel>(info, s);
}

}  // namespace slim::cpu
