// The OpenAI API routes: requests parsed by openai_codec.cc become LlmService generations,
// answered as one JSON body or as Server-Sent Events.
#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "http_routes.h"
#include "slim/core/error.h"
#include "slim/llm/expert_report.h"
#include "slim/serve/energy_ledger.h"
#include "slim/serve/inference.h"
#include "slim/serve/openai.h"

namespace slim::serve {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& message) { throw Error(ErrorCode::invalid_argument, message); }


using httplib::Request;
using httplib::Response;

constexpr char kJson[] = "application/json";

void openai_error(Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(encode_openai_error(status, message), kJson);
  if (status == 429) res.set_header("Retry-After", "1");
}

// Runs a handler; whatever it throws becomes an OpenAI error response.
template <typename Fn>
void guarded(Response& res, Fn&& fn) {
  run_guarded(fn, [&res](int status, const std::string& message) { openai_error(res, status, message); });
}

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string new_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = [] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) | rd();
  }();
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s-%016llx", prefix, static_cast<unsigned long long>(salt ^ (++counter * 0x9E3779B97F4A7C15ull)));
  return buf;
}

// Logprobs in the chat shape ({"content": [...]}) or the legacy completions one.
ojson logprobs_json(const std::vector<TokenLogprob>& lps, bool chat, size_t text_offset) {
  auto bytes = [](const std::string& s) {
    ojson b = ojson::array();
    for (unsigned char c : s) b.push_back(int(c));
    return b;
  };
  if (chat) {
    ojson content = ojson::array();
    for (const TokenLogprob& t : lps) {
      ojson top = ojson::array();
      for (const auto& [tok, lp] : t.top) top.push_back({{"token", tok}, {"logprob", lp}, {"bytes", bytes(tok)}});
      content.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", bytes(t.token)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  ojson tokens = ojson::array(), token_lps = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  for (const TokenLogprob& t : lps) {
    tokens.push_back(t.token);
    token_lps.push_back(t.logprob);
    ojson top = ojson::object();
    for (const auto& [tok, lp] : t.top) top[tok] = lp;
    tops.push_back(top);
    offsets.push_back(text_offset);
    text_offset += t.token.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// With `energy` (the request asked), the generation's share of the steps it ran in.
ojson usage_json(const LlmGeneration& g, const EnergyLedger* energy) {
  ojson u = {{"prompt_tokens", g.prompt_tokens()},
             {"completion_tokens", g.completion_tokens()},
             {"total_tokens", g.prompt_tokens() + g.completion_tokens()},
             {"prompt_tokens_details", {{"cached_tokens", g.reused_tokens()}}}};
  if (energy)
    u["energy"] = {{"joules", g.prefill_joules() + g.decode_joules()},
                   {"prefill_joules", g.prefill_joules()},
                   {"decode_joules", g.decode_joules()},
                   {"source", energy->source()},
                   {"carbon_grams", g.carbon_grams()},
                   {"region", energy->region()}};
  if (energy && g.experts().n_expert > 0) {
    const llm::WorkEnergy work{g.prefill_joules() + g.decode_joules(), g.carbon_grams(), energy->source()};
    u["experts"] = ojson(llm::expert_usage_json(g.experts(), &work));
  }
  return u;
}

// slim's own numbers about a finished request (OpenAI clients ignore unknown fields).
ojson slim_json(const LlmGeneration& g) {
  return {{"kv_bytes", g.kv_bytes()}, {"preemptions", g.preemptions()}};
}

int priority_of(const Request& req, const OpenAiRequest& r, const LlmService& llm) {
  if (r.priority) return *r.priority;
  if (req.has_header("X-Priority")) {
    const std::string h = req.get_header_value("X-Priority");
    try {
      size_t end = 0;
      const int p = std::stoi(h, &end);
      if (end == h.size() && p >= -1000 && p <= 1000) return p;
    } catch (const std::exception&) {
    }
    bad("the X-Priority header must be an integer from -1000 to 1000, not '" + h + "'");
  }
  return llm.options().default_priority;
}

std::shared_ptr<LlmService> pick_model(InferenceServer& server, const std::string& name) {
  if (!name.empty()) {
    try {
      return server.language_model(name);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::not_found) throw Error(ErrorCode::not_found, "the model '" + name + "' does not exist");
      throw;
    }
  }
  const auto all = server.language_models();
  if (all.size() != 1) bad("'model' is required: this server has " + std::to_string(all.size()) + " language models");
  return all.front();
}

// One request from parsed JSON to a running generation.
struct Call {
  std::shared_ptr<void> hold;
  std::shared_ptr<LlmService> llm;
  std::shared_ptr<LlmGeneration> gen;
  OpenAiRequest req;
  std::string id, model;
  int64_t created = 0;
};

Call start_call(InferenceServer& server, const Request& http, bool chat) {
  Call c;
  c.req = parse_openai_request(http.body, chat);
  c.llm = pick_model(server, c.req.model);
  c.model = c.llm->name();
  if (c.req.energy && !c.llm->energy())
    bad("'slim_energy': this server does not meter energy (start slim serve with --energy)");
  LlmRequest lr;
  if (chat) {
    lr.prompt = c.llm->tokenize(c.llm->render_chat(c.req.messages));
  } else if (c.req.prompt_is_tokens) {
    lr.prompt = c.req.prompt_tokens;
  } else {
    lr.prompt = c.llm->tokenize(c.req.prompt);
  }
  lr.max_tokens = c.req.max_tokens;
  lr.sampling = c.req.sampling;
  if (!c.req.seeded) lr.sampling.seed = (uint64_t(std::random_device{}()) << 32) | std::random_device{}();
  lr.stop = c.req.stop;
  lr.top_logprobs = c.req.top_logprobs;
  lr.n = c.req.n;
  lr.priority = priority_of(http, c.req, *c.llm);
  c.hold = server.hold_request();
  c.gen = c.llm->submit(std::move(lr));
  c.id = new_id(chat ? "chatcmpl" : "cmpl");
  c.created = unix_now();
  return c;
}

int status_of_failure(const std::string& error) {
  return error.find("shutting down") != std::string::npos ? 503 : 500;
}

void complete(const Call& c, Response& res) {
  const bool chat = c.req.chat;
  std::vector<std::string> text(size_t(c.req.n)), finish(size_t(c.req.n));
  std::vector<std::vector<TokenLogprob>> lps(size_t(c.req.n));
  std::vector<LlmEvent> events;
  while (!c.gen->finished()) {
    events.clear();
    c.gen->next(events, std::chrono::milliseconds(100));
    for (LlmEvent& e : events) {
      if (e.finish == "error") {
        openai_error(res, status_of_failure(e.error), e.error);
        c.gen->cancel();
        return;
      }
      text[size_t(e.choice)] += e.text;
      for (auto& t : e.logprobs) lps[size_t(e.choice)].push_back(std::move(t));
      if (!e.finish.empty()) finish[size_t(e.choice)] = e.finish;
    }
  }
  ojson choices = ojson::array();
  for (int i = 0; i < c.req.n; ++i) {
    ojson ch = {{"index", i}};
    if (chat)
      ch["message"] = {{"role", "assistant"}, {"content", text[size_t(i)]}};
    else
      ch["text"] = text[size_t(i)];
    ch["logprobs"] = c.req.top_logprobs >= 0 ? logprobs_json(lps[size_t(i)], chat, 0) : ojson(nullptr);
    ch["finish_reason"] = finish[size_t(i)];
    choices.push_back(ch);
  }
  ojson body = {{"id", c.id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", c.created},
                {"model", c.model},
                {"system_fingerprint", std::string("slim-") + SLIM_VERSION_STRING},
                {"choices", choices},
                {"usage", usage_json(*c.gen, c.req.energy ? c.llm->energy() : nullptr)},
                {"slim", slim_json(*c.gen)}};
  res.status = 200;
  res.set_content(dump(body), kJson);
}

// Server-Sent Events: a chunk per event, the final chunks, usage when asked, [DONE].
class Streamer {
 public:
  explicit Streamer(Call c) : c_(std::move(c)), offsets_(size_t(c_.req.n), 0), started_(size_t(c_.req.n), false) {}

  // Writes what has happened since the last call; false when the stream is over.
  bool pump(httplib::DataSink& sink) {
    if (done_) return false;
    std::vector<LlmEvent> events;
    c_.gen->next(events, std::chrono::milliseconds(50));
    std::string out;
    for (const LlmEvent& e : events) out += chunks_for(e);
    if (c_.gen->finished()) {
      if (c_.req.include_usage)
        out += frame({{"id", c_.id}, {"object", object()}, {"created", c_.created}, {"model", c_.model},
                      {"choices", ojson::array()},
                      {"usage", usage_json(*c_.gen, c_.req.energy ? c_.llm->energy() : nullptr)},
                      {"slim", slim_json(*c_.gen)}});
      out += "data: [DONE]\n\n";
      done_ = true;
    }
    // A client that went away cancels its sequences (their KV is freed at the next step).
    if ((!out.empty() && !sink.write(out.data(), out.size())) || !sink.is_writable()) {
      c_.gen->cancel();
      return false;
    }
    if (done_) sink.done();
    return true;
  }

  ~Streamer() {
    if (!done_) c_.gen->cancel();
  }

 private:
  const char* object() const { return c_.req.chat ? "chat.completion.chunk" : "text_completion"; }

  static std::string frame(const ojson& j) { return "data: " + dump(j) + "\n\n"; }

  std::string chunk(int choice, const std::string& text, const std::vector<TokenLogprob>& lps, const ojson& finish) {
    ojson ch = {{"index", choice}};
    if (c_.req.chat) {
      // The first chunk of a choice names the role; the last one has an empty delta.
      ojson delta = ojson::object();
      if (!started_[size_t(choice)]) delta["role"] = "assistant";
      if (finish.is_null()) delta["content"] = text;
      ch["delta"] = delta;
    } else {
      ch["text"] = text;
    }
    started_[size_t(choice)] = true;
    ch["logprobs"] = c_.req.top_logprobs >= 0 && !lps.empty()
                         ? logprobs_json(lps, c_.req.chat, offsets_[size_t(choice)])
                         : ojson(nullptr);
    offsets_[size_t(choice)] += text.size();
    ch["finish_reason"] = finish;
    ojson j = {{"id", c_.id}, {"object", object()}, {"created", c_.created}, {"model", c_.model},
               {"system_fingerprint", std::string("slim-") + SLIM_VERSION_STRING}, {"choices", ojson::array({ch})}};
    if (c_.req.include_usage) j["usage"] = nullptr;
    return frame(j);
  }

  std::string chunks_for(const LlmEvent& e) {
    if (e.finish == "error") return frame({{"error", json::parse(encode_openai_error(status_of_failure(e.error), e.error))["error"]}});
    if (e.finish == "cancelled") return "";
    std::string out;
    if (!e.text.empty() || !e.logprobs.empty() || (!started_[size_t(e.choice)] && c_.req.chat))
      out += chunk(e.choice, e.text, e.logprobs, nullptr);
    if (!e.finish.empty()) out += chunk(e.choice, "", {}, e.finish);
    return out;
  }

  Call c_;
  std::vector<size_t> offsets_;
  std::vector<bool> started_;
  bool done_ = false;
};

void handle_completion(InferenceServer& server, const Request& req, Response& res, bool chat) {
  guarded(res, [&] {
    Call c = start_call(server, req, chat);
    if (!c.req.stream) return complete(c, res);
    // Refusals (bad fields, a full queue) were answered with their status above; what
    // fails later (a shutdown) ends the stream with an error event.
    auto streamer = std::make_shared<Streamer>(std::move(c));
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider("text/event-stream", [streamer](size_t, httplib::DataSink& sink) {
      return streamer->pump(sink);
    });
  });
}

}  // namespace

void add_openai_routes(httplib::Server& http, InferenceServer& server) {
  http.Get("/health", [&server](const Request&, Response& res) {
    if (server.ready())
      res.set_content(R"({"status":"ok"})", kJson);
    else
      openai_error(res, 503, "Loading model");
  });
  http.Get("/v1/models", [&server](const Request&, Response& res) {
    guarded(res, [&] {
      ojson data = ojson::array();
      for (const auto& m : server.language_models())
        data.push_back({{"id", m->name()}, {"object", "model"}, {"created", m->created()}, {"owned_by", "slim"},
                        {"context_length", m->context_size()}});
      res.set_content(dump({{"object", "list"}, {"data", data}}), kJson);
    });
  });
  http.Get(R"(/v1/models/([^/]+))", [&server](const Request& req, Response& res) {
    guarded(res, [&] {
      const auto m = pick_model(server, req.matches[1]);
      res.set_content(dump({{"id", m->name()}, {"object", "model"}, {"created", m->created()}, {"owned_by", "slim"},
                            {"context_length", m->context_size()}}),
                      kJson);
    });
  });
  http.Post("/v1/chat/completions",
            [&server](const Request& req, Response& res) { handle_completion(server, req, res, true); });
  http.Post("/v1/completions",
            [&server](const Request& req, Response& res) { handle_completion(server, req, res, false); });
}

}  // namespace slim::serve
