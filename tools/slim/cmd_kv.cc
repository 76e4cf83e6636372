// slim kv-eval: what a KV-cache setting (eviction policy, budget, K/V formats) costs in
// quality, measured teacher-forced against the full F16 cache on the same text, and a
// passkey-retrieval grid for long-context recall.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <sys/resource.h>

#include "commands.h"
#include "energy_cli.h"
#include "slim/core/error.h"
#include "slim/core/progress.h"
#include "slim/llm/gguf_tokenizer.h"
#include "slim/llm/kernels.h"
#include "slim/llm/kv_policy.h"
#include "slim/llm/kv_scheduler.h"
#include "slim/llm/model.h"
#include "slim/llm/sampler.h"

namespace slim::cli {
namespace {

using llm::log_softmax;

struct KvEvalArgs {
  std::string model, file;
  int ctx = 1024, prefill = 0, chunks = 1, threads = 0, q4_recent = 2, skip = 0;
  std::string policy = "full", budget = "0.25", kv_type = "f16", k_type, v_type;
  bool passkey = false, q8_no_recent = false, mmap = false;
  std::string passkey_lengths = "256,512,1024";
  int passkey_trials = 2;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s + ",") {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur += c;
    }
  }
  return out;
}

// One KV setting under test.
struct Variant {
  std::string policy;
  llm::KvBudget budget;
  llm::KvType k, v;
  std::string label() const {
    std::string s = policy;
    if (policy != "full") s += " " + budget.str();
    s += std::string(" K:") + llm::kv_type_name(k) + " V:" + llm::kv_type_name(v);
    return s;
  }
};

std::vector<Variant> variants_of(const KvEvalArgs& a) {
  std::vector<Variant> out;
  std::vector<std::pair<llm::KvType, llm::KvType>> types;
  if (!a.k_type.empty() || !a.v_type.empty()) {
    types.push_back({llm::parse_kv_type(a.k_type.empty() ? "f16" : a.k_type), llm::parse_kv_type(a.v_type.empty() ? "f16" : a.v_type)});
  } else {
    for (const auto& t : split_list(a.kv_type)) types.push_back({llm::parse_kv_type(t), llm::parse_kv_type(t)});
  }
  std::vector<std::string> policies = split_list(a.policy);
  if (policies.size() == 1 && policies[0] == "all") policies = llm::kv_policy_names();
  for (const auto& p : policies) {
    llm::make_kv_policy(p, llm::KvBudget{});  // rejects unknown names early
    for (const auto& t : types) {
      if (p == "full") {
        out.push_back({p, llm::KvBudget{}, t.first, t.second});
        continue;
      }
      for (const auto& b : split_list(a.budget)) out.push_back({p, llm::KvBudget::parse(b), t.first, t.second});
    }
  }
  if (out.empty()) throw Error(ErrorCode::invalid_argument, "kv-eval: no policy, budget or KV type given");
  return out;
}

bool g_q8_recent = true;  // false with --q8-no-recent

llm::ContextOptions options_for(const Variant& v, int ctx, int threads, int q4_recent, int batch) {
  llm::ContextOptions o;
  o.n_ctx = ctx;
  o.n_batch = batch;
  o.n_threads = threads;
  o.kv.paged = true;
  o.kv.k_type = v.k;
  o.kv.v_type = v.v;
  o.kv.q4_recent_blocks = q4_recent;
  o.kv.q8_recent = g_q8_recent;
  if (v.policy != "full") o.kv.policy = llm::make_kv_policy(v.policy, v.budget);
  return o;
}

struct Score {
  double nll = 0, kl = 0, bytes_per_token = 0;
  int64_t count = 0, top1 = 0;
  std::vector<double> kls;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::not_found, path + ": cannot open");
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

void run_quality(const KvEvalArgs& a, const std::shared_ptr<const llm::LlamaModel>& model, const text::Tokenizer& tok,
                 const std::vector<Variant>& vars) {
  text::EncodeOptions eo;
  eo.add_special = false;
  const std::vector<int32_t> tokens = tok.encode(read_file(a.file), eo);
  const int ctx = a.ctx, prefill = a.prefill > 0 ? a.prefill : ctx / 2;
  if (ctx < 16 || prefill >= ctx)
    throw Error(ErrorCode::invalid_argument, "kv-eval: need --ctx >= 16 and --prefill < --ctx");
  const int64_t avail = (int64_t(tokens.size()) - a.skip) / ctx;
  if (a.skip < 0 || avail < 1)
    throw Error(ErrorCode::invalid_argument, a.file + ": " + std::to_string(tokens.size()) +
                                                 " tokens, fewer than one chunk of --ctx " + std::to_string(ctx));
  const int chunks = int(std::min<int64_t>(avail, a.chunks));
  const int nv = model->config().n_vocab;
  Variant ref_v{"full", llm::KvBudget{}, llm::KvType::f16, llm::KvType::f16};
  llm::LlamaContext ref(model, options_for(ref_v, ctx, a.threads, a.q4_recent, prefill));
  std::vector<std::unique_ptr<llm::LlamaContext>> ctxs;
  for (const Variant& v : vars) ctxs.push_back(std::make_unique<llm::LlamaContext>(model, options_for(v, ctx, a.threads, a.q4_recent, prefill)));
  std::vector<Score> scores(vars.size());
  Score ref_score;
  std::vector<double> lp, lq;
  Progress progress("kv-eval", int64_t(chunks) * (ctx - prefill));
  const auto t0 = std::chrono::steady_clock::now();
  for (int c = 0; c < chunks; ++c) {
    const int32_t* chunk = tokens.data() + a.skip + int64_t(c) * ctx;
    ref.reset();
    ref.eval(std::span<const int32_t>(chunk, size_t(prefill)));
    for (auto& x : ctxs) {
      x->remove_sequence(0);  // a fresh sequence also forgets the policy's observations
      x->add_sequence();
      x->eval(std::span<const int32_t>(chunk, size_t(prefill)));
    }
    for (int j = prefill; j < ctx; ++j) {
      const int32_t next = chunk[j];
      log_softmax(ref.logits(), nv, lp);
      const size_t am_p = size_t(std::max_element(lp.begin(), lp.end()) - lp.begin());
      ref_score.nll -= lp[size_t(next)];
      ref_score.bytes_per_token += double(ref.kv_cache().sequence_bytes(0)) / ref.n_past();
      ++ref_score.count;
      for (size_t v = 0; v < vars.size(); ++v) {
        llm::LlamaContext& x = *ctxs[v];
        log_softmax(x.logits(), nv, lq);
        double kl = 0;
        for (int i = 0; i < nv; ++i) kl += std::exp(lp[size_t(i)]) * (lp[size_t(i)] - lq[size_t(i)]);
        Score& s = scores[v];
        s.nll -= lq[size_t(next)];
        s.kl += kl;
        s.kls.push_back(kl);
        s.top1 += size_t(std::max_element(lq.begin(), lq.end()) - lq.begin()) == am_p;
        s.bytes_per_token += double(x.kv_cache().sequence_bytes(0)) / x.n_past();
        ++s.count;
      }
      if (j + 1 < ctx) {
        ref.eval(std::span<const int32_t>(&chunk[j], 1));
        for (auto& x : ctxs) x->eval(std::span<const int32_t>(&chunk[j], 1));
      }
      progress.update(int64_t(c) * (ctx - prefill) + (j - prefill + 1));
    }
  }
  progress.finish();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double ref_nll = ref_score.nll / double(ref_score.count);
  const double ref_bpt = ref_score.bytes_per_token / double(ref_score.count);
  std::printf("model: %s\ntext: %s (%zu tokens), %d chunk(s) of %d: prefill %d, then %d teacher-forced decode steps scored\n"
              "kernels: %s\n",
              a.model.c_str(), a.file.c_str(), tokens.size(), chunks, ctx, prefill, ctx - prefill, isa_report().c_str());
  std::printf("reference: full cache, F16 K/V: perplexity %.4f, %.0f KV bytes per context token\n\n", std::exp(ref_nll), ref_bpt);
  std::printf("%-32s %10s %7s %9s %8s %10s %10s %8s\n", "setting", "KV B/tok", "of ref", "dlnPPL", "dPPL", "KL mean",
              "KL p99", "top-1");
  for (size_t v = 0; v < vars.size(); ++v) {
    Score& s = scores[v];
    const double dln = s.nll / double(s.count) - ref_nll;
    std::sort(s.kls.begin(), s.kls.end());
    const double p99 = s.kls[std::min(s.kls.size() - 1, size_t(std::ceil(0.99 * double(s.kls.size()))) - 1)];
    const double bpt = s.bytes_per_token / double(s.count);
    std::printf("%-32s %10.0f %6.1f%% %+9.5f %+7.2f%% %10.6f %10.6f %7.2f%%\n", vars[v].label().c_str(), bpt,
                100.0 * bpt / ref_bpt, dln, 100.0 * (std::exp(dln) - 1), s.kl / double(s.count), p99,
                100.0 * double(s.top1) / double(s.count));
  }
  std::printf("\ntime: %.1f s\n", secs);
}

// Passkey retrieval: filler text with "The pass key is NNNNN" at a depth, then the
// question; greedy decoding must reproduce the five digits.
void run_passkey(const KvEvalArgs& a, const std::shared_ptr<const llm::LlamaModel>& model, const text::Tokenizer& tok,
                 const std::vector<Variant>& vars) {
  text::EncodeOptions eo;
  eo.add_special = false;
  const std::vector<int32_t> filler =
      tok.encode(" The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.", eo);
  const std::vector<int> depths = {0, 25, 50, 75, 100};
  std::vector<int> lengths;
  for (const auto& s : split_list(a.passkey_lengths)) {
    char* end = nullptr;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (*end || v < 64 || v > a.ctx)
      throw Error(ErrorCode::invalid_argument, "kv-eval: passkey length '" + s + "' must be 64..--ctx (" + std::to_string(a.ctx) + ")");
    lengths.push_back(int(v));
  }
  std::vector<Variant> all = vars;
  if (std::none_of(vars.begin(), vars.end(), [](const Variant& v) { return v.policy == "full" && v.k == llm::KvType::f16 && v.v == llm::KvType::f16; }))
    all.insert(all.begin(), Variant{"full", llm::KvBudget{}, llm::KvType::f16, llm::KvType::f16});
  std::mt19937 rng(1234);
  struct Trial {
    int len, depth;
    std::string key;
    std::vector<int32_t> prompt;
  };
  std::vector<Trial> trials;
  for (int len : lengths)
    for (int d : depths)
      for (int t = 0; t < a.passkey_trials; ++t) {
        const std::string key = std::to_string(10000 + rng() % 90000);
        const std::vector<int32_t> needle = tok.encode(" The pass key is " + key + ". Remember it. " + key + " is the pass key.", eo);
        const std::vector<int32_t> question = tok.encode(" What is the pass key? The pass key is", eo);
        const int fill = len - int(needle.size() + question.size());
        if (fill < 0) throw Error(ErrorCode::invalid_argument, "kv-eval: passkey length " + std::to_string(len) + " is too short");
        std::vector<int32_t> hay;
        while (int(hay.size()) < fill) hay.insert(hay.end(), filler.begin(), filler.end());
        hay.resize(size_t(fill));
        const size_t at = size_t(int64_t(fill) * d / 100);
        std::vector<int32_t> p(hay.begin(), hay.begin() + long(at));
        p.insert(p.end(), needle.begin(), needle.end());
        p.insert(p.end(), hay.begin() + long(at), hay.end());
        p.insert(p.end(), question.begin(), question.end());
        trials.push_back({len, d, key, p});
      }
  std::printf("passkey retrieval: accuracy over %d key(s) per cell; rows: prompt length, columns: depth of the key\n",
              a.passkey_trials);
  Progress progress("passkey", int64_t(all.size() * trials.size()));
  int64_t done = 0;
  for (const Variant& v : all) {
    llm::LlamaContext ctx(model, options_for(v, a.ctx, a.threads, a.q4_recent, 512));
    std::vector<int> hits(lengths.size() * depths.size(), 0);
    for (const Trial& t : trials) {
      ctx.remove_sequence(0);
      ctx.add_sequence();
      ctx.eval(t.prompt);
      std::string out;
      for (int i = 0; i < 8 && ctx.n_past() < a.ctx; ++i) {
        const float* l = ctx.logits();
        const int32_t next = int32_t(llm::kernels().argmax(l, model->config().n_vocab));
        out += tok.token_to_piece(next);
        ctx.eval(std::span<const int32_t>(&next, 1));
      }
      const size_t li = size_t(std::find(lengths.begin(), lengths.end(), t.len) - lengths.begin());
      const size_t di = size_t(std::find(depths.begin(), depths.end(), t.depth) - depths.begin());
      hits[li * depths.size() + di] += out.find(t.key) != std::string::npos;
      progress.update(++done);
    }
    progress.clear_line();
    std::printf("\n%s\n%8s", v.label().c_str(), "len");
    for (int d : depths) std::printf(" %5d%%", d);
    std::printf("   mean\n");
    for (size_t li = 0; li < lengths.size(); ++li) {
      std::printf("%8d", lengths[li]);
      int row = 0;
      for (size_t di = 0; di < depths.size(); ++di) {
        row += hits[li * depths.size() + di];
        std::printf(" %5.0f%%", 100.0 * hits[li * depths.size() + di] / a.passkey_trials);
      }
      std::printf(" %5.0f%%\n", 100.0 * row / (a.passkey_trials * double(depths.size())));
    }
  }
  progress.finish();
}

void add_kv_eval(CLI::App& app) {
  auto a = std::make_shared<KvEvalArgs>();
  auto* cmd = app.add_subcommand(
      "kv-eval",
      "Quality of KV-cache settings (eviction policy, budget, K/V format) against the full F16 cache: "
      "teacher-forced delta perplexity, KL divergence and top-1 agreement; --passkey for a retrieval grid");
  cmd->add_option("model", a->model, "GGUF model file")->required();
  cmd->add_option("-f,--file", a->file, "Text file (required unless --passkey)");
  cmd->add_option("--ctx", a->ctx, "Tokens per chunk (context)")->check(CLI::PositiveNumber);
  cmd->add_option("--prefill", a->prefill, "Tokens prefilled before the scored decode steps (default ctx/2)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--chunks", a->chunks, "Chunks of the text to score")->check(CLI::PositiveNumber);
  cmd->add_option("--skip", a->skip, "Tokens of the text to skip first")->check(CLI::NonNegativeNumber);
  std::string names;
  for (const std::string& n : llm::kv_policy_names()) names += n + ", ";
  cmd->add_option("--policy", a->policy, "Eviction policy, or a comma list: " + names + "or all");
  cmd->add_option("--budget", a->budget, "KV budget per stream: ratio (0.25), percentage (25%) or tokens (512); comma list");
  cmd->add_option("--kv-type", a->kv_type, "K and V format: f16, q8, q4 (KIVI 4-bit), f32; comma list");
  cmd->add_option("--k-type", a->k_type, "Key format (overrides --kv-type)");
  cmd->add_option("--v-type", a->v_type, "Value format (overrides --kv-type)");
  cmd->add_option("--q4-recent", a->q4_recent, "4-bit KV: newest blocks of 16 tokens kept in f16")->check(CLI::Range(1, 64));
  cmd->add_flag("--q8-no-recent", a->q8_no_recent, "q8 KV: no f16 recent window (every token in q8 at once)");
  cmd->add_flag("--passkey", a->passkey, "Run the passkey-retrieval grid instead of the text comparison");
  cmd->add_option("--passkey-lengths", a->passkey_lengths, "Prompt lengths of the passkey grid (comma list)");
  cmd->add_option("--passkey-trials", a->passkey_trials, "Keys per grid cell")->check(CLI::PositiveNumber);
  add_mmap_flag(cmd, &a->mmap);
  add_threads_option(cmd, &a->threads);
  add_isa_option(cmd);
  cmd->callback([a] {
    auto model = llm::LlamaModel::load(a->model, a->mmap);
    auto tok = llm::load_gguf_tokenizer(model->gguf());
    const std::vector<Variant> vars = variants_of(*a);
    g_q8_recent = !a->q8_no_recent;
    if (a->passkey) {
      run_passkey(*a, model, *tok, vars);
      return;
    }
    if (a->file.empty()) throw Error(ErrorCode::invalid_argument, "kv-eval: --file TEXT is required (or give --passkey)");
    run_quality(*a, model, *tok, vars);
  });
}

struct KvBenchArgs {
  std::string model, file, seqs = "1,8,32", ctxs = "512,2048", policy = "full", budget = "0.5,0.25", kv_type = "f16";
  std::string json;
  int decode = 16, threads = 0, slack = 16, repeats = 1;
  bool scheduler = false, mmap = false;
  EnergyArgs energy;
};

// --energy for kv-bench: the setup lines before the table, a reading per phase of a row.
struct KvEnergy {
  std::optional<EnergyRun> run;
  nlohmann::json json = nlohmann::json::object();
  explicit KvEnergy(const KvBenchArgs& a) {
    if (!a.energy.on) return;
    run.emplace(a.energy);
    run->print_setup(stdout, 12);
    json["energy"] = run->setup_json();
  }
  explicit operator bool() const { return bool(run); }
  energy::Reading read() { return run ? run->meter().read() : energy::Reading{}; }
  // The row's energy for `tokens` tokens between two readings, into row[key]; the text cell.
  std::string cell(const energy::Reading& a, const energy::Reading& b, double tokens, nlohmann::json& row,
                   const std::string& key) {
    const energy::EnergyReport r = run->report(a, b);
    row[key] = energy::to_json(r, tokens, "token");
    return energy::si(r.work_joules / tokens, "J");
  }
  void write(const std::string& path, nlohmann::json report) {
    if (path.empty()) return;
    report.update(json);
    std::ofstream f(path);
    if (!f) throw Error(ErrorCode::invalid_argument, "--json: cannot write '" + path + "'");
    f << report.dump() << "\n";
  }
};

std::vector<int> int_list(const std::string& s, const char* what) {
  std::vector<int> out;
  for (const auto& x : split_list(s)) {
    char* end = nullptr;
    const long v = std::strtol(x.c_str(), &end, 10);
    if (*end || v <= 0 || v > (1 << 20)) throw Error(ErrorCode::invalid_argument, std::string("kv-bench: bad ") + what + " '" + x + "'");
    out.push_back(int(v));
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Decode throughput of n sequences with `ctx` tokens of context each: every sequence is
// prefilled with its own text, then `decode` steps run one token of every sequence per
// forward pass. The KV peak is the pool's peak block count (plus q4 recent windows).
void run_kv_bench(const KvBenchArgs& a) {
  auto model = llm::LlamaModel::load(a.model, a.mmap);
  KvEvalArgs ea;
  ea.policy = a.policy;
  ea.budget = a.budget;
  ea.kv_type = a.kv_type;
  const std::vector<Variant> vars = variants_of(ea);
  const std::vector<int> seqs = int_list(a.seqs, "sequence count"), ctxs = int_list(a.ctxs, "context");
  std::vector<int32_t> text;
  if (!a.file.empty()) {
    auto tok = llm::load_gguf_tokenizer(model->gguf());
    text::EncodeOptions eo;
    eo.add_special = false;
    text = tok->encode(read_file(a.file), eo);
  }
  const int nv = model->config().n_vocab;
  std::mt19937 rng(99);
  auto prompt_of = [&](int i, int ctx) {
    std::vector<int32_t> p(static_cast<size_t>(ctx));
    if (int64_t(text.size()) >= int64_t(ctx) * 2) {
      const size_t off = size_t((int64_t(i) * 7919 * ctx) % (int64_t(text.size()) - ctx));
      std::copy(text.begin() + long(off), text.begin() + long(off) + ctx, p.begin());
    } else {
      for (auto& t : p) t = int32_t(rng() % uint32_t(nv));
    }
    return p;
  };
  std::printf("model: %s; decode %d steps after a prefill of ctx tokens per sequence; %s prompts; kernels: %s\n",
              a.model.c_str(), a.decode, text.empty() ? "random-token" : "text", isa_report().c_str());
  KvEnergy energy(a);
  nlohmann::json report = {{"model", a.model}, {"kernels", isa_report()}, {"decode_steps", a.decode}, {"rows", nlohmann::json::array()}};
  std::printf("%6s %5s  %-32s %11s %9s %9s %9s %12s%s\n", "ctx", "seqs", "setting", "decode t/s", "vs full", "vs 1 seq",
              "KV peak", "KV B/ctx-tok", energy ? "  prefill J/tok  decode J/tok  decode gCO2e/tok" : "");
  std::vector<std::pair<std::pair<int, size_t>, double>> one_seq;  // (ctx, variant) -> tokens/s at 1 sequence
  for (int ctx : ctxs)
    for (int n : seqs) {
      double full_tps = 0;
      for (size_t vi = 0; vi < vars.size(); ++vi) {
        const Variant& v = vars[vi];
        llm::ContextOptions o = options_for(v, ctx + a.decode, a.threads, 2, std::max(512, n));
        o.kv.max_seqs = n;
        o.kv.evict_slack = a.slack;
        llm::LlamaContext c(model, o);
        std::vector<int> ids = {0};
        for (int i = 1; i < n; ++i) ids.push_back(c.add_sequence());
        double best = 0;
        std::vector<int32_t> next(static_cast<size_t>(n));
        const energy::Reading prefill0 = energy.read();
        for (int i = 0; i < n; ++i) {
          const std::vector<int32_t> p = prompt_of(i, ctx);
          for (int off = 0; off < ctx; off += 512) {
            const int len = std::min(512, ctx - off);
            const llm::LlamaContext::SeqTokens st{ids[size_t(i)], std::span<const int32_t>(p.data() + off, size_t(len))};
            c.eval_sequences(std::span<const llm::LlamaContext::SeqTokens>(&st, 1));
          }
          const float* l = c.sequence_logits(0);
          next[size_t(i)] = int32_t(llm::kernels().argmax(l, nv));
        }
        const int steps_per_rep = std::max(1, a.decode / std::max(1, a.repeats));
        std::vector<llm::LlamaContext::SeqTokens> batch(static_cast<size_t>(n));
        const energy::Reading decode0 = energy.read();
        for (int r = 0; r < a.repeats; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          for (int step = 0; step < steps_per_rep; ++step) {
            for (int i = 0; i < n; ++i) batch[size_t(i)] = {ids[size_t(i)], std::span<const int32_t>(&next[size_t(i)], 1)};
            c.eval_sequences(batch);
            for (int i = 0; i < n; ++i) {
              const float* l = c.sequence_logits(i);
              next[size_t(i)] = int32_t(llm::kernels().argmax(l, nv));
            }
          }
          best = std::max(best, double(n) * steps_per_rep / seconds_since(t0));
        }
        const energy::Reading decode1 = energy.read();
        const llm::KvCacheStats st = c.kv_cache().stats();
        const double peak = double(st.peak_blocks * st.block_bytes + st.staged_tokens * model->config().head_dim * 4);
        int64_t bytes = 0;
        for (int i = 0; i < n; ++i) bytes += c.kv_cache().sequence_bytes(ids[size_t(i)]);
        if (vi == 0) full_tps = best;
        double one = 0;
        for (const auto& [k, t] : one_seq)
          if (k.first == ctx && k.second == vi) one = t;
        if (n == 1) one_seq.push_back({{ctx, vi}, best});
        char vs_one[16] = "-";
        if (one > 0) std::snprintf(vs_one, sizeof vs_one, "%.2fx", best / one);
        nlohmann::json row = {{"ctx", ctx}, {"seqs", n}, {"setting", v.label()}, {"decode_tok_s", best},
                              {"vs_full", best / full_tps}, {"kv_peak_mb", peak / 1e6},
                              {"kv_bytes_per_ctx_token", double(bytes) / (double(n) * (ctx + a.decode))}};
        std::string cells;
        if (energy) {
          const double decoded = double(n) * steps_per_rep * a.repeats;
          char buf[96];
          std::snprintf(buf, sizeof buf, "  %13s  %12s", energy.cell(prefill0, decode0, double(n) * ctx, row, "prefill").c_str(),
                        energy.cell(decode0, decode1, decoded, row, "decode").c_str());
          cells = buf + std::string("  ") +
                  energy::si(row["decode"]["gco2e_per_token"].get<double>(), "gCO2e");
        }
        std::printf("%6d %5d  %-32s %11.1f %8.2fx %9s %7.1fMB %12.0f%s\n", ctx, n, v.label().c_str(), best, best / full_tps,
                    vs_one, peak / 1e6, double(bytes) / (double(n) * (ctx + a.decode)), cells.c_str());
        std::fflush(stdout);
        report["rows"].push_back(row);
      }
    }
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("process peak RSS: %.1f MB\n", double(ru.ru_maxrss) / 1024.0);
  energy.write(a.json, report);
}

// Continuous batching end to end: the same requests through the scheduler and one after
// another, both timed from submission to the last token.
void run_kv_bench_scheduler(const KvBenchArgs& a) {
  auto model = llm::LlamaModel::load(a.model, a.mmap);
  const std::vector<int> seqs = int_list(a.seqs, "sequence count"), ctxs = int_list(a.ctxs, "context");
  const int nv = model->config().n_vocab;
  std::printf("kernels: %s\n", isa_report().c_str());
  KvEnergy energy(a);
  nlohmann::json report = {{"model", a.model}, {"kernels", isa_report()}, {"decode_steps", a.decode}, {"rows", nlohmann::json::array()}};
  std::printf("%6s %5s %14s %14s %8s%s\n", "prompt", "seqs", "batched t/s", "sequential t/s", "ratio",
              energy ? "  batched J/tok  sequential J/tok (prefill included)" : "");
  for (int ctx : ctxs)
    for (int n : seqs) {
      std::mt19937 rng(7);
      std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(n));
      for (auto& p : prompts) {
        p.resize(size_t(ctx));
        for (auto& t : p) t = int32_t(rng() % uint32_t(nv));
      }
      llm::ContextOptions o;
      o.n_ctx = ctx + a.decode;
      o.n_threads = a.threads;
      o.kv.paged = true;
      o.kv.max_seqs = n;
      o.n_batch = 512;
      double batched = 0, sequential = 0;
      energy::Reading b0, b1, s0, s1;
      {
        llm::LlamaContext c(model, o);
        llm::KvBatchScheduler s(c, {512, 256});
        for (auto& p : prompts) s.submit({p, a.decode});
        const auto t0 = std::chrono::steady_clock::now();
        b0 = energy.read();
        s.run();
        b1 = energy.read();
        batched = double(n) * a.decode / seconds_since(t0);
      }
      {
        o.kv.max_seqs = 1;
        llm::LlamaContext c(model, o);
        llm::KvBatchScheduler s(c, {512, 256});
        for (auto& p : prompts) s.submit({p, a.decode});
        const auto t0 = std::chrono::steady_clock::now();
        s0 = energy.read();
        s.run();
        s1 = energy.read();
        sequential = double(n) * a.decode / seconds_since(t0);
      }
      nlohmann::json row = {{"prompt", ctx}, {"seqs", n}, {"batched_tok_s", batched}, {"sequential_tok_s", sequential}};
      std::string cells;
      if (energy) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "  %13s  %16s", energy.cell(b0, b1, double(n) * a.decode, row, "batched").c_str(),
                      energy.cell(s0, s1, double(n) * a.decode, row, "sequential").c_str());
        cells = buf;
      }
      std::printf("%6d %5d %14.1f %14.1f %7.2fx%s\n", ctx, n, batched, sequential, batched / sequential, cells.c_str());
      std::fflush(stdout);
      report["rows"].push_back(row);
    }
  energy.write(a.json, report);
}

void add_kv_bench(CLI::App& app) {
  auto a = std::make_shared<KvBenchArgs>();
  auto* cmd = app.add_subcommand("kv-bench",
                                 "Decode throughput and KV memory of many sequences per forward pass, per KV policy, "
                                 "budget and format (relative to the full F16 cache and to one sequence)");
  cmd->add_option("model", a->model, "GGUF model file")->required();
  cmd->add_option("-f,--file", a->file, "Text for the prompts (default: random tokens)");
  cmd->add_option("--seqs", a->seqs, "Concurrent sequences (comma list)");
  cmd->add_option("--ctx", a->ctxs, "Context tokens per sequence before decoding (comma list)");
  cmd->add_option("--policy", a->policy, "Policies (comma list or all); the first setting is the baseline");
  cmd->add_option("--budget", a->budget, "Budgets (comma list)");
  cmd->add_option("--kv-type", a->kv_type, "K/V formats (comma list)");
  cmd->add_option("--decode", a->decode, "Decode steps timed")->check(CLI::PositiveNumber);
  cmd->add_option("--repeats", a->repeats, "Split the decode steps into this many timed runs, report the best")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--slack", a->slack, "Tokens a stream may exceed its budget before eviction")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--scheduler", a->scheduler,
                "Instead: requests through the continuous-batching scheduler vs one after another (prefill included)");
  cmd->add_option("--json", a->json, "Also write the table (and energy) as JSON to this file");
  add_energy_options(cmd, &a->energy);
  add_mmap_flag(cmd, &a->mmap);
  add_threads_option(cmd, &a->threads);
  add_isa_option(cmd);
  cmd->callback([a] {
    if (a->scheduler) run_kv_bench_scheduler(*a);
    else run_kv_bench(*a);
  });
}

}  // namespace

SLIM_COMMAND(45, add_kv_eval);
SLIM_COMMAND(46, add_kv_bench);

}  // namespace slim::cli
