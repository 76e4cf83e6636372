// Complex discrete Fourier transforms of one length in double precision, O(n log n) for
// every length: mixed radix (4, 2, 3, 5 and other primes up to kMaxRadix) when n factors
// into small primes, Bluestein's chirp-z convolution over a power-of-two transform
// otherwise. Used by the DFT and STFT kernels.
#pragma once

#include <complex>
#include <cstdint>
#include <memory>
#include <vector>

namespace slim::ref {

class FftPlan {
 public:
  using cd = std::complex<double>;
  static constexpr int kMaxRadix = 64;  // a larger prime factor switches to Bluestein

  explicit FftPlan(int64_t n);
  ~FftPlan();
  int64_t size() const { return n_; }
  // In place: x[k] = sum_j x[j] exp(-/+ 2 pi i j k / n), the inverse without the 1/n.
  // Not thread-safe (the plan owns its scratch buffers): one plan per thread.
  void transform(cd* x, bool inverse) const;

 private:
  void forward(cd* x) const;
  void butterflies(cd* out, int p, int64_t m, int64_t ts) const;

  int64_t n_;
  std::vector<int> factors_;      // mixed radix, outermost first; empty with Bluestein
  std::vector<int64_t> perm_;     // input index of each position before the first stage
  std::vector<cd> twiddle_;       // exp(-2 pi i k / n), k < n
  mutable std::vector<cd> work_;  // copy of the input (mixed radix) or the padded chirp product
  // Bluestein: chirp c_j = exp(-pi i j^2 / n), the transform of the conjugate chirp
  // (padded and wrapped to m_, scaled by 1/m_), and the power-of-two plan of length m_.
  std::vector<cd> chirp_, chirp_fft_;
  std::unique_ptr<FftPlan> pow2_;
};

}  // namespace slim::ref
