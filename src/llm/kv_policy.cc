#include "slim/llm/kv_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "slim/core/error.h"

namespace slim::llm {

int KvBudget::for_length(int n_past) const {
  if (tokens > 0) return std::max(1, std::min(tokens, n_past));
  return std::max(1, int(std::ceil(ratio * double(n_past) - 1e-9)));
}

KvBudget KvBudget::parse(const std::string& text) {
  KvBudget b;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  const std::string rest(end ? end : "");
  if (text.empty() || end == text.c_str() || !(v > 0) || (rest != "" && rest != "%"))
    throw Error(ErrorCode::invalid_argument, "KV budget '" + text + "': expected a ratio (0.25), a percentage (25%) or a token count (512)");
  if (rest == "%") {
    if (v > 100) throw Error(ErrorCode::invalid_argument, "KV budget '" + text + "' is over 100%");
    b.ratio = v / 100.0;
  } else if (v <= 1.0) {
    b.ratio = v;
  } else {
    if (v != std::floor(v) || v > 1e9) throw Error(ErrorCode::invalid_argument, "KV budget '" + text + "': a token count must be a whole number");
    b.tokens = int(v);
  }
  return b;
}

std::string KvBudget::str() const {
  if (tokens > 0) return std::to_string(tokens) + " tokens";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g%%", ratio * 100.0);
  return buf;
}

void KvPolicy::budgets(const KvSelectInput& in, std::vector<int>& out) const {
  const KvLayout& L = in.cache->layout();
  out.assign(size_t(L.n_layer) * L.n_head_kv, budget_.for_length(in.n_past));
}

int64_t KvPolicy::apply(KvCache& cache, int seq, int slack) const {
  const KvLayout& L = cache.layout();
  KvSelectInput in{&cache, seq, cache.n_past(seq)};
  std::vector<int> b;
  budgets(in, b);
  std::vector<int32_t> keep;
  int64_t evicted = 0;
  for (int l = 0; l < L.n_layer; ++l)
    for (int h = 0; h < L.heads(l); ++h) {
      const KvStream& s = cache.stream(seq, l, h);
      const int budget = std::max(1, b[size_t(l) * L.n_head_kv + h]);
      if (s.n <= budget + std::max(0, slack)) continue;
      keep.clear();
      select(in, l, h, budget, keep);
      if (keep.size() > size_t(budget) || keep.empty())
        throw Error(ErrorCode::internal, name() + ": kept " + std::to_string(keep.size()) + " tokens for a budget of " +
                                             std::to_string(budget));
      evicted += s.n - int64_t(keep.size());
      cache.keep(seq, l, h, keep);
    }
  return evicted;
}

namespace {

// Keeps the first `first` and last `last` tokens of n, and fills the rest of `budget`
// with the highest-scoring tokens between them (ties to the later token).
void keep_ends_and_top(int n, int budget, int first, int last, const float* score, std::vector<int32_t>& keep) {
  budget = std::min(budget, n);
  first = std::clamp(first, 0, budget);
  last = std::clamp(last, 0, budget - first);
  const int mid_b = first, mid_e = n - last;
  const int want = budget - first - last;
  std::vector<int32_t> mid;
  if (want > 0 && score) {
    mid.resize(size_t(mid_e - mid_b));
    std::iota(mid.begin(), mid.end(), mid_b);
    std::nth_element(mid.begin(), mid.begin() + want, mid.end(), [&](int32_t a, int32_t b) {
      return score[a] != score[b] ? score[a] > score[b] : a > b;
    });
    mid.resize(size_t(want));
  } else if (want > 0) {  // no scores: the latest of the middle
    for (int i = mid_e - want; i < mid_e; ++i) mid.push_back(i);
  }
  keep.clear();
  for (int i = 0; i < first; ++i) keep.push_back(i);
  std::sort(mid.begin(), mid.end());
  keep.insert(keep.end(), mid.begin(), mid.end());
  for (int i = mid_e; i < n; ++i) keep.push_back(i);
}

// Per-layer budgets on a line: first x the budget at layer 0, (2 - first) x at the last
// layer (the mean stays the budget), rounded to nearest or down, at least 1.
void linear_layer_budgets(const KvSelectInput& in, const KvBudget& budget, double first, bool nearest,
                          std::vector<int>& out) {
  const KvLayout& L = in.cache->layout();
  const double b = budget.for_length(in.n_past);
  out.resize(size_t(L.n_layer) * L.n_head_kv);
  for (int l = 0; l < L.n_layer; ++l) {
    const double f = L.n_layer > 1 ? double(l) / double(L.n_layer - 1) : 0.5;
    const double v = b * (first + (2.0 - 2.0 * first) * f);
    for (int h = 0; h < L.heads(l); ++h)
      out[size_t(l) * L.n_head_kv + h] = std::max(1, int(nearest ? std::lround(v) : std::floor(v)));
  }
}

class FullPolicy : public KvPolicy {
 public:
  FullPolicy() : KvPolicy(KvBudget{}) {}
  std::string name() const override { return "full"; }
  void budgets(const KvSelectInput& in, std::vector<int>& out) const override {
    const KvLayout& L = in.cache->layout();
    out.assign(size_t(L.n_layer) * L.n_head_kv, std::max(1, in.cache->max_tokens()));
  }
  void select(const KvSelectInput& in, int l, int h, int, std::vector<int32_t>& keep) const override {
    keep.resize(size_t(in.cache->stream(in.seq, l, h).n));
    std::iota(keep.begin(), keep.end(), 0);
  }
};

class StreamingPolicy : public KvPolicy {
 public:
  StreamingPolicy(KvBudget b, int sinks) : KvPolicy(b), sinks_(sinks) {}
  std::string name() const override { return "streaming"; }
  void select(const KvSelectInput& in, int l, int h, int budget, std::vector<int32_t>& keep) const override {
    const int n = in.cache->stream(in.seq, l, h).n;
    keep_ends_and_top(n, budget, sinks_, budget, nullptr, keep);
  }

 private:
  int sinks_;
};

class H2oPolicy : public KvPolicy {
 public:
  H2oPolicy(KvBudget b, double recent) : KvPolicy(b), recent_(recent) {}
  std::string name() const override { return "h2o"; }
  int observe_window() const override { return -1; }
  KvObserver observer() const override { return {true, false}; }
  void select(const KvSelectInput& in, int l, int h, int budget, std::vector<int32_t>& keep) const override {
    const KvStream& s = in.cache->stream(in.seq, l, h);
    keep_ends_and_top(s.n, budget, 0, int(std::lround(recent_ * budget)), s.score.data(), keep);
  }

 private:
  double recent_;
};

// SnapKV's selection: observed attention max-pooled over neighbouring positions, so a kept
// token brings the context around it; the most recent `window` tokens always stay.
class SnapPolicy : public KvPolicy {
 public:
  SnapPolicy(KvBudget b, int window, int kernel) : KvPolicy(b), window_(window), kernel_(kernel) {}
  std::string name() const override { return "snapkv"; }
  int observe_window() const override { return window_; }
  KvObserver observer() const override { return {true, false}; }
  void select(const KvSelectInput& in, int l, int h, int budget, std::vector<int32_t>& keep) const override {
    const KvStream& s = in.cache->stream(in.seq, l, h);
    // Local, not a member: one policy object may serve contexts on several threads.
    std::vector<float> pooled(size_t(s.n));
    const int r = kernel_ / 2;
    for (int i = 0; i < s.n; ++i) {
      float m = 0;
      for (int j = std::max(0, i - r); j <= std::min(s.n - 1, i + r); ++j) m = std::max(m, s.score[size_t(j)]);
      pooled[size_t(i)] = m;
    }
    keep_ends_and_top(s.n, budget, 0, std::min(window_, budget / 2), pooled.data(), keep);
  }

 protected:
  int window_, kernel_;
};

class PyramidPolicy : public SnapPolicy {
 public:
  PyramidPolicy(KvBudget b, double top, int window, int kernel) : SnapPolicy(b, window, kernel), top_(top) {}
  std::string name() const override { return "pyramid"; }
  void budgets(const KvSelectInput& in, std::vector<int>& out) const override {
    linear_layer_budgets(in, budget_, 2.0 - top_, true, out);
  }

 private:
  double top_;
};

class EntropyPolicy : public SnapPolicy {
 public:
  EntropyPolicy(KvBudget b, double min_share, int window, int kernel) : SnapPolicy(b, window, kernel), min_share_(min_share) {}
  std::string name() const override { return "entropy"; }
  KvObserver observer() const override { return {true, true}; }
  void budgets(const KvSelectInput& in, std::vector<int>& out) const override {
    const KvLayout& L = in.cache->layout();
    const double b = budget_.for_length(in.n_past);
    out.resize(size_t(L.n_layer) * L.n_head_kv);
    std::vector<double> w(size_t(L.n_head_kv));
    for (int l = 0; l < L.n_layer; ++l) {
      double total_w = 0;
      bool known = true;
      const int heads = L.heads(l);
      for (int h = 0; h < heads; ++h) {
        const KvStream& s = in.cache->stream(in.seq, l, h);
        known = known && s.entropy_count > 0;
        w[size_t(h)] = s.entropy_count > 0 ? std::exp(s.entropy_sum / double(s.entropy_count)) : 1.0;
        total_w += w[size_t(h)];
      }
      const double floor_b = min_share_ * b;
      const double spare = std::max(0.0, b * heads - floor_b * heads);
      for (int h = 0; h < heads; ++h) {
        const double share = known ? w[size_t(h)] / total_w : 1.0 / heads;
        out[size_t(l) * L.n_head_kv + h] = std::max(1, int(std::floor(floor_b + spare * share)));
      }
    }
  }

 private:
  double min_share_;
};

// Decayed heavy hitters (optionally weighted by value norms) plus sinks and a recent
// window, with budgets rising with depth.
class LayeredPolicy : public KvPolicy {
 public:
  LayeredPolicy(KvBudget b, double bottom, double recent, int sinks, float decay, bool value_weighted)
      : KvPolicy(b), bottom_(bottom), recent_(recent), sinks_(sinks), decay_(decay), value_weighted_(value_weighted) {}
  std::string name() const override { return "layered"; }
  int observe_window() const override { return -1; }
  KvObserver observer() const override {
    KvObserver o{true, false};
    o.decay = decay_;
    return o;
  }
  void budgets(const KvSelectInput& in, std::vector<int>& out) const override {
    linear_layer_budgets(in, budget_, bottom_, false, out);
  }
  void select(const KvSelectInput& in, int l, int h, int budget, std::vector<int32_t>& keep) const override {
    const KvStream& s = in.cache->stream(in.seq, l, h);
    const int recent = int(std::lround(recent_ * budget_.for_length(in.n_past)));
    if (!value_weighted_) return keep_ends_and_top(s.n, budget, sinks_, recent, s.score.data(), keep);
    // A token's share of the output is its attention times its value: one that draws
    // attention but carries a near-zero value (as sink-like tokens do) matters less.
    std::vector<float> weighted(static_cast<size_t>(s.n));
    for (int i = 0; i < s.n; ++i) weighted[size_t(i)] = s.score[size_t(i)] * s.value_norm[size_t(i)];
    keep_ends_and_top(s.n, budget, sinks_, recent, weighted.data(), keep);
  }

 private:
  double bottom_, recent_;
  int sinks_;
  float decay_;
  bool value_weighted_;
};

}  // namespace

std::unique_ptr<KvPolicy> make_full_policy() { return std::make_unique<FullPolicy>(); }

std::unique_ptr<KvPolicy> make_streaming_policy(KvBudget budget, int sinks) {
  check(sinks >= 0, ErrorCode::invalid_argument, "streaming: sink count must be >= 0");
  return std::make_unique<StreamingPolicy>(budget, sinks);
}

std::unique_ptr<KvPolicy> make_h2o_policy(KvBudget budget, double recent_share) {
  check(recent_share >= 0 && recent_share <= 1, ErrorCode::invalid_argument, "h2o: recent share must be within 0..1");
  return std::make_unique<H2oPolicy>(budget, recent_share);
}

std::unique_ptr<KvPolicy> make_snapkv_policy(KvBudget budget, int window, int kernel) {
  check(window > 0 && kernel > 0, ErrorCode::invalid_argument, "snapkv: window and kernel must be positive");
  return std::make_unique<SnapPolicy>(budget, window, kernel);
}

std::unique_ptr<KvPolicy> make_pyramid_policy(KvBudget budget, double top_share, int window, int kernel) {
  check(top_share > 0 && top_share <= 1, ErrorCode::invalid_argument, "pyramid: top share must be within (0, 1]");
  check(window > 0 && kernel > 0, ErrorCode::invalid_argument, "pyramid: window and kernel must be positive");
  return std::make_unique<PyramidPolicy>(budget, top_share, window, kernel);
}

std::unique_ptr<KvPolicy> make_entropy_policy(KvBudget budget, double min_share, int window, int kernel) {
  check(min_share >= 0 && min_share <= 1, ErrorCode::invalid_argument, "entropy: min share must be within 0..1");
  check(window > 0 && kernel > 0, ErrorCode::invalid_argument, "entropy: window and kernel must be positive");
  return std::make_unique<EntropyPolicy>(budget, min_share, window, kernel);
}

std::unique_ptr<KvPolicy> make_layered_policy(KvBudget budget, double bottom_share, double recent_share, int sinks,
                                              double decay, bool value_weighted) {
  check(bottom_share > 0 && bottom_share <= 1, ErrorCode::invalid_argument, "layered: bottom share must be within (0, 1]");
  check(recent_share >= 0 && recent_share <= 1, ErrorCode::invalid_argument, "layered: recent share must be within 0..1");
  check(sinks >= 0, ErrorCode::invalid_argument, "layered: sink count must be >= 0");
  check(decay > 0 && decay <= 1, ErrorCode::invalid_argument, "layered: decay must be within (0, 1]");
  return std::make_unique<LayeredPolicy>(budget, bottom_share, recent_share, sinks, float(decay), value_weighted);
}

const std::vector<std::string>& kv_policy_names() {
  static const std::vector<std::string> names = {"full", "streaming", "h2o", "snapkv", "pyramid", "entropy", "layered"};
  return names;
}

std::unique_ptr<KvPolicy> make_kv_policy(const std::string& name, KvBudget budget) {
  if (name == "full") return make_full_policy();
  if (name == "streaming" || name == "streamingllm") return make_streaming_policy(budget);
  if (name == "h2o") return make_h2o_policy(budget);
  if (name == "snapkv") return make_snapkv_policy(budget);
  if (name == "pyramid" || name == "pyramidkv") return make_pyramid_policy(budget);
  if (name == "entropy") return make_entropy_policy(budget);
  if (name == "layered") return make_layered_policy(budget);
  std::string known;
  for (const std::string& n : kv_policy_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(ErrorCode::invalid_argument, "unknown KV policy '" + name + "' (" + known + ")");
}

}  // namespace slim::llm
