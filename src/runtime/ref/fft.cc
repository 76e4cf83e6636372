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
    butterfly_.resize(kMaxRadix);
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
  if (factors_.empty()) return;  // n = 1
  std::copy(x, x + n_, work_.begin());
  radix_pass(work_.data(), 1, x, n_, 0);
}

// Decimation in time: the p sub-sequences in[q + p j] are transformed into out[q m ..],
// then combined by length-p butterflies with the twiddles exp(-2 pi i q k / n).
void FftPlan::radix_pass(const cd* in, int64_t stride, cd* out, int64_t n, size_t level) const {
  const int p = factors_[level];
  const int64_t m = n / p;
  if (m == 1) {
    for (int q = 0; q < p; ++q) out[q] = in[q * stride];
  } else {
    for (int q = 0; q < p; ++q) radix_pass(in + q * stride, stride * p, out + q * m, m, level + 1);
  }
  const int64_t ts = n_ / n;
  const cd* tw = twiddle_.data();
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
    const int64_t rs = n_ / p;  // exp(-2 pi i j / p) = tw[j * rs]
    cd* b = butterfly_.data();
    for (int64_t k = 0; k < m; ++k) {
      b[0] = out[k];
      for (int q = 1; q < p; ++q) b[q] = mul(out[k + q * m], tw[q * k * ts]);
      for (int u = 0; u < p; ++u) {
        cd s = b[0];
        int64_t j = 0;
        for (int q = 1; q < p; ++q) {
          j += u;
          if (j >= p) j -= p;
          s += mul(b[q], tw[j * rs]);
        }
        out[k + u * m] = s;
      }
    }
  }
}

}  // namespace slim::ref
