#include "slim/llm/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "slim/core/error.h"
#include "slim/llm/kernels.h"

namespace slim::llm {

Sampler::Sampler(const SamplerOptions& options, int n_vocab)
    : options_(options), n_vocab_(n_vocab), rng_(options.seed) {
  check(n_vocab > 0, ErrorCode::invalid_argument, "sampler: empty vocabulary");
  check(std::isfinite(options.temperature), ErrorCode::invalid_argument, "sampler: temperature must be finite");
  check(options.top_p > 0, ErrorCode::invalid_argument, "sampler: top_p must be > 0");
  check(options.min_p < 1, ErrorCode::invalid_argument, "sampler: min_p must be < 1");
  check(options.repeat_penalty > 0, ErrorCode::invalid_argument, "sampler: repeat_penalty must be > 0");
  check(std::isfinite(options.presence_penalty) && std::isfinite(options.frequency_penalty), ErrorCode::invalid_argument,
        "sampler: penalties must be finite");
  check(options.repeat_last_n >= 0, ErrorCode::invalid_argument, "sampler: repeat_last_n must be >= 0");
  cand_.resize(size_t(n_vocab));
  penalized_.resize(size_t(n_vocab));
}

int32_t Sampler::sample(const float* logits, std::span<const int32_t> history) {
  const float* l = logits;
  const bool repeat = options_.repeat_penalty != 1.0f, presence = options_.presence_penalty != 0.f,
             frequency = options_.frequency_penalty != 0.f;
  if ((repeat || presence || frequency) && options_.repeat_last_n > 0 && !history.empty()) {
    std::copy(logits, logits + n_vocab_, penalized_.begin());
    const size_t start = history.size() > size_t(options_.repeat_last_n) ? history.size() - size_t(options_.repeat_last_n) : 0;
    counts_.clear();
    for (size_t i = start; i < history.size(); ++i) {
      const int32_t t = history[i];
      if (t < 0 || t >= n_vocab_) continue;
      auto it = std::find_if(counts_.begin(), counts_.end(), [t](const auto& c) { return c.first == t; });
      if (it == counts_.end())
        counts_.emplace_back(t, 1);
      else
        ++it->second;
    }
    // Each distinct token gets the repetition penalty once, however often it repeats (as
    // llama.cpp), and the OpenAI penalties by its count.
    for (const auto& [t, count] : counts_) {
      float& v = penalized_[size_t(t)];
      if (repeat) v = v <= 0 ? v * options_.repeat_penalty : v / options_.repeat_penalty;
      v -= float(count) * options_.frequency_penalty + options_.presence_penalty;
    }
    l = penalized_.data();
  }
  if (options_.temperature <= 0) return int32_t(kernels().argmax(l, n_vocab_));
  size_t n = size_t(n_vocab_);
  for (size_t i = 0; i < n; ++i) cand_[i] = {int32_t(i), l[i], 0.f};
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  if (options_.top_k > 0 && size_t(options_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + options_.top_k, cand_.begin() + long(n), by_logit);
    n = size_t(options_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.begin() + long(n), by_logit);
  }
  auto softmax = [&](float temp) {
    const float mx = cand_[0].logit;
    double sum = 0;
    for (size_t i = 0; i < n; ++i) {
      cand_[i].p = std::exp((cand_[i].logit - mx) / temp);
      sum += cand_[i].p;
    }
    for (size_t i = 0; i < n; ++i) cand_[i].p = float(cand_[i].p / sum);
  };
  softmax(1.0f);
  if (options_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += cand_[i].p;
      if (cum >= options_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  if (options_.min_p > 0) {
    const float floor = cand_[0].p * options_.min_p;
    size_t keep = 1;
    while (keep < n && cand_[keep].p >= floor) ++keep;
    n = keep;
  }
  softmax(options_.temperature);
  const double r = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  double cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += cand_[i].p;
    if (r < cum) return cand_[i].id;
  }
  return cand_[n - 1].id;
}

void log_softmax(const float* l, int n, std::vector<double>& out) {
  double mx = l[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, double(l[i]));
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(l[i]) - mx);
  const double lse = mx + std::log(sum);
  out.resize(size_t(n));
  for (int i = 0; i < n; ++i) out[size_t(i)] = double(l[i]) - lse;
}

}  // namespace slim::llm
