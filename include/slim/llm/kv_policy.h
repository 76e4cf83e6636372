// KV eviction policies: which tokens of each layer and KV head a sequence keeps once its
// cache exceeds a budget. A KvPolicy says which attention rows it wants to observe (the
// KvCache accumulates them per token) and, after every forward pass, picks what to keep.
// Policies compose with KV quantization: they only decide which tokens stay.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "slim/llm/kv_cache.h"

namespace slim::llm {

// A budget as a share of the tokens seen so far (ratio) or an absolute token count.
struct KvBudget {
  double ratio = 1.0;
  int tokens = 0;  // > 0 wins over ratio
  // Tokens a stream of a sequence that has seen n_past tokens may keep.
  int for_length(int n_past) const;
  static KvBudget parse(const std::string& text);  // "0.25", "25%" or "512"
  std::string str() const;
};

// Everything a policy sees of one sequence when it selects.
struct KvSelectInput {
  const KvCache* cache = nullptr;
  int seq = 0;
  int n_past = 0;
};

class KvPolicy {
 public:
  virtual ~KvPolicy() = default;
  virtual std::string name() const = 0;
  // Which attention rows feed the stream's score and entropy: for a pass of n tokens of a
  // sequence, rows t >= n - observe_window() (all rows when observe_window() < 0; none
  // when 0). Decode rows (n == 1) are observed whenever the window is non-zero.
  virtual int observe_window() const { return 0; }
  virtual KvObserver observer() const { return {}; }
  // Token budget of every stream (indexed layer * n_head_kv + head).
  virtual void budgets(const KvSelectInput& in, std::vector<int>& out) const;
  // Indices (ascending) of the tokens of stream (layer, head) to keep within `budget`.
  virtual void select(const KvSelectInput& in, int layer, int head, int budget, std::vector<int32_t>& keep) const = 0;
  // Applies the policy to a sequence: every stream more than `slack` tokens above its
  // budget is cut down to it. Returns the number of tokens evicted.
  int64_t apply(KvCache& cache, int seq, int slack = 0) const;
  const KvBudget& budget() const { return budget_; }

 protected:
  explicit KvPolicy(KvBudget b) : budget_(b) {}
  KvBudget budget_;
};

// Keeps everything.
std::unique_ptr<KvPolicy> make_full_policy();
// StreamingLLM: the first `sinks` tokens plus the most recent ones.
std::unique_ptr<KvPolicy> make_streaming_policy(KvBudget budget, int sinks = 4);
// H2O: half the budget for the tokens with the most accumulated attention (over every
// query so far), half for the most recent tokens.
std::unique_ptr<KvPolicy> make_h2o_policy(KvBudget budget, double recent_share = 0.5);
// SnapKV: the attention of the last `window` prompt tokens, max-pooled over `kernel`
// neighbouring positions, picks the kept prompt tokens; the window itself is kept.
// During decode each new query's attention is added, so the budget also holds there.
std::unique_ptr<KvPolicy> make_snapkv_policy(KvBudget budget, int window = 32, int kernel = 7);
// PyramidKV: SnapKV selection with per-layer budgets falling linearly from
// (2 - top_share) * budget at layer 0 to top_share * budget at the last layer (same mean).
std::unique_ptr<KvPolicy> make_pyramid_policy(KvBudget budget, double top_share = 0.5, int window = 32, int kernel = 7);
// Attention entropy: within a layer, heads share n_head_kv * budget tokens in proportion
// to exp(mean entropy of their attention) (their effective number of attended tokens),
// each head at least min_share * budget; SnapKV-style selection.
std::unique_ptr<KvPolicy> make_entropy_policy(KvBudget budget, double min_share = 0.25, int window = 32, int kernel = 7);
// Layered H2O: the first `sinks` tokens, the latest recent_share * budget tokens and heavy
// hitters by accumulated attention decayed by `decay` per observed query (so stale mass
// fades), times the L1 norm of the token's value when value_weighted (what the token adds
// to the output is its attention times its value, as in VATP); per-layer budgets rise
// linearly with depth from bottom_share * budget at layer 0 to (2 - bottom_share) * budget
// at the last layer (same mean), since late layers feed the logits most directly. The
// recent window is the same size in every layer.
std::unique_ptr<KvPolicy> make_layered_policy(KvBudget budget, double bottom_share = 0.25, double recent_share = 0.5,
                                              int sinks = 4, double decay = 0.99, bool value_weighted = true);

// "full", "streaming", "h2o", "snapkv", "pyramid", "entropy", "layered".
std::unique_ptr<KvPolicy> make_kv_policy(const std::string& name, KvBudget budget);
const std::vector<std::string>& kv_policy_names();

}  // namespace slim::llm
