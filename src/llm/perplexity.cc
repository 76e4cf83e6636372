#include "slim/llm/perplexity.h"

#include <cmath>
#include <vector>

#include "slim/core/error.h"
#include "slim/llm/gguf_tokenizer.h"
#include "slim/llm/sampler.h"

namespace slim::llm {

double PerplexityResult::ppl() const { return std::exp(nll / double(scored)); }
double PerplexityResult::base_ppl() const { return std::exp(nll_base / double(scored)); }
double PerplexityResult::mean_kl() const { return kl / double(scored); }
double PerplexityResult::top1_agreement() const { return double(top1_same) / double(scored); }

PerplexityResult perplexity(const std::shared_ptr<const LlamaModel>& model,
                            const std::shared_ptr<const LlamaModel>& base, const std::string& text,
                            const std::string& source, const PerplexityOptions& o) {
  auto tok = load_gguf_tokenizer(model->gguf());
  text::EncodeOptions eo;
  eo.add_special = false;
  const std::vector<int32_t> tokens = tok->encode(text, eo);
  const int n_ctx = o.n_ctx;
  check(n_ctx >= 8, ErrorCode::invalid_argument, "perplexity: --ctx must be at least 8");
  int n_chunks = int(tokens.size() / size_t(n_ctx));
  if (o.chunks > 0) n_chunks = std::min(n_chunks, o.chunks);
  check(n_chunks > 0, ErrorCode::invalid_argument,
        source + ": " + std::to_string(tokens.size()) + " tokens, fewer than one chunk of --ctx " +
            std::to_string(n_ctx));
  const int nv = model->config().n_vocab;
  check(!base || base->config().n_vocab == nv, ErrorCode::invalid_argument,
        "perplexity: the base model has a vocabulary of " +
            (base ? std::to_string(base->config().n_vocab) : "") + " tokens, the model " +
            std::to_string(nv));
  ContextOptions co;
  co.n_ctx = n_ctx;
  co.n_batch = n_ctx;
  co.n_threads = o.threads;
  co.all_logits = true;
  LlamaContext ctx(model, co);
  std::unique_ptr<LlamaContext> base_ctx;
  if (base) base_ctx = std::make_unique<LlamaContext>(base, co);
  const auto eval = [&](bool is_base, LlamaContext& c, const std::vector<int32_t>& chunk) {
    const auto work = [&] {
      c.reset();
      c.eval(chunk);
    };
    if (o.around_eval) o.around_eval(is_base, work);
    else work();
  };
  const bool add_bos = tok->spec().add_bos && tok->bos_id() >= 0;
  const int first = n_ctx / 2;
  PerplexityResult r;
  r.tokens = tokens.size();
  r.chunks = n_chunks;
  std::vector<double> lp, lq;
  std::vector<int32_t> chunk(static_cast<size_t>(n_ctx));
  for (int c = 0; c < n_chunks; ++c) {
    std::copy(tokens.begin() + int64_t(c) * n_ctx, tokens.begin() + int64_t(c + 1) * n_ctx, chunk.begin());
    if (add_bos) chunk[0] = tok->bos_id();  // as llama-perplexity does
    eval(false, ctx, chunk);
    if (base_ctx) eval(true, *base_ctx, chunk);
    for (int j = first; j < n_ctx - 1; ++j) {
      const int32_t next = tokens[size_t(int64_t(c) * n_ctx + j + 1)];
      log_softmax(ctx.logits(j), nv, lq);
      r.nll -= lq[size_t(next)];
      if (base_ctx) {
        log_softmax(base_ctx->logits(j), nv, lp);
        r.nll_base -= lp[size_t(next)];
        double k = 0;
        size_t am_p = 0, am_q = 0;
        for (size_t i = 0; i < size_t(nv); ++i) {
          k += std::exp(lp[i]) * (lp[i] - lq[i]);
          if (lp[i] > lp[am_p]) am_p = i;
          if (lq[i] > lq[am_q]) am_q = i;
        }
        r.kl += k;
        r.top1_same += am_p == am_q;
      }
      ++r.scored;
    }
    if (o.progress) o.progress(c + 1, n_chunks, r.ppl());
  }
  return r;
}

}  // namespace slim::llm
