// slim generate / perplexity: the language-model engine's front door (quantize is in
// cmd_quantize.cc). Also registers GGUF as a tokenizer source so `slim tokenize
// MODEL.gguf` works.
#include <array>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "commands.h"
#include "prune.h"
#include "energy_cli.h"
#include "slim/core/error.h"
#include "slim/core/progress.h"
#include "slim/llm/expert_report.h"
#include "slim/llm/gguf_tokenizer.h"
#include "slim/llm/model.h"
#include "slim/llm/perplexity.h"
#include "slim/llm/prune.h"
#include "slim/llm/sampler.h"
#include "slim/llm/text_generator.h"
#include "slim/text/tokenizer_loader.h"

namespace slim::cli {
namespace {

struct GgufTokenizerRegistrar {
  GgufTokenizerRegistrar() {
    text::register_tokenizer_loader({"GGUF", [](const std::string& p) { return llm::is_gguf_file(p); },
                                     [](const std::string& p) { return llm::load_gguf_tokenizer(*llm::GgufFile::open(p)); }});
  }
} gguf_tokenizer_registrar;

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::not_found, path + ": cannot open");
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

std::vector<int32_t> parse_ids(const std::string& s, const std::string& what) {
  std::vector<int32_t> ids;
  std::string cur;
  auto flush = [&] {
    if (cur.empty()) return;
    char* end = nullptr;
    const long v = std::strtol(cur.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > INT32_MAX) throw Error(ErrorCode::invalid_argument, what + ": bad token id '" + cur + "'");
    ids.push_back(int32_t(v));
    cur.clear();
  };
  for (char c : s) {
    if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r') flush();
    else cur += c;
  }
  flush();
  return ids;
}

struct GenerateArgs {
  std::string model, tokens, tokens_file, json;
  std::vector<std::string> prompts;
  int n = 128, threads = 0, ctx = 0, batch = 512;
  llm::SamplerOptions sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false, ids = false, f32_kv = false, mmap = false, expert_stats = false;
  EnergyArgs energy;
};

// A MoE request's (or all requests') expert work: per expert the tokens routed to it over
// all layers, their share of the routing, its GFLOP and the tokens per layer; then the
// shared expert, the rest of the forward pass, and the total. With `joules` (the work's
// energy, measured or estimated as the energy lines above say) each part also gets its
// share of it, in proportion to its FLOPs.
void print_expert_usage(const std::string& title, const llm::ExpertUsage& u, int k, std::optional<double> joules,
                        energy::Basis basis) {
  std::fprintf(stderr, "%s: %lld tokens, %d layers x %d experts, %d per token\n", title.c_str(), (long long)u.tokens,
               u.n_layer, u.n_expert, k);
  std::fprintf(stderr, "  %-8s %10s %7s %10s %10s  %s\n", "expert", "routed", "share", "GFLOP",
               joules ? energy::basis_name(basis) : "", "routed per layer");
  const double slots = double(u.tokens) * u.n_layer * k, total = u.total_flops();
  auto energy_of = [&](double flops) {
    return joules && total > 0 ? energy::si(llm::flops_share(u, flops, *joules), "J") : std::string();
  };
  for (int e = 0; e < u.n_expert; ++e) {
    int64_t n = 0;
    std::string per_layer;
    for (int l = 0; l < u.n_layer; ++l) {
      n += u.count(l, e);
      per_layer += (l ? " " : "") + std::to_string(u.count(l, e));
    }
    const double f = double(n) * u.expert_token_flops;
    std::fprintf(stderr, "  %-8d %10lld %6.1f%% %10.4f %10s  %s\n", e, (long long)n,
                 slots > 0 ? 100.0 * double(n) / slots : 0.0, f / 1e9, energy_of(f).c_str(), per_layer.c_str());
  }
  if (u.shared_token_flops > 0)
    std::fprintf(stderr, "  %-8s %10lld %7s %10.4f %10s\n", "shared", (long long)(u.tokens * u.n_layer), "",
                 u.shared_flops() / 1e9, energy_of(u.shared_flops()).c_str());
  std::fprintf(stderr, "  %-8s %10s %7s %10.4f %10s  (attention, routers, output head)\n", "other", "", "",
               u.other_flops / 1e9, energy_of(u.other_flops).c_str());
  std::fprintf(stderr, "  %-8s %10s %7s %10.4f %10s\n", "total", "", "", total / 1e9, energy_of(total).c_str());
}

void run_generate(const GenerateArgs& a) {
  auto model = llm::LlamaModel::load(a.model, a.mmap);
  const llm::LlamaConfig& cfg = model->config();
  if (a.expert_stats && cfg.n_expert == 0)
    throw Error(ErrorCode::invalid_argument, "generate: --expert-stats needs a Mixture-of-Experts model; " + a.model +
                                                 " is dense");
  std::unique_ptr<text::Tokenizer> tok;
  std::vector<std::vector<int32_t>> prompts;
  if (!a.tokens.empty() || !a.tokens_file.empty()) {
    prompts.push_back(a.tokens.empty() ? parse_ids(read_text_file(a.tokens_file), a.tokens_file)
                                       : parse_ids(a.tokens, "--tokens"));
    if (model->gguf().has("tokenizer.ggml.model")) tok = llm::load_gguf_tokenizer(model->gguf());
  } else {
    tok = llm::load_gguf_tokenizer(model->gguf());
    for (const std::string& p : a.prompts.empty() ? std::vector<std::string>{""} : a.prompts)
      prompts.push_back(tok->encode(p));
  }
  for (const auto& p : prompts)
    if (p.empty()) throw Error(ErrorCode::invalid_argument, "generate: empty prompt (give -p TEXT or --tokens IDS)");
  if (!a.stop.empty() && !tok) throw Error(ErrorCode::invalid_argument, "generate: --stop needs a tokenizer in the model");
  llm::ContextOptions co;
  co.n_ctx = a.ctx;
  co.n_batch = a.batch;
  co.n_threads = a.threads;
  co.f16_kv = !a.f32_kv;
  llm::LlamaGenerator gen(model, co);
  // With --energy: readings before each prompt, at its first token (the end of prefill) and at its end.
  std::optional<EnergyRun> energy;
  if (a.energy.on) energy.emplace(a.energy);
  const energy::Basis basis = energy ? energy->meter().basis() : energy::Basis::estimated;
  nlohmann::json requests = nlohmann::json::array();
  double work_joules = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    llm::GenerationRequest req;
    req.prompt = prompts[i];
    req.max_tokens = a.n;
    req.sampling = a.sampling;
    req.stop_at_eos = !a.ignore_eos;
    req.stop_strings = a.stop;
    if (tok) req.token_text = [&](int32_t id) { return tok->token_to_piece(id); };
    energy::Reading e_start, e_first, e_end;
    bool first_token = true;
    if (energy) energy->meter().read(e_start);
    if (!a.ids && tok) std::fputs(tok->decode(req.prompt).c_str(), stdout);
    auto res = gen.generate(req, [&](int32_t t) {
      if (energy && first_token) energy->meter().read(e_first);
      first_token = false;
      if (a.ids || !tok) std::printf("%d ", t);
      else std::fputs(tok->token_to_piece(t).c_str(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::printf("\n");
    std::fflush(stdout);
    const int decoded = std::max<int>(0, int(res.tokens.size()) - 1);  // the first token comes from prefill
    std::fprintf(stderr, "prefill: %d tokens in %.3f s (%.2f tok/s)\n", res.prompt_tokens, res.prefill_seconds,
                 res.prompt_tokens / std::max(res.prefill_seconds, 1e-9));
    std::fprintf(stderr, "decode: %d tokens in %.3f s (%.2f tok/s)\n", decoded, res.decode_seconds,
                 decoded / std::max(res.decode_seconds, 1e-9));
    std::fprintf(stderr, "stop: %s; kernels: %s; threads: %d\n", llm::stop_reason_name(res.stop),
                 gen.context().kernel_isa(), a.threads);
    nlohmann::json j = {{"prompt_tokens", res.prompt_tokens},
                        {"generated_tokens", res.tokens.size()},
                        {"prefill_s", res.prefill_seconds},
                        {"decode_s", res.decode_seconds},
                        {"stop", llm::stop_reason_name(res.stop)}};
    std::optional<energy::EnergyReport> work;
    if (energy) {
      energy->meter().read(e_end);
      if (first_token) e_first = e_end;  // no token: all of it was prefill
      if (i == 0) energy->print_setup(stderr, 16);
      const energy::EnergyReport pre = energy->report(e_start, e_first), dec = energy->report(e_first, e_end);
      std::fprintf(stderr, "prefill energy: %s\n", EnergyRun::per_unit(pre, res.prompt_tokens, "token").c_str());
      if (decoded > 0) std::fprintf(stderr, "decode energy:  %s\n", EnergyRun::per_unit(dec, decoded, "token").c_str());
      std::string carbon = "prefill " + energy::si(pre.work_grams / res.prompt_tokens, "gCO2e") + " per token";
      if (decoded > 0) carbon += ", decode " + energy::si(dec.work_grams / decoded, "gCO2e") + " per token";
      carbon += ", idle " + energy::si(pre.idle_grams + dec.idle_grams, "gCO2e");
      std::fprintf(stderr, "carbon:         %s\n", carbon.c_str());
      j["energy"] = energy->setup_json();
      j["energy"]["prefill"] = energy::to_json(pre, res.prompt_tokens, "token");
      j["energy"]["decode"] = energy::to_json(dec, decoded, "token");
      work = pre;  // the request's work: prefill's and decode's
      work->work_joules += dec.work_joules;
      work->work_grams += dec.work_grams;
      work_joules += work->work_joules;
    }
    if (cfg.n_expert) {
      if (a.expert_stats)
        print_expert_usage("experts, request " + std::to_string(i + 1), res.experts, cfg.n_expert_used,
                           work ? std::optional<double>(work->work_joules) : std::nullopt, basis);
      const llm::WorkEnergy we = work ? llm::WorkEnergy{work->work_joules, work->work_grams, energy::basis_name(work->basis)}
                                      : llm::WorkEnergy{};
      j["experts"] = llm::expert_usage_json(res.experts, work ? &we : nullptr);
    }
    requests.push_back(std::move(j));
  }
  const llm::ExpertUsage& total = gen.context().expert_usage_total();
  if (a.expert_stats && prompts.size() > 1)
    print_expert_usage("experts, all requests", total, cfg.n_expert_used,
                       energy ? std::optional<double>(work_joules) : std::nullopt, basis);
  if (!a.json.empty()) {
    // One prompt: its numbers at the top level; several: a list of them.
    nlohmann::json j = prompts.size() == 1 ? requests[0] : nlohmann::json{{"requests", requests}};
    j["model"] = a.model;
    j["kernels"] = gen.context().kernel_isa();
    j["threads"] = a.threads;
    if (cfg.n_expert)
      j["moe"] = {{"arch", cfg.arch},
                  {"n_layer", cfg.n_layer},
                  {"n_expert", cfg.n_expert},
                  {"n_expert_used", cfg.n_expert_used},
                  {"expert_token_flops", total.expert_token_flops},
                  {"shared_token_flops", total.shared_token_flops},
                  {"cumulative", llm::expert_usage_json(total)}};
    std::ofstream f(a.json);
    if (!(f << j.dump() << "\n")) throw Error(ErrorCode::invalid_argument, "--json: cannot write '" + a.json + "'");
  }
}

void add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate",
                                 "Generate text with a GGUF language model (llama, mistral, qwen2; Mixture-of-Experts: "
                                 "Mixtral's layout, qwen2moe)");
  cmd->add_option("model", a->model, "GGUF model file")->required();
  cmd->add_option("-p,--prompt", a->prompts, "Prompt text (repeatable: one request after the other)");
  cmd->add_option("--tokens", a->tokens, "Prompt as token IDs (comma or space separated) instead of text");
  cmd->add_option("--tokens-file", a->tokens_file, "File of prompt token IDs");
  cmd->add_option("-n,--n-predict", a->n, "Tokens to generate")->check(CLI::NonNegativeNumber);
  cmd->add_option("--temp", a->sampling.temperature, "Temperature (0 = greedy)");
  cmd->add_option("--top-k", a->sampling.top_k, "Top-k (0 = off)");
  cmd->add_option("--top-p", a->sampling.top_p, "Top-p (1 = off)");
  cmd->add_option("--min-p", a->sampling.min_p, "Min-p (0 = off)");
  cmd->add_option("--repeat-penalty", a->sampling.repeat_penalty, "Repetition penalty (1 = off)");
  cmd->add_option("--repeat-last-n", a->sampling.repeat_last_n, "Tokens the penalty looks back over");
  cmd->add_option("--seed", a->sampling.seed, "Random seed");
  cmd->add_option("--stop", a->stop, "Stop when this text appears (repeatable)");
  cmd->add_option("--ctx", a->ctx, "Context size (0 = model's, at most 4096)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--batch", a->batch, "Prefill batch size")->check(CLI::PositiveNumber);
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at the end-of-sequence token");
  cmd->add_flag("--ids", a->ids, "Print token IDs instead of text");
  cmd->add_flag("--f32-kv", a->f32_kv, "Keep the KV cache in f32 (default f16, as llama.cpp)");
  cmd->add_flag("--expert-stats", a->expert_stats,
                "Mixture-of-Experts models: print per request (and over all requests) the tokens routed to each "
                "expert per layer, their FLOPs and, with --energy, their share of the energy; the shared expert "
                "apart (--json has them too)");
  cmd->add_option("--json", a->json,
                  "Also write the token counts, times (and energy; MoE models: the expert statistics) as JSON to this "
                  "file");
  add_energy_options(cmd, &a->energy);
  add_mmap_flag(cmd, &a->mmap);
  add_threads_option(cmd, &a->threads);
  add_isa_option(cmd);
  cmd->callback([a] { run_generate(*a); });
}

struct PerplexityArgs {
  std::string model, file, kl_base;
  int ctx = 512, threads = 0, chunks = 0;
  bool mmap = false;
};

void run_perplexity(const PerplexityArgs& a) {
  auto model = llm::LlamaModel::load(a.model, a.mmap);
  std::shared_ptr<const llm::LlamaModel> base;
  if (!a.kl_base.empty()) base = llm::LlamaModel::load(a.kl_base, a.mmap);
  llm::PerplexityOptions o;
  o.n_ctx = a.ctx;
  o.chunks = a.chunks;
  o.threads = a.threads;
  std::unique_ptr<Progress> progress;
  o.progress = [&](int done, int chunks, double ppl) {
    if (!progress) progress = std::make_unique<Progress>("perplexity", chunks);
    progress->update(done, "ppl " + std::to_string(ppl));
  };
  auto t0 = std::chrono::steady_clock::now();
  const llm::PerplexityResult r = llm::perplexity(model, base, read_text_file(a.file), a.file, o);
  if (progress) progress->finish();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("model: %s\n", a.model.c_str());
  std::printf("tokens: %zu, chunks: %d of %d, scored: %lld\n", r.tokens, r.chunks, a.ctx, (long long)r.scored);
  std::printf("perplexity: %.4f\n", r.ppl());
  if (base) {
    std::printf("base perplexity: %.4f (%s)\n", r.base_ppl(), a.kl_base.c_str());
    std::printf("mean KL(base || model): %.6f\n", r.mean_kl());
    std::printf("top-1 agreement: %.2f%%\n", 100.0 * r.top1_agreement());
  }
  std::printf("time: %.1f s (%.1f tok/s)\n", secs, double(r.chunks) * a.ctx * (base ? 2 : 1) / secs);
}

void add_perplexity(CLI::App& app) {
  auto a = std::make_shared<PerplexityArgs>();
  auto* cmd = app.add_subcommand("perplexity",
                                 "Perplexity of a GGUF model on a text file: non-overlapping chunks of --ctx "
                                 "tokens, scoring the second half of each (as llama-perplexity)");
  cmd->add_option("model", a->model, "GGUF model file")->required();
  cmd->add_option("-f,--file", a->file, "Text file")->required();
  cmd->add_option("--ctx", a->ctx, "Chunk length in tokens")->check(CLI::PositiveNumber);
  cmd->add_option("--chunks", a->chunks, "Score at most this many chunks (0 = all)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--kl-base", a->kl_base, "Reference model (e.g. the F16 original): also report KL divergence");
  add_mmap_flag(cmd, &a->mmap);
  add_threads_option(cmd, &a->threads);
  add_isa_option(cmd);
  cmd->callback([a] { run_perplexity(*a); });
}


// Prefill (one pass over n_ctx tokens) and decode (64 tokens one by one) tokens/s of the
// models measured side by side: rounds alternate between them, medians are reported.
struct Speeds {
  std::vector<double> prefill, decode;  // tokens/s, per model
};
Speeds llm_speeds(const std::vector<std::shared_ptr<const llm::LlamaModel>>& models, int n_ctx, int threads) {
  llm::ContextOptions co;
  co.n_ctx = n_ctx + 64;
  co.n_batch = n_ctx;
  co.n_threads = threads;
  std::vector<std::unique_ptr<llm::LlamaContext>> ctx;
  for (const auto& m : models) ctx.push_back(std::make_unique<llm::LlamaContext>(m, co));
  std::vector<int32_t> prompt(static_cast<size_t>(n_ctx));
  for (int i = 0; i < n_ctx; ++i) prompt[size_t(i)] = (i * 7919 + 13) % models[0]->config().n_vocab;
  const size_t n = models.size();
  std::vector<std::vector<double>> pre(n), dec(n);
  for (int round = 0; round < 7; ++round)
    for (size_t k = 0; k < n; ++k) {
      llm::LlamaContext& c = *ctx[k];
      c.reset();
      auto t0 = std::chrono::steady_clock::now();
      c.eval(prompt);
      auto t1 = std::chrono::steady_clock::now();
      for (int i = 0; i < 64; ++i) {
        const int32_t t = prompt[size_t(i % n_ctx)];  // the prompt may be shorter than 64
        c.eval(std::span<const int32_t>(&t, 1));
      }
      auto t2 = std::chrono::steady_clock::now();
      pre[k].push_back(n_ctx / std::chrono::duration<double>(t1 - t0).count());
      dec[k].push_back(64 / std::chrono::duration<double>(t2 - t1).count());
    }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  Speeds out;
  for (size_t k = 0; k < n; ++k) out.prefill.push_back(median(pre[k])), out.decode.push_back(median(dec[k]));
  return out;
}

}  // namespace

namespace {

std::string fmt_ms(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", ms);
  return buf;
}

}  // namespace

void prune_llm_model(const PruneArgs& a) {
  check(!a.calib.empty(), ErrorCode::invalid_argument, "prune: a GGUF model needs --calib TEXT (calibration text)");
  check((a.target_params < 1) != (a.target_latency_ms > 0), ErrorCode::invalid_argument,
        "prune: give one budget: --target-params below 1 or --target-latency");
  check(a.prune_gain == 0 && a.max_margin_change == 0 && a.label.empty(), ErrorCode::invalid_argument,
        "prune: --prune-gain, --max-margin-change and --label-column are for tree ensembles");
  llm::PruneOptions o;
  o.target_params = a.target_params;
  o.criterion = a.criterion == "magnitude" ? llm::PruneCriterion::magnitude
                : a.criterion == "wanda"   ? llm::PruneCriterion::wanda
                                           : llm::PruneCriterion::activation;
  o.refit = !a.no_refit;
  o.refit_chunks = a.refit_chunks;
  o.uniform = a.allocation == "uniform";
  o.min_ffn_share = a.min_ffn_share;
  o.ridge = a.ridge;
  o.arch = a.arch == "auto" ? "" : a.arch;
  o.n_ctx = a.ctx;
  o.calib_chunks = a.chunks;
  o.expert_seed = a.random_experts;
  o.threads = a.threads;
  std::unique_ptr<Progress> progress;
  std::string stage;
  o.progress = [&](const std::string& st, int done, int total) {
    if (st != stage) progress = std::make_unique<Progress>("prune: " + st, total), stage = st;
    progress->update(done);
  };
  const std::string calib = read_text_file(a.calib);
  auto before = llm::LlamaModel::load(a.model);
  std::shared_ptr<const llm::LlamaModel> after;
  llm::PruneResult r;
  Speeds speeds{{0, 0}, {0, 0}};  // the original's and the pruned model's, when measured
  if (a.target_latency_ms > 0) {
    // Decode time falls about in proportion to the weights read per token: start from
    // that share, then measure the pruned model beside the original (alternating, so load
    // on the machine hits both) and prune again from the original, aiming lower, until
    // its decode time meets the target.
    const double full_ms = 1000 / llm_speeds({before}, a.ctx, a.threads).decode[0];
    check(full_ms > a.target_latency_ms, ErrorCode::invalid_argument,
          "prune: nothing to do: " + a.model + " decodes at " + fmt_ms(full_ms) + " ms/token here, within --target-latency " +
              fmt_ms(a.target_latency_ms) + " ms");
    o.target_params = a.target_latency_ms / full_ms;
    double ms = 0;
    for (int attempt = 1;; ++attempt) {
      check(o.target_params > 0.05, ErrorCode::invalid_argument,
            "prune: --target-latency " + fmt_ms(a.target_latency_ms) + " ms needs less than 5% of the parameters (" +
                a.model + " decodes at " + fmt_ms(full_ms) + " ms/token here)");
      r = llm::prune_model(a.model, a.output, calib, o);
      progress.reset();
      stage.clear();
      after = llm::LlamaModel::load(a.output);
      speeds = llm_speeds({before, after}, a.ctx, a.threads);
      ms = 1000 / speeds.decode[1];
      std::fprintf(stderr, "prune: try %d: %.1f%% of the parameters kept, decode %s ms/token (original %s, target %s)\n",
                   attempt, 100.0 * double(r.params_after) / double(r.params_before), fmt_ms(ms).c_str(),
                   fmt_ms(1000 / speeds.decode[0]).c_str(), fmt_ms(a.target_latency_ms).c_str());
      if (ms <= a.target_latency_ms || attempt == 4) break;
      // Decode time in proportion to the parameters kept, from this try's measurement.
      o.target_params = double(r.params_after) / double(r.params_before) * (a.target_latency_ms / ms) * 0.98;
    }
    check(ms <= a.target_latency_ms, ErrorCode::invalid_argument,
          "prune: decode " + fmt_ms(ms) + " ms/token after 4 tries, above --target-latency " +
              fmt_ms(a.target_latency_ms) + " ms (" + a.output + " keeps " +
              std::to_string(int(100.0 * double(r.params_after) / double(r.params_before))) + "% of the parameters)");
  } else {
    r = llm::prune_model(a.model, a.output, calib, o);
    progress.reset();
    after = llm::LlamaModel::load(a.output);
    if (!a.no_speed) speeds = llm_speeds({before, after}, a.ctx, a.threads);
  }
  llm::PerplexityOptions po;
  po.n_ctx = a.ctx;
  po.chunks = a.chunks;
  po.threads = a.threads;
  const std::string eval_file = a.eval.empty() ? a.calib : a.eval;
  const llm::PerplexityResult p = llm::perplexity(after, before, read_text_file(eval_file), eval_file, po);
  const std::vector<double>& prefill = speeds.prefill;
  const std::vector<double>& decode = speeds.decode;
  nlohmann::json layers = nlohmann::json::array();
  for (size_t l = 0; l < r.keep.size(); ++l) {
    const llm::LayerWeights& L = after->layer(int(l));
    nlohmann::json j = {{"kv_heads", L.n_head_kv}, {"n_ff", L.n_ff}};
    if (after->config().n_expert) j = {{"experts", r.keep[l].experts}};
    if (!r.attn_sensitivity.empty())
      j["attn_sensitivity"] = r.attn_sensitivity[l], j["ffn_sensitivity"] = r.ffn_sensitivity[l],
      j["ffn_probes"] = r.ffn_probes[l];
    layers.push_back(j);
  }
  auto side = [&](const std::string& path, int64_t params, double ppl, int k) {
    return nlohmann::json{{"params", params}, {"file_bytes", std::filesystem::file_size(path)}, {"ppl", ppl},
                          {"prefill_tok_s", prefill[size_t(k)]}, {"decode_tok_s", decode[size_t(k)]}};
  };
  nlohmann::json report = {
      {"kind", "gguf"}, {"model", a.model}, {"output", a.output}, {"criterion", a.criterion},
      {"refit", !a.no_refit}, {"ridge", a.ridge}, {"allocation", a.allocation}, {"arch", r.arch},
      {"isa", llm::LlamaContext(before, {}).kernel_isa()},
      {"before", side(a.model, r.params_before, p.base_ppl(), 0)},
      {"after", side(a.output, r.params_after, p.ppl(), 1)},
      {"eval", {{"file", eval_file}, {"tokens", p.scored}, {"mean_kl", p.mean_kl()}, {"top1_agreement", p.top1_agreement()}}},
      {"layers", layers}};
  if (a.target_latency_ms > 0) report["target_latency_ms"] = a.target_latency_ms;
  const auto& b = report["before"];
  const auto& c = report["after"];
  std::printf("%-16s %12s %12s\n", "", "before", "after");
  std::printf("%-16s %12lld %12lld  (%.1f%% kept)\n", "parameters", (long long)r.params_before,
              (long long)r.params_after, 100.0 * double(r.params_after) / double(r.params_before));
  std::printf("%-16s %9.2f MiB %8.2f MiB\n", "file", b["file_bytes"].get<double>() / 1048576,
              c["file_bytes"].get<double>() / 1048576);
  std::printf("%-16s %12.4f %12.4f  (%+.1f%%)\n", "perplexity", p.base_ppl(), p.ppl(), 100.0 * (p.ppl() / p.base_ppl() - 1));
  std::printf("%-16s %12.1f %12.1f  (%.2fx)\n", "prefill tok/s", prefill[0], prefill[1], prefill[1] / prefill[0]);
  std::printf("%-16s %12.1f %12.1f  (%.2fx)\n", "decode tok/s", decode[0], decode[1], decode[1] / decode[0]);
  std::printf("on %lld tokens of %s: mean KL %.5f, same top-1 %.2f%% (kernels: %s)\n", (long long)p.scored,
              eval_file.c_str(), p.mean_kl(), 100.0 * p.top1_agreement(), report["isa"].get<std::string>().c_str());
  std::printf("per layer (%s):", after->config().n_expert ? "experts" : "KV heads/FFN width");
  for (size_t l = 0; l < r.keep.size(); ++l) {
    const llm::LayerWeights& L = after->layer(int(l));
    if (after->config().n_expert) std::printf(" %zu", r.keep[l].experts.size());
    else std::printf(" %d/%d", L.n_head_kv, L.n_ff);
  }
  std::printf("\n");
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    f << report.dump(2) << "\n";
    check(bool(f), ErrorCode::invalid_argument, a.json + ": cannot write");
  }
}

SLIM_COMMAND(40, add_generate);
SLIM_COMMAND(41, add_perplexity);

}  // namespace slim::cli
