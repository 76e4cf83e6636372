// Statistics of a float model's tensors over a calibration set, from which the
// calibrators (calibrators.h) choose quantization ranges: exact min/max, a histogram
// whose bins merge exactly across batches and tensors, and per-channel sums, maxima and
// histograms of the tensors that weighted ops read. docs/quantization.md has the details.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace slim::quant {

// Counts of values in 2·half_bins bins of width w = 2^exponent over [-R, R), R =
// half_bins·w: bin k holds [(k − half_bins)·w, (k − half_bins + 1)·w). The exponent is the
// smallest that covers the largest |x| seen (R > max|x|); when a larger value arrives,
// bins merge in pairs (w doubles), so every count stays exact and two histograms of
// the same size merge exactly at the larger width.
class Histogram {
 public:
  static constexpr int kDefaultHalfBins = 2048;
  explicit Histogram(int half_bins = kDefaultHalfBins) : half_bins_(half_bins) {}

  // Adds n finite values whose largest magnitude is absmax.
  void add(const float* x, int64_t n, float absmax);
  void merge(const Histogram& other);

  bool empty() const { return counts_.empty(); }
  int half_bins() const { return half_bins_; }
  int exponent() const { return exponent_; }
  double bin_width() const;
  const std::vector<double>& counts() const { return counts_; }  // 2·half_bins, or empty
  // Counts of |x|: bin j holds |x| in [j·w, (j+1)·w) (signed bins j and −j−1 folded).
  std::vector<double> abs_counts() const;

  // For the calibration cache.
  void assign(int half_bins, int exponent, std::vector<double> counts);

 private:
  void widen(int exponent);  // merges bins until the width is 2^exponent
  int half_bins_;
  int exponent_ = 0;
  std::vector<double> counts_;
};

// The smallest exponent e with half_bins·2^e > absmax (absmax ≥ 0, finite).
int histogram_exponent(double absmax, int half_bins);

// Channel statistics kept for tensors a Conv (axis 1), MatMul (last axis) or Gemm (the
// K axis of A) reads: bias correction needs the channel means, SmoothQuant the channel
// maxima and, for clipping, their histograms.
struct ChannelStats {
  int axis = -1;
  std::vector<double> sum;        // per channel
  std::vector<double> absmax;     // per channel
  std::vector<Histogram> hist;    // per channel, kChannelHalfBins each; empty if not kept
  int64_t count_per_channel = 0;  // values each channel's sum adds up
  static constexpr int kChannelHalfBins = 64;
};

struct TensorStats {
  int64_t count = 0;      // finite values seen
  int64_t nonfinite = 0;  // NaN and ±inf, left out of everything else
  double min = 0, max = 0;
  Histogram hist;
  ChannelStats channels;  // axis −1 when not kept

  // Adds a contiguous f32 tensor's values.
  void add(const float* x, int64_t n);
  // Adds its per-channel statistics, the tensor viewed as [outer, channels, inner].
  void add_channels(const float* x, int64_t outer, int64_t channels, int64_t inner,
                    bool histograms);
  void merge(const TensorStats& other);
};

using StatsMap = std::map<std::string, TensorStats>;

// The calibration cache: statistics of one (model, data, preparation) key, so a second
// `slim quantize` with other calibrator settings does not run the float model again.
void save_stats(const StatsMap& stats, const std::string& path);
// Returns false (and leaves `stats` empty) when the file is missing or not a valid cache.
bool load_stats(const std::string& path, StatsMap& stats);

}  // namespace slim::quant
