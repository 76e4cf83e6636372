#include "runtime/ref/fft.h"

#include <algorithm>
#include <cmath>

#include "slim/core/error.h"

namespace slim::ref {

namespace {

using cd = FftPlan::cd;

// Plain complex product: std::complex's operator* checks for NaN and infinity through a
// library call, several times slower in these loops.
inline cd mul(cd a, cd b) {
  return {a.real() * b.real() - a.imag() * b.imag(), a.real() * b.imag() + a.imag() * b.real()};
}
inline cd times_minus_i(cd a) { return {a.imag(), -a.real()}; }

}  // namespace

FftPlan::FftPlan(int64_t n) : n_(n) {
  if (n < 1) throw Error(ErrorCode::internal, "FftPlan: length " + std::to_string(n) + " is not positive");
  int64_t r = n;
  for (; r % 4 == 0; r /= 4) factors_.push_back(4);
  for (; r % 2 == 0; r /= 2) factors_.push_back(2);
  for (int p = 3; p <= kMaxRadix && r > 1; p += 2)
    for (; r % p == 0; r /= p) factors_.push_back(p);
  if (r == 1) {
    twiddle_.resize(size_t(n));
    for (int64_t k = 0; k < n; ++k) {
      const double a = -2.0 * M_PI * double(k) / double(n);
      twiddle_[size_t(k)] = {std::cos(a), std::sin(a)};
    }
    work_.resize(size_t(n));
    // Decimation in time reads the input in mixed-radix digit-reversed order: position
    // i of the first stage holds input perm_[i]. Each level splits a run of positions
    // into p runs, run q taking every p-th input from offset q.
    perm_.resize(size_t(n));
    std::vector<std::pair<int64_t, int64_t>> runs{{0, 1}}, next;  // (first input, input stride) per run
    for (const int p : factors_) {
      next.clear();
      for (const auto& [first, stride] : runs)
        for (int q = 0; q < p; ++q) next.emplace_back(first + q * stride, stride * p);
      runs.swap(next);
    }
    for (size_t i = 0; i < runs.size(); ++i) perm_[i] = runs[i].first;
    return;
  }
  // Bluestein: with jk = (j^2 + k^2 - (k-j)^2) / 2, X_k = c_k sum_j (x_j c_j) conj(c_{k-j}),
  // a convolution that a power-of-two transform of length m >= 2n - 1 computes cyclically.
  factors_.clear();
  int64_t m = 1;
  while (m < 2 * n - 1) m *= 2;
  pow2_ = std::make_unique<FftPlan>(m);
  chirp_.resize(size_t(n));
  for (int64_t j = 0; j < n; ++j) {
    // j^2 mod 2n keeps the angle small, so large j lose no precision.
    const auto sq = int64_t((unsigned __int128)(j) * (unsigned __int128)(j) % (unsigned __int128)(2 * n));
    const double a = -M_PI * double(sq) / double(n);
    chirp_[size_t(j)] = {std::cos(a), std::sin(a)};
  }
  chirp_fft_.assign(size_t(m), cd(0, 0));
  chirp_fft_[0] = std::conj(chirp_[0]);
  for (int64_t j = 1; j < n; ++j) chirp_fft_[size_t(j)] = chirp_fft_[size_t(m - j)] = std::conj(chirp_[size_t(j)]);
  pow2_->transform(chirp_fft_.data(), false);
  for (cd& v : chirp_fft_) v /= double(m);  // the inverse transform below leaves out 1/m
  work_.resize(size_t(m));
}

FftPlan::~FftPlan() = default;

void FftPlan::transform(cd* x, bool inverse) const {
  // The inverse is the conjugate of the forward transform of the conjugate.
  if (inverse)
    for (int64_t i = 0; i < n_; ++i) x[i] = std::conj(x[i]);
  forward(x);
  if (inverse)
    for (int64_t i = 0; i < n_; ++i) x[i] = std::conj(x[i]);
}

void FftPlan::forward(cd* x) const {
  if (pow2_) {
    const int64_t m = pow2_->size();
    for (int64_t j = 0; j < n_; ++j) work_[size_t(j)] = mul(x[j], chirp_[size_t(j)]);
    std::fill(work_.begin() + n_, work_.end(), cd(0, 0));
    pow2_->transform(work_.data(), false);
    for (int64_t j = 0; j < m; ++j) work_[size_t(j)] = mul(work_[size_t(j)], chirp_fft_[size_t(j)]);
    pow2_->transform(work_.data(), true);
    for (int64_t k = 0; k < n_; ++k) x[k] = mul(work_[size_t(k)], chirp_[size_t(k)]);
    return;
  }
  std::copy(x, x + n_, work_.begin());
  for (int64_t i = 0; i < n_; ++i) x[i] = work_[size_t(perm_[size_t(i)])];
  // Innermost factor first: blocks of span = f_l * ... * f_last combine f_l sub-transforms.
  int64_t span = 1;
  for (size_t l = factors_.size(); l-- > 0;) {
    const int p = factors_[l];
    const int64_t m = span;
    span *= p;
    for (int64_t base = 0; base < n_; base += span) butterflies(x + base, p, m, n_ / span);
  }
}

// Combines p transforms of length m stored one after the other at `out` into one of
// length p m: out[k + u m] = sum_q out[k + q m] exp(-2 pi i q k / (p m)) exp(-2 pi i q u / p).
void FftPlan::butterflies(cd* out, int p, int64_t m, int64_t ts) const {
  const cd* tw = twiddle_.data();  // exp(-2 pi i q k / (p m)) = tw[q k ts]
  if (p == 2) {
    for (int64_t k = 0; k < m; ++k) {
      const cd a = out[k], b = mul(out[k + m], tw[k * ts]);
      out[k] = a + b;
      out[k + m] = a - b;
    }
  } else if (p == 4) {
    for (int64_t k = 0; k < m; ++k) {
      const cd t0 = out[k], t1 = mul(out[k + m], tw[k * ts]);
      const cd t2 = mul(out[k + 2 * m], tw[2 * k * ts]), t3 = mul(out[k + 3 * m], tw[3 * k * ts]);
      const cd s0 = t0 + t2, s1 = t0 - t2, s2 = t1 + t3, s3 = times_minus_i(t1 - t3);
      out[k] = s0 + s2;
      out[k + m] = s1 + s3;
      out[k + 2 * m] = s0 - s2;
      out[k + 3 * m] = s1 - s3;
    }
  } else {
    // Odd p: the terms q and p - q have conjugate rotations, so with s = b_q + b_{p-q}
    // and d = b_q - b_{p-q}, outputs u and p - u are sum(c s) -/+ i sum(sin d), with
    // c = cos(2 pi q u / p): real-by-complex products, half the work of a plain sum.
    const int h = (p - 1) / 2;
    const int64_t rs = n_ / p;  // exp(-2 pi i j / p) = tw[j rs] = cos - i sin
    cd sum[kMaxRadix / 2], diff[kMaxRadix / 2];
    for (int64_t k = 0; k < m; ++k) {
      const cd b0 = out[k];
      cd total = b0;
      for (int q = 1; q <= h; ++q) {
        const cd a = mul(out[k + q * m], tw[q * k * ts]), b = mul(out[k + (p - q) * m], tw[(p - q) * k * ts]);
        sum[q - 1] = a + b;
        diff[q - 1] = a - b;
        total += sum[q - 1];
      }
      out[k] = total;
      for (int u = 1; u <= h; ++u) {
        cd re = b0, im(0, 0);
        int64_t j = 0;
        for (int q = 1; q <= h; ++q) {
          j += u;
          if (j >= p) j -= p;
          const cd w = tw[j * rs];
          re += sum[q - 1] * w.real();
          im -= diff[q - 1] * w.imag();
        }
        out[k + u * m] = re + times_minus_i(im);
        out[k + (p - u) * m] = re - times_minus_i(im);
      }
    }
  }
}

}  // namespace slim::ref
