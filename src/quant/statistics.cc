#include "slim/quant/statistics.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "slim/core/error.h"

namespace slim::quant {

namespace {

// All-zero tensors: any later width is larger, and zeros stay in bin 0 when bins merge.
constexpr int kZeroExponent = -200;

}  // namespace

int histogram_exponent(double absmax, int half_bins) {
  if (!(absmax > 0)) return kZeroExponent;
  int e = 0;
  std::frexp(absmax / half_bins, &e);  // absmax/half_bins = m·2^e, m in [0.5, 1): 2^e > it
  return e;
}

double Histogram::bin_width() const {
  return std::ldexp(1.0, exponent_);
}

void Histogram::assign(int half_bins, int exponent, std::vector<double> counts) {
  check(half_bins > 0 && (counts.empty() || counts.size() == size_t(2 * half_bins)),
        ErrorCode::invalid_argument,
        "histogram: " + std::to_string(counts.size()) + " counts for " + std::to_string(half_bins) +
            " bins a side");
  half_bins_ = half_bins;
  exponent_ = exponent;
  counts_ = std::move(counts);
}

void Histogram::widen(int exponent) {
  const int d = exponent - exponent_;
  if (d <= 0) return;
  std::vector<double> out(counts_.size(), 0.0);
  for (size_t i = 0; i < counts_.size(); ++i) {
    if (counts_[i] == 0) continue;
    const int64_t k = int64_t(i) - half_bins_;
    const int64_t merged = d >= 62 ? (k < 0 ? -1 : 0) : (k >> d);  // floor(k / 2^d)
    out[size_t(merged + half_bins_)] += counts_[i];
  }
  counts_ = std::move(out);
  exponent_ = exponent;
}

void Histogram::add(const float* x, int64_t n, float absmax) {
  if (n <= 0) return;
  const int e = histogram_exponent(absmax, half_bins_);
  if (counts_.empty()) {
    counts_.assign(size_t(2 * half_bins_), 0.0);
    exponent_ = e;
  } else if (e > exponent_) {
    widen(e);
  }
  const double inv = std::ldexp(1.0, -exponent_);  // exact: the width is a power of two
  const int64_t last = 2 * int64_t(half_bins_) - 1;
  double* c = counts_.data();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = int64_t(std::floor(double(x[i]) * inv)) + half_bins_;
    ++c[std::clamp<int64_t>(k, 0, last)];
  }
}

void Histogram::merge(const Histogram& other) {
  if (other.empty()) return;
  check(other.half_bins_ == half_bins_, ErrorCode::internal,
        "histogram merge: different bin counts");
  if (empty()) {
    *this = other;
    return;
  }
  Histogram o = other;
  const int e = std::max(exponent_, o.exponent_);
  widen(e);
  o.widen(e);
  for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += o.counts_[i];
}

std::vector<double> Histogram::abs_counts() const {
  std::vector<double> a(size_t(half_bins_), 0.0);
  if (empty()) return a;
  for (int j = 0; j < half_bins_; ++j)
    a[size_t(j)] = counts_[size_t(half_bins_ + j)] + counts_[size_t(half_bins_ - 1 - j)];
  return a;
}

void TensorStats::add(const float* x, int64_t n) {
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      ++bad;
      continue;
    }
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const int64_t good = n - bad;
  if (good > 0) {
    min = count ? std::min(min, double(lo)) : lo;
    max = count ? std::max(max, double(hi)) : hi;
    const float absmax = std::max(std::fabs(lo), std::fabs(hi));
    if (bad == 0) {
      hist.add(x, n, absmax);
    } else {
      std::vector<float> finite;
      finite.reserve(size_t(good));
      for (int64_t i = 0; i < n; ++i)
        if (std::isfinite(x[i])) finite.push_back(x[i]);
      hist.add(finite.data(), good, absmax);
    }
  }
  count += good;
  nonfinite += bad;
}

void TensorStats::add_channels(const float* x, int64_t outer, int64_t channels, int64_t inner,
                               bool histograms) {
  ChannelStats& cs = this->channels;
  if (cs.sum.empty()) {
    cs.sum.assign(size_t(channels), 0.0);
    cs.absmax.assign(size_t(channels), 0.0);
    if (histograms) cs.hist.assign(size_t(channels), Histogram(ChannelStats::kChannelHalfBins));
  }
  check(int64_t(cs.sum.size()) == channels, ErrorCode::invalid_argument,
        "channel statistics: " + std::to_string(channels) + " channels after " +
            std::to_string(cs.sum.size()));
  std::vector<float> values(size_t(outer * inner));
  for (int64_t c = 0; c < channels; ++c) {
    size_t n = 0;
    double sum = 0;
    float absmax = 0;
    for (int64_t o = 0; o < outer; ++o) {
      const float* row = x + (o * channels + c) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        if (!std::isfinite(row[i])) continue;
        values[n++] = row[i];
        sum += row[i];
        absmax = std::max(absmax, std::fabs(row[i]));
      }
    }
    cs.sum[size_t(c)] += sum;
    cs.absmax[size_t(c)] = std::max(cs.absmax[size_t(c)], double(absmax));
    if (!cs.hist.empty()) cs.hist[size_t(c)].add(values.data(), int64_t(n), absmax);
  }
  cs.count_per_channel += outer * inner;
}

void TensorStats::merge(const TensorStats& o) {
  if (o.count) {
    min = count ? std::min(min, o.min) : o.min;
    max = count ? std::max(max, o.max) : o.max;
  }
  count += o.count;
  nonfinite += o.nonfinite;
  hist.merge(o.hist);
  ChannelStats& cs = channels;
  if (o.channels.sum.empty()) return;
  if (cs.sum.empty()) {
    cs = o.channels;
    return;
  }
  check(cs.sum.size() == o.channels.sum.size(), ErrorCode::internal,
        "channel statistics: channel counts differ");
  for (size_t c = 0; c < cs.sum.size(); ++c) {
    cs.sum[c] += o.channels.sum[c];
    cs.absmax[c] = std::max(cs.absmax[c], o.channels.absmax[c]);
    if (c < cs.hist.size() && c < o.channels.hist.size()) cs.hist[c].merge(o.channels.hist[c]);
  }
  cs.count_per_channel += o.channels.count_per_channel;
}

// ---------------------------------------------------------------------------------------
// The cache file: "SLIMCAL" + a version byte, then per tensor its name and numbers as
// little-endian bytes. Anything unexpected makes load_stats return false, and the
// statistics are collected again.

namespace {

constexpr char kMagic[8] = {'S', 'L', 'I', 'M', 'C', 'A', 'L', 1};

struct Writer {
  std::string out;
  template <typename T>
  void put(T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void put_doubles(const std::vector<double>& v) {
    put<uint64_t>(v.size());
    out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(double));
  }
  void put_hist(const Histogram& h) {
    put<int32_t>(h.half_bins());
    put<int32_t>(h.exponent());
    put_doubles(h.counts());
  }
};

struct Reader {
  const char* p;
  const char* end;
  template <typename T>
  bool get(T& v) {
    if (size_t(end - p) < sizeof v) return false;
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    return true;
  }
  bool get_doubles(std::vector<double>& v) {
    uint64_t n = 0;
    if (!get(n) || n > uint64_t(end - p) / sizeof(double)) return false;
    v.resize(size_t(n));
    std::memcpy(v.data(), p, size_t(n) * sizeof(double));
    p += n * sizeof(double);
    return true;
  }
  bool get_hist(Histogram& h) {
    int32_t half = 0, e = 0;
    std::vector<double> counts;
    if (!get(half) || !get(e) || !get_doubles(counts)) return false;
    if (half <= 0 || half > (1 << 20) || (!counts.empty() && counts.size() != size_t(2 * half)))
      return false;
    h.assign(half, e, std::move(counts));
    return true;
  }
};

}  // namespace

void save_stats(const StatsMap& stats, const std::string& path) {
  Writer w;
  w.out.append(kMagic, sizeof kMagic);
  w.put<uint64_t>(stats.size());
  for (const auto& [name, s] : stats) {
    w.put<uint64_t>(name.size());
    w.out += name;
    w.put(s.count);
    w.put(s.nonfinite);
    w.put(s.min);
    w.put(s.max);
    w.put_hist(s.hist);
    w.put<int32_t>(s.channels.axis);
    w.put(s.channels.count_per_channel);
    w.put_doubles(s.channels.sum);
    w.put_doubles(s.channels.absmax);
    w.put<uint64_t>(s.channels.hist.size());
    for (const auto& h : s.channels.hist) w.put_hist(h);
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    check(bool(f), ErrorCode::not_found, tmp + ": cannot open for writing");
    f.write(w.out.data(), std::streamsize(w.out.size()));
    check(bool(f), ErrorCode::internal, tmp + ": write failed");
  }
  check(std::rename(tmp.c_str(), path.c_str()) == 0, ErrorCode::internal,
        path + ": cannot move the cache file in place");
}

bool load_stats(const std::string& path, StatsMap& stats) {
  stats.clear();
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  const std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  Reader r{data.data(), data.data() + data.size()};
  if (data.size() < sizeof kMagic || std::memcmp(data.data(), kMagic, sizeof kMagic) != 0)
    return false;
  r.p += sizeof kMagic;
  uint64_t n = 0;
  if (!r.get(n)) return false;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t len = 0;
    if (!r.get(len) || len > uint64_t(r.end - r.p)) return (stats.clear(), false);
    std::string name(r.p, size_t(len));
    r.p += len;
    TensorStats s;
    uint64_t nh = 0;
    if (!r.get(s.count) || !r.get(s.nonfinite) || !r.get(s.min) || !r.get(s.max) ||
        !r.get_hist(s.hist) || !r.get(s.channels.axis) || !r.get(s.channels.count_per_channel) ||
        !r.get_doubles(s.channels.sum) || !r.get_doubles(s.channels.absmax) || !r.get(nh) ||
        nh > s.channels.sum.size())
      return (stats.clear(), false);
    s.channels.hist.resize(size_t(nh));
    for (auto& h : s.channels.hist)
      if (!r.get_hist(h)) return (stats.clear(), false);
    stats.emplace(std::move(name), std::move(s));
  }
  if (r.p != r.end) return (stats.clear(), false);
  return true;
}

}  // namespace slim::quant
