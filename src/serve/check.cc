// How `slim check` probes (see check.h). One keep-alive HTTP connection carries the REST
// and OpenAI requests, gRPC gets a channel of its own. Every probe writes its answer, or
// why there was none, into the report and the next probe runs anyway, so one broken
// route does not hide what the others say; judge_report() reads the verdict off it.
#include "slim/serve/check.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <regex>

#include "serve/grpc_service.grpc.pb.h"
#include "slim/core/error.h"

namespace slim::serve {
namespace {

namespace pb = ::inference;
using json = nlohmann::ordered_json;

// A reference input above this many elements is not sent (its JSON would pass 32 MB).
constexpr int64_t kMaxReferenceElements = int64_t(1) << 24;
constexpr char kCompletionPrompt[] = "Hello";
constexpr int kCompletionTokens = 4;

struct Endpoint {
  std::string host;  // without the brackets of an IPv6 address
  int port = 80;
};

Endpoint parse_url(const std::string& url) {
  static const std::regex form(R"(^(?:([A-Za-z][A-Za-z0-9+.-]*)://)?(\[[0-9A-Fa-f:.]+\]|[^/:\[\]@]+)(?::(\d{1,5}))?/?$)");
  std::smatch m;
  check(std::regex_match(url, m, form), ErrorCode::invalid_argument,
        "'" + url + "' is not a server URL of the form http://HOST[:PORT]");
  check(!m[1].matched || m[1] == "http", ErrorCode::invalid_argument,
        "'" + url + "': only http:// servers can be checked");
  Endpoint e{m[2], m[3].matched ? std::stoi(m[3]) : 80};
  check(e.port >= 1 && e.port <= 65535, ErrorCode::invalid_argument, "'" + url + "': port out of range");
  if (e.host.front() == '[') e.host = e.host.substr(1, e.host.size() - 2);
  return e;
}

// A model name as one URL path segment.
std::string segment(const std::string& name) {
  static const char hex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : name) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += char(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

const json* field(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

json field_or_null(const json& j, const char* key) {
  const json* f = field(j, key);
  return f ? *f : json();
}

std::string text(const json& j) {
  return j.is_string() ? j.get<std::string>() : j.dump();
}

struct Reply {
  std::string what;  // "GET /v2"
  int status = 0;    // 0: no answer
  std::string error;  // why there was no answer
  json body;          // parsed; discarded when the body is not JSON

  bool ok() const { return status == 200; }
  // What went wrong, for the report: no answer, or the status and the server's message.
  std::string failure() const {
    if (status == 0) return what + ": " + error;
    std::string message;
    if (const json* e = field(body, "error")) message = e->is_string() ? e->get<std::string>() : e->dump();
    return what + " answered " + std::to_string(status) + (message.empty() ? "" : ": " + message);
  }
};

class HttpProbe {
 public:
  HttpProbe(const Endpoint& e, int timeout_ms) : client_(e.host, e.port), timeout_ms_(timeout_ms) {
    const std::chrono::milliseconds t(timeout_ms);
    client_.set_connection_timeout(t);
    client_.set_read_timeout(t);
    client_.set_write_timeout(t);
    client_.set_keep_alive(true);
    client_.set_tcp_nodelay(true);  // the head and the body go out in two writes: no 40 ms delayed-ACK wait
  }

  Reply get(const std::string& path) { return reply("GET " + path, client_.Get(path.c_str())); }
  Reply post(const std::string& path, const std::string& body) {
    return reply("POST " + path, client_.Post(path.c_str(), body, "application/json"));
  }

 private:
  Reply reply(std::string what, const httplib::Result& r) {
    Reply out;
    out.what = std::move(what);
    if (!r) {
      const std::string ms = std::to_string(timeout_ms_) + " ms";
      switch (r.error()) {
        case httplib::Error::Connection: out.error = "cannot connect (refused or unreachable)"; break;
        case httplib::Error::ConnectionTimeout: out.error = "no connection within " + ms; break;
        case httplib::Error::Read: out.error = "no answer within " + ms + ", or the connection closed"; break;
        default: out.error = "HTTP client error " + httplib::to_string(r.error()); break;
      }
      return out;
    }
    out.status = r->status;
    out.body = json::parse(r->body, nullptr, false);
    return out;
  }

  httplib::Client client_;
  int timeout_ms_;
};

// The request a latency sample sends: zeros of each input's datatype and shape, free
// dimensions (-1, the batch dimension first) set to 1. Throws invalid_argument when the
// metadata does not describe the inputs well enough.
std::string reference_request(const json& inputs) {
  std::string body = R"({"inputs":[)";
  for (size_t i = 0; i < inputs.size(); ++i) {
    const json& in = inputs[i];
    const json *name = field(in, "name"), *type = field(in, "datatype"), *shape = field(in, "shape");
    check(name && name->is_string() && type && type->is_string() && shape && shape->is_array(),
          ErrorCode::invalid_argument, "input " + std::to_string(i) + " of the metadata has no name, datatype or shape");
    const std::string where = "input '" + name->get<std::string>() + "'";
    json dims = json::array();
    int64_t n = 1;
    for (const json& d : *shape) {
      check(d.is_number_integer() && d.get<int64_t>() >= -1, ErrorCode::invalid_argument,
            where + " has shape " + shape->dump() + ", which is not a list of dimensions");
      const int64_t v = d.get<int64_t>() < 0 ? 1 : d.get<int64_t>();
      check(v <= kMaxReferenceElements && (n *= v) <= kMaxReferenceElements, ErrorCode::invalid_argument,
            where + " of shape " + shape->dump() + " has more than 2^24 elements: no reference input is sent");
      dims.push_back(v);
    }
    const std::string zero = *type == "BOOL" ? "false" : *type == "BYTES" ? "\"\"" : "0";
    std::string head = json{{"name", *name}, {"datatype", *type}, {"shape", dims}}.dump();
    head.pop_back();  // the data goes inside the object
    body += (i ? "," : "") + head + ",\"data\":[";
    for (int64_t k = 0; k < n; ++k) body += (k ? "," : "") + zero;
    body += "]}";
  }
  return body + "]}";
}

// Runs `once` n times; it returns "" on success, else what failed.
json sample_latency(int n, const std::function<std::string()>& once) {
  std::vector<double> ms;
  std::string first_error;
  for (int i = 0; i < n; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string error = once();
    const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (error.empty()) ms.push_back(dt);
    else if (first_error.empty()) first_error = error;
  }
  std::sort(ms.begin(), ms.end());
  auto rounded = [&](double v) { return ms.empty() ? json() : json(std::round(v * 1000) / 1000); };
  const size_t k = ms.size();
  return {{"samples", n},
          {"succeeded", k},
          {"min_ms", rounded(k ? ms.front() : 0)},
          {"median_ms", rounded(k ? (k % 2 ? ms[k / 2] : (ms[k / 2 - 1] + ms[k / 2]) / 2) : 0)},
          {"max_ms", rounded(k ? ms.back() : 0)},
          {"error", first_error.empty() ? json() : json(first_error)}};
}

bool has_inputs(const json& metadata) {
  const json* in = field(metadata, "inputs");
  return in && in->is_array() && !in->empty();
}

void add_protocol(json& model, const char* protocol) {
  json& p = model["protocols"];
  if (std::find(p.begin(), p.end(), protocol) == p.end()) p.push_back(protocol);
}

json& model_entry(json& models, const std::string& name) {
  for (json& m : models)
    if (m["name"] == name) return m;
  models.push_back({{"name", name},
                    {"platform", nullptr},
                    {"protocols", json::array()},
                    {"versions", json::array()},
                    {"inputs", nullptr},
                    {"outputs", nullptr},
                    {"batching", nullptr},
                    {"latency", nullptr},
                    {"errors", json::array()}});
  return models.back();
}

json version_entry(json version, json state, json reason) {
  return {{"version", std::move(version)}, {"state", std::move(state)}, {"reason", std::move(reason)},
          {"signed", nullptr}, {"signer", nullptr}, {"variant", nullptr}};
}

// What slim's model metadata adds ("slim": {signed, signer, variant}) onto a version entry.
void add_slim_fields(json& version, const json& metadata) {
  const json slim = field_or_null(metadata, "slim");
  for (const char* key : {"signed", "signer", "variant"}) version[key] = field_or_null(slim, key);
}

// The KServe side of one model: metadata, config, slim's per-version fields.
void probe_kserve_model(HttpProbe& http, json& m, int samples) {
  const std::string path = "/v2/models/" + segment(m["name"].get<std::string>());
  const Reply md = http.get(path);
  if (!md.ok()) {
    m["errors"].push_back(md.failure());
    return;
  }
  m["platform"] = field_or_null(md.body, "platform");
  m["inputs"] = field_or_null(md.body, "inputs");
  m["outputs"] = field_or_null(md.body, "outputs");
  json& versions = m["versions"];
  if (versions.empty())  // no repository index: the versions the metadata names, state unknown
    if (const json* vs = field(md.body, "versions"); vs && vs->is_array())
      for (const json& v : *vs) versions.push_back(version_entry(v, nullptr, nullptr));
  // Which versions are signed: the model's metadata says it for its one version, each
  // version's own metadata when several are served.
  size_t ready = 0;
  for (const json& v : versions) ready += v["state"] != "UNAVAILABLE";
  for (json& v : versions) {
    if (v["state"] == "UNAVAILABLE" || !v["version"].is_string()) continue;
    if (ready == 1 || !field(md.body, "slim")) {
      add_slim_fields(v, md.body);
    } else {
      const Reply vmd = http.get(path + "/versions/" + segment(v["version"].get<std::string>()));
      if (vmd.ok()) add_slim_fields(v, vmd.body);
      else m["errors"].push_back(vmd.failure());
    }
  }
  if (!has_inputs(md.body)) return;  // a language model's entry: no tensors to call it with
  add_protocol(m, "kserve_rest");
  // Batching and priorities, where the server has Triton's config route (404 elsewhere).
  if (const Reply config = http.get(path + "/config"); config.ok())
    m["batching"] = {{"max_batch_size", field_or_null(config.body, "max_batch_size")},
                     {"dynamic_batching", field_or_null(config.body, "dynamic_batching")}};
  if (samples == 0) return;
  std::string request;
  try {
    request = reference_request(md.body["inputs"]);
  } catch (const Error& e) {
    m["errors"].push_back(std::string("no latency sample: ") + e.what());
    return;
  }
  m["latency"] = sample_latency(samples, [&] {
    const Reply r = http.post(path + "/infer", request);
    if (!r.ok()) return r.failure();
    const json* outputs = field(r.body, "outputs");
    return outputs && outputs->is_array() ? std::string() : r.what + ": the answer has no 'outputs'";
  });
}

void probe_openai_model(HttpProbe& http, json& m, int samples) {
  if (samples == 0 || !m["latency"].is_null()) return;
  const std::string request = json{{"model", m["name"]},
                                   {"prompt", kCompletionPrompt},
                                   {"max_tokens", kCompletionTokens},
                                   {"temperature", 0}}
                                  .dump();
  m["latency"] = sample_latency(samples, [&] {
    const Reply r = http.post("/v1/completions", request);
    if (!r.ok()) return r.failure();
    const json* choices = field(r.body, "choices");
    return choices && choices->is_array() && !choices->empty() ? std::string()
                                                               : r.what + ": the answer has no 'choices'";
  });
}

void set_deadline(grpc::ClientContext& context, int timeout_ms) {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
}

// KServe v2 over gRPC: health and server metadata, then each REST model's metadata.
json probe_grpc(const std::string& address, bool requested, int timeout_ms, json& models) {
  json out{{"address", address}, {"requested", requested}, {"answered", false},
           {"live", nullptr}, {"ready", nullptr}, {"server", nullptr}, {"error", nullptr}};
  auto stub = pb::GRPCInferenceService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  auto failed = [&](const grpc::Status& s, const std::string& rpc) {
    out["error"] = rpc + ": " + s.error_message() + " (gRPC status " + std::to_string(int(s.error_code())) + ")";
  };
  {
    grpc::ClientContext c;
    set_deadline(c, timeout_ms);
    pb::ServerLiveResponse live;
    if (grpc::Status s = stub->ServerLive(&c, {}, &live); !s.ok()) {
      failed(s, "ServerLive");
      return out;
    }
    out["answered"] = true;
    out["live"] = live.live();
  }
  {
    grpc::ClientContext c;
    set_deadline(c, timeout_ms);
    pb::ServerReadyResponse ready;
    if (grpc::Status s = stub->ServerReady(&c, {}, &ready); s.ok()) out["ready"] = ready.ready();
    else failed(s, "ServerReady");
  }
  {
    grpc::ClientContext c;
    set_deadline(c, timeout_ms);
    pb::ServerMetadataResponse md;
    if (grpc::Status s = stub->ServerMetadata(&c, {}, &md); s.ok())
      out["server"] = {{"name", md.name()}, {"version", md.version()}};
    else failed(s, "ServerMetadata");
  }
  for (json& m : models) {
    const json& p = m["protocols"];
    if (std::find(p.begin(), p.end(), "kserve_rest") == p.end()) continue;
    grpc::ClientContext c;
    set_deadline(c, timeout_ms);
    pb::ModelMetadataRequest request;
    request.set_name(m["name"].get<std::string>());
    pb::ModelMetadataResponse md;
    if (grpc::Status s = stub->ModelMetadata(&c, request, &md); !s.ok())
      m["errors"].push_back("gRPC ModelMetadata: " + s.error_message());
    else if (md.inputs_size() > 0)
      add_protocol(m, "kserve_grpc");
  }
  return out;
}

std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

}  // namespace

json check_server(const CheckOptions& o) {
  const Endpoint endpoint = parse_url(o.url);
  HttpProbe http(endpoint, o.timeout_ms);
  json report{{"url", o.url}, {"answered", false}, {"error", nullptr}};

  const Reply meta = http.get("/v2");
  if (meta.status == 0) {
    report["error"] = meta.failure();
    return report;
  }
  report["answered"] = true;
  const bool kserve = meta.ok() && meta.body.is_object();
  report["server"] = {{"name", field_or_null(meta.body, "name")},
                      {"version", field_or_null(meta.body, "version")},
                      {"extensions", field_or_null(meta.body, "extensions")}};
  report["slim"] = field_or_null(meta.body, "slim");

  json rest{{"answered", kserve}, {"live", nullptr}, {"ready", nullptr}};
  if (kserve) {
    const Reply live = http.get("/v2/health/live"), ready = http.get("/v2/health/ready");
    rest["live"] = live.ok();
    rest["ready"] = ready.ok();
  }
  // GET /v1/models is OpenAI's list ({"data": [{"id": ...}]}) or KServe v1's ({"models": [names]}).
  const Reply listing = http.get("/v1/models");
  const json* openai_models = listing.ok() ? field(listing.body, "data") : nullptr;
  const json* v1_models = listing.ok() ? field(listing.body, "models") : nullptr;
  const bool openai_list = openai_models && openai_models->is_array();
  // llama-server answers every route 503 with an OpenAI error object ({"error": {"message":
  // "Loading model", ...}}) while it loads its model: the API is there, not ready yet, which
  // its /health then says.
  const json* listing_error = listing.status == 503 ? field(listing.body, "error") : nullptr;
  const bool has_openai = openai_list || (listing_error && field(*listing_error, "message"));
  json openai{{"answered", has_openai}, {"health", nullptr}};
  if (has_openai) {
    const Reply health = http.get("/health");
    if (health.status == 200 || health.status == 503) openai["health"] = health.ok();
  }

  json models = json::array();
  const json* extensions = field(meta.body, "extensions");
  if (kserve && extensions && extensions->is_array() &&
      std::find(extensions->begin(), extensions->end(), "model_repository") != extensions->end()) {
    const Reply index = http.post("/v2/repository/index", "{}");
    if (index.ok() && index.body.is_array()) {
      for (const json& e : index.body) {
        const json* name = field(e, "name");
        if (!name || !name->is_string()) continue;
        json version = field_or_null(e, "version");
        if (version == "") version = nullptr;  // a model that is not loaded
        model_entry(models, name->get<std::string>())["versions"].push_back(
            version_entry(version, field_or_null(e, "state"), field_or_null(e, "reason")));
      }
    } else {
      report["error"] = index.failure();
    }
  }
  if (openai_list)
    for (const json& m : *openai_models)
      if (const json* id = field(m, "id"); id && id->is_string())
        add_protocol(model_entry(models, id->get<std::string>()), "openai");
  if (kserve && v1_models && v1_models->is_array())
    for (const json& name : *v1_models)
      if (name.is_string()) model_entry(models, name.get<std::string>());

  for (json& m : models) {
    bool servable = m["versions"].empty();  // state unknown: try it
    for (const json& v : m["versions"]) servable |= v["state"] != "UNAVAILABLE";
    if (kserve && servable) probe_kserve_model(http, m, o.samples);
    const json& p = m["protocols"];
    if (std::find(p.begin(), p.end(), "openai") != p.end()) probe_openai_model(http, m, o.samples);
  }

  std::string grpc_address = o.grpc;
  if (grpc_address.empty() && endpoint.port == 8000)
    grpc_address = (endpoint.host.find(':') != std::string::npos ? "[" + endpoint.host + "]" : endpoint.host) + ":8001";
  json grpc_report{{"address", nullptr}, {"requested", false}, {"answered", nullptr}};
  if (!grpc_address.empty()) grpc_report = probe_grpc(grpc_address, !o.grpc.empty(), o.timeout_ms, models);

  report["protocols"] = {{"kserve_rest", rest}, {"kserve_grpc", grpc_report}, {"openai", openai}};
  report["models"] = std::move(models);
  return report;
}

CheckVerdict judge_report(const json& report) {
  CheckVerdict v;
  if (field_or_null(report, "answered") != true) {
    v.exit_code = 2;
    v.problems.push_back("the server does not answer: " + text(field_or_null(report, "error")));
    return v;
  }
  bool integrity = false;
  auto problem = [&](std::string text) { v.problems.push_back(std::move(text)); };
  if (const json e = field_or_null(report, "error"); !e.is_null()) problem(text(e));
  const json protocols = field_or_null(report, "protocols");
  const json rest = field_or_null(protocols, "kserve_rest"), grpc = field_or_null(protocols, "kserve_grpc"),
             openai = field_or_null(protocols, "openai");
  if (field_or_null(rest, "answered") != true && field_or_null(openai, "answered") != true)
    problem("neither KServe v2 (GET /v2) nor the OpenAI API (GET /v1/models) answers");
  if (field_or_null(rest, "live") == false) problem("KServe v2 REST: the server is not live");
  if (field_or_null(rest, "ready") == false) problem("KServe v2 REST: the server is not ready");
  if (field_or_null(grpc, "answered") == true) {
    if (field_or_null(grpc, "live") == false) problem("KServe v2 gRPC: the server is not live");
    if (field_or_null(grpc, "ready") == false) problem("KServe v2 gRPC: the server is not ready");
  }
  // A gRPC address guessed from the URL that nobody answers is no failure: the server has no gRPC.
  if (const json e = field_or_null(grpc, "error");
      !e.is_null() && (field_or_null(grpc, "requested") == true || field_or_null(grpc, "answered") == true))
    problem("KServe v2 gRPC at " + text(field_or_null(grpc, "address")) + ": " + text(e));
  if (field_or_null(openai, "health") == false) problem("OpenAI API: GET /health says the server is not ready");

  const json models = field_or_null(report, "models");
  for (const json& m : models.is_array() ? models : json::array()) {
    const std::string name = "model '" + text(field_or_null(m, "name")) + "'";
    const json versions = field_or_null(m, "versions");
    for (const json& ver : versions.is_array() ? versions : json::array()) {
      const json reason = field_or_null(ver, "reason");
      const std::string why = reason.is_string() ? lowercase(reason) : "";
      if (field_or_null(ver, "state") == "UNAVAILABLE" &&
          (why.find("signature") != std::string::npos || why.find("integrity") != std::string::npos)) {
        integrity = true;
        const json version = field_or_null(ver, "version");
        problem(name + (version.is_null() ? "" : " version " + text(version)) + " is unavailable: " + text(reason));
      }
    }
    const json errors = field_or_null(m, "errors");
    for (const json& e : errors.is_array() ? errors : json::array()) problem(name + ": " + text(e));
    const json latency = field_or_null(m, "latency"), samples = field_or_null(latency, "samples"),
               succeeded = field_or_null(latency, "succeeded");
    if (samples.is_number_integer() && succeeded.is_number_integer() && succeeded.get<int64_t>() < samples.get<int64_t>())
      problem(name + ": " + std::to_string(samples.get<int64_t>() - succeeded.get<int64_t>()) + " of " + text(samples) +
              " samples failed: " + text(field_or_null(latency, "error")));
  }
  v.exit_code = integrity ? 3 : v.problems.empty() ? 0 : 1;
  return v;
}

}  // namespace slim::serve
