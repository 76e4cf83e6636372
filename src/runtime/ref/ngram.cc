// TfIdfVectorizer (opset 9) over integer tokens: counts the pool's n-grams in each row.
// String pools and inputs need a string dtype, which slim does not have (unsupported).
#include <map>

#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

namespace {

// An n-gram of length n starting at item s with skip k is x[s], x[s + (k+1)], ...,
// x[s + (n-1)(k+1)], for every k up to max_skip_count; 1-grams are counted once, not once
// per skip (as ONNX Runtime does). The pool is a trie, so a scan stops at the first item
// that no pooled n-gram continues with.
class TfIdfVectorizer final : public OpKernel {
 public:
  TfIdfVectorizer(const Node& node, int64_t) {
    if (node.has_attr("pool_strings"))
      throw Error(ErrorCode::unsupported, node.describe() + ": attribute 'pool_strings' needs string tensors, which slim does not support");
    for (const char* a : {"min_gram_length", "max_gram_length", "max_skip_count", "mode", "ngram_counts", "ngram_indexes", "pool_int64s"})
      if (!node.has_attr(a)) bad(node, std::string("attribute '") + a + "' is missing");
    min_n_ = node.attr_int("min_gram_length", 0);
    max_n_ = node.attr_int("max_gram_length", 0);
    max_skip_ = node.attr_int("max_skip_count", 0);
    if (min_n_ < 1 || min_n_ > max_n_) bad(node, "min_gram_length and max_gram_length must satisfy 1 <= min <= max");
    if (max_skip_ < 0) bad(node, "max_skip_count is negative");
    const std::string mode = node.attr_string("mode", "");
    if (mode != "TF" && mode != "IDF" && mode != "TFIDF") bad(node, "unknown mode '" + mode + "'");
    mode_ = mode == "TF" ? 0 : mode == "IDF" ? 1 : 2;
    const std::vector<int64_t> counts = node.attr_ints("ngram_counts"), pool = node.attr_ints("pool_int64s");
    out_index_ = node.attr_ints("ngram_indexes");
    weights_ = node.attr_floats("weights");
    // Level l (n-grams of length l + 1) occupies pool[counts[l], counts[l + 1]).
    for (size_t l = 0; l < counts.size(); ++l) {
      const int64_t n = int64_t(l) + 1, begin = counts[l], end = l + 1 < counts.size() ? counts[l + 1] : int64_t(pool.size());
      if (begin < 0 || begin > end || end > int64_t(pool.size()) || (end - begin) % n != 0)
        bad(node, "ngram_counts does not split pool_int64s into whole " + std::to_string(n) + "-grams");
      for (int64_t g = begin; g < end; g += n) {
        int64_t at = 0;  // the root
        for (int64_t j = 0; j < n; ++j) {
          auto [it, added] = children_.try_emplace({at, pool[size_t(g + j)]}, int64_t(gram_of_.size()));
          if (added) gram_of_.push_back(-1);
          at = it->second;
        }
        gram_of_[size_t(at)] = grams_++;
      }
    }
    if (int64_t(out_index_.size()) != grams_) bad(node, "ngram_indexes has " + std::to_string(out_index_.size()) + " entries for " + std::to_string(grams_) + " n-grams");
    if (!weights_.empty() && int64_t(weights_.size()) != grams_) bad(node, "weights has " + std::to_string(weights_.size()) + " entries for " + std::to_string(grams_) + " n-grams");
    for (int64_t i : out_index_) {
      if (i < 0 || i >= (int64_t(1) << 31)) bad(node, "ngram_indexes holds " + std::to_string(i) + ", outside [0, 2^31)");
      width_ = std::max(width_, i + 1);
    }
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    if ((x.dtype() != DType::i32 && x.dtype() != DType::i64) || (x.rank() != 1 && x.rank() != 2))
      ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " must be a 1-D or 2-D int32 or int64 tensor");
    const int64_t rows = x.rank() == 2 ? x.dim(0) : 1, cols = x.dim(x.rank() - 1);
    const std::vector<int64_t> tokens = tensor_to_int64s(x);
    std::vector<float> y(size_t(rows * width_), 0.f);
    std::vector<int64_t> freq(static_cast<size_t>(grams_));
    for (int64_t r = 0; r < rows; ++r) {
      std::fill(freq.begin(), freq.end(), 0);
      const int64_t* row = tokens.data() + r * cols;
      for (int64_t step = 1; step <= max_skip_ + 1; ++step) {
        const int64_t first_n = step == 1 ? min_n_ : std::max<int64_t>(min_n_, 2);
        if (first_n > max_n_) break;
        for (int64_t s = 0; s < cols; ++s) {
          int64_t at = 0;
          for (int64_t n = 1, pos = s; n <= max_n_ && pos < cols; ++n, pos += step) {
            const auto it = children_.find({at, row[pos]});
            if (it == children_.end()) break;
            at = it->second;
            if (n >= first_n && gram_of_[size_t(at)] >= 0) ++freq[size_t(gram_of_[size_t(at)])];
          }
        }
      }
      for (int64_t g = 0; g < grams_; ++g) {
        const int64_t f = freq[size_t(g)];
        if (f == 0) continue;
        const double w = weights_.empty() ? 1.0 : double(weights_[size_t(g)]);
        y[size_t(r * width_ + out_index_[size_t(g)])] = float(mode_ == 0 ? double(f) : mode_ == 1 ? w : double(f) * w);
      }
    }
    const Shape shape = x.rank() == 2 ? Shape{rows, width_} : Shape{width_};
    std::copy(y.begin(), y.end(), ctx.output(0, DType::f32, shape).data<float>());
  }

 private:
  [[noreturn]] static void bad(const Node& node, const std::string& msg) {
    throw Error(ErrorCode::invalid_model, node.describe() + ": " + msg);
  }
  int64_t min_n_ = 1, max_n_ = 1, max_skip_ = 0, grams_ = 0, width_ = 0;
  int mode_ = 0;  // TF, IDF, TFIDF
  std::vector<int64_t> out_index_;
  std::vector<float> weights_;
  std::map<std::pair<int64_t, int64_t>, int64_t> children_;  // (trie node, item) -> child node
  std::vector<int64_t> gram_of_{-1};                          // trie node -> n-gram number, or -1
};

}  // namespace

void register_ngram_kernels(KernelRegistry& r) {
  r.add({"TfIdfVectorizer", "", 9, INT_MAX, [](const Node& n, int64_t o) -> std::unique_ptr<OpKernel> {
           return std::make_unique<TfIdfVectorizer>(n, o);
         }, {}});
}

}  // namespace slim::ref
