// serve_loadgen: a load generator for `slim serve` (KServe v2 over REST JSON, REST with
// the binary tensor extension, or gRPC raw contents). Each stream is either closed loop
// (N clients, each on its own keep-alive connection, sending the next request when the
// last one answered) or open loop (Poisson arrivals at a rate, sent on schedule by a pool
// of connections; latency counts from the scheduled time, so a late send is charged to
// the request instead of hiding the server's queueing). Requests are encoded once per
// stream, so the client adds only its transport's microseconds. Loopback only. SIGINT
// ends the run before --duration and reports what was measured (a bench that loads the
// server while something else happens stops the load when that is done).
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "serve/grpc_service.grpc.pb.h"
#include "slim/core/error.h"
#include "slim/core/npy.h"
#include "slim/serve/model_config.h"

namespace {

using slim::Error;
using slim::ErrorCode;
using slim::Tensor;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

std::atomic<bool> g_stop{false};  // set by SIGINT: every worker ends after its current request

enum class Protocol { rest_json, rest_binary, grpc };
enum class Outcome { ok, rejected, unavailable, timeout, error };
constexpr const char* kOutcomeNames[] = {"ok", "rejected", "unavailable", "timeout", "error"};

Protocol parse_protocol(const std::string& s) {
  if (s == "rest-json") return Protocol::rest_json;
  if (s == "rest-binary") return Protocol::rest_binary;
  if (s == "grpc") return Protocol::grpc;
  throw Error(ErrorCode::invalid_argument,
              "protocol '" + s + "': expected rest-json, rest-binary or grpc");
}
const char* protocol_name(Protocol p) {
  return p == Protocol::rest_json     ? "rest-json"
         : p == Protocol::rest_binary ? "rest-binary"
                                      : "grpc";
}

struct StreamSpec {
  std::string text;       // as given, for the report
  uint32_t priority = 0;  // 0: the model's default level (the parameter is not sent)
  int clients = 0;        // closed loop
  double rate = 0;        // open loop, requests per second
  int connections = 0;    // open loop pool size (0: chosen from the rate)
  int64_t requests = 0;   // count bound (0: only the time bounds)
  Protocol protocol = Protocol::grpc;
};

int64_t to_int(const std::string& key, const std::string& v) {
  size_t end = 0;
  long long n = -1;
  try {
    n = std::stoll(v, &end);
  } catch (const std::exception&) {
  }
  if (end != v.size() || n < 0)
    throw Error(ErrorCode::invalid_argument, "--stream " + key + "='" + v + "': expected a count");
  return n;
}

// "priority=1,rate=50,protocol=rest-json" or "clients=32,requests=1000".
StreamSpec parse_stream(const std::string& text, Protocol default_protocol) {
  StreamSpec s;
  s.text = text;
  s.protocol = default_protocol;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    pos = comma + 1;
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw Error(ErrorCode::invalid_argument,
                  "--stream '" + text + "': '" + item + "' is not KEY=VALUE");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "priority") {
      s.priority = uint32_t(to_int(key, value));
    } else if (key == "clients") {
      s.clients = int(to_int(key, value));
    } else if (key == "rate") {
      size_t end = 0;
      try {
        s.rate = std::stod(value, &end);
      } catch (const std::exception&) {
      }
      if (end != value.size() || !(s.rate > 0))
        throw Error(ErrorCode::invalid_argument,
                    "--stream rate='" + value + "': expected requests per second > 0");
    } else if (key == "connections") {
      s.connections = int(to_int(key, value));
    } else if (key == "requests") {
      s.requests = to_int(key, value);
    } else if (key == "protocol") {
      s.protocol = parse_protocol(value);
    } else {
      throw Error(ErrorCode::invalid_argument,
                  "--stream '" + text + "': unknown key '" + key +
                      "' (priority, clients, rate, connections, requests, protocol)");
    }
  }
  if ((s.clients > 0) == (s.rate > 0))
    throw Error(
        ErrorCode::invalid_argument,
        "--stream '" + text + "': give either clients=N (closed loop) or rate=R (open loop)");
  // Enough connections to keep the schedule while answers take up to 50 ms each.
  if (s.rate > 0 && s.connections == 0)
    s.connections = std::clamp(int(std::ceil(s.rate * 0.05)), 8, 256);
  return s;
}

bool is_loopback(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

// One request of a stream, encoded once; every send reuses it.
struct Payload {
  std::string path, body, content_type;
  httplib::Headers headers;
  inference::ModelInferRequest grpc;
};

json tensor_values(const Tensor& t) {
  json a = json::array();
  const auto each = [&](auto* p) {
    for (int64_t i = 0; i < t.numel(); ++i) a.push_back(p[i]);
  };
  switch (t.dtype()) {
    case slim::DType::f32:
      each(t.data<float>());
      break;
    case slim::DType::f64:
      each(t.data<double>());
      break;
    case slim::DType::i64:
      each(t.data<int64_t>());
      break;
    case slim::DType::i32:
      each(t.data<int32_t>());
      break;
    case slim::DType::u8:
      each(t.data<uint8_t>());
      break;
    case slim::DType::i8:
      each(t.data<int8_t>());
      break;
    case slim::DType::boolean:
      each(t.data<bool>());
      break;
    default:
      throw Error(
          ErrorCode::unsupported,
          "input " + t.describe() + ": JSON encoding supports f32, f64, i64, i32, u8, i8, bool");
  }
  return a;
}

Payload make_payload(const StreamSpec& s, const std::string& model,
                     const std::vector<std::pair<std::string, Tensor>>& inputs) {
  Payload p;
  if (s.protocol == Protocol::grpc) {
    p.grpc.set_model_name(model);
    if (s.priority) (*p.grpc.mutable_parameters())["priority"].set_int64_param(s.priority);
    for (const auto& [name, t] : inputs) {
      auto* in = p.grpc.add_inputs();
      in->set_name(name);
      in->set_datatype(std::string(slim::serve::kserve_dtype_name(t.dtype())));
      for (int64_t d : t.shape()) in->add_shape(d);
      p.grpc.add_raw_input_contents(static_cast<const char*>(t.raw_data()), t.nbytes());
    }
    return p;
  }
  const bool binary = s.protocol == Protocol::rest_binary;
  json header = {{"inputs", json::array()}};
  if (s.priority) header["parameters"]["priority"] = s.priority;
  if (binary) header["parameters"]["binary_data_output"] = true;
  std::string tail;
  for (const auto& [name, t] : inputs) {
    json in = {{"name", name},
               {"datatype", slim::serve::kserve_dtype_name(t.dtype())},
               {"shape", t.shape()}};
    if (binary) {
      in["parameters"]["binary_data_size"] = t.nbytes();
      tail.append(static_cast<const char*>(t.raw_data()), t.nbytes());
    } else {
      in["data"] = tensor_values(t);
    }
    header["inputs"].push_back(std::move(in));
  }
  p.path = "/v2/models/" + model + "/infer";
  p.body = header.dump();
  p.content_type = "application/json";
  if (binary) {
    p.headers.emplace("Inference-Header-Content-Length", std::to_string(p.body.size()));
    p.body += tail;
    p.content_type = "application/octet-stream";
  }
  return p;
}

// One connection; send() blocks until the answer.
class Connection {
 public:
  virtual ~Connection() = default;
  virtual Outcome send(std::string* error) = 0;
};

class RestConnection : public Connection {
 public:
  RestConnection(const std::string& host, int port, const Payload& p, int timeout_s)
      : client_(host, port), p_(p) {
    client_.set_keep_alive(true);
    client_.set_tcp_nodelay(true);
    client_.set_connection_timeout(timeout_s);
    client_.set_read_timeout(timeout_s);
    client_.set_write_timeout(timeout_s);
  }
  Outcome send(std::string* error) override {
    auto res = client_.Post(p_.path, p_.headers, p_.body.data(), p_.body.size(), p_.content_type);
    if (!res) {
      *error = "HTTP: " + httplib::to_string(res.error());
      return res.error() == httplib::Error::Read ? Outcome::timeout : Outcome::error;
    }
    if (res->status == 200) return Outcome::ok;
    *error = "HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 200);
    return res->status == 429   ? Outcome::rejected
           : res->status == 503 ? Outcome::unavailable
                                : Outcome::error;
  }

 private:
  httplib::Client client_;
  const Payload& p_;
};

class GrpcConnection : public Connection {
 public:
  GrpcConnection(const std::string& host, int port, const Payload& p, int timeout_s)
      : p_(p), timeout_s_(timeout_s) {
    grpc::ChannelArguments args;
    // A channel of its own per connection: channels with equal arguments would otherwise
    // share one subchannel (one TCP connection) through gRPC's global pool.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxReceiveMessageSize(-1);
    auto channel = grpc::CreateCustomChannel(host + ":" + std::to_string(port),
                                             grpc::InsecureChannelCredentials(), args);
    if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                   std::chrono::seconds(timeout_s)))
      throw Error(ErrorCode::unavailable,
                  "gRPC: cannot connect to " + host + ":" + std::to_string(port));
    stub_ = inference::GRPCInferenceService::NewStub(channel);
  }
  Outcome send(std::string* error) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s_));
    inference::ModelInferResponse res;
    const grpc::Status st = stub_->ModelInfer(&ctx, p_.grpc, &res);
    if (st.ok()) return Outcome::ok;
    *error =
        "gRPC " + std::to_string(int(st.error_code())) + ": " + st.error_message().substr(0, 200);
    switch (st.error_code()) {
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
        return Outcome::rejected;
      case grpc::StatusCode::UNAVAILABLE:
        return Outcome::unavailable;
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        return Outcome::timeout;
      default:
        return Outcome::error;
    }
  }

 private:
  const Payload& p_;
  int timeout_s_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

struct Record {
  double start_us;  // scheduled (open loop) or actual (closed loop) send time, from the run's start
  double latency_us;  // from that time to the answer
  double lag_us;      // open loop: how late the send left (client saturation), else 0
  Outcome outcome;
};

struct Options {
  std::string host = "127.0.0.1";
  int http_port = 8000, grpc_port = 8001;
  std::string model;
  std::vector<std::string> inputs;  // NAME=FILE.npy
  std::vector<std::string> streams;
  std::string protocol = "grpc";
  double duration_s = 10, warmup_s = 1;
  int timeout_s = 30;
  uint64_t seed = 1;
  std::string json_path, csv_path;
};

struct Stream {
  StreamSpec spec;
  Payload payload;
  std::atomic<int64_t> issued{0};
  std::mutex mu;  // open loop: the arrival schedule; both: records and first error
  double next_arrival_us = 0;
  std::mt19937_64 rng;
  std::vector<Record> records;
  std::string first_error;
};

struct Stats {
  int64_t counts[5] = {};
  double duration_s = 0, p50 = 0, p95 = 0, p99 = 0, mean = 0, max = 0, lag_p99 = 0;
  int64_t sent() const { return counts[0] + counts[1] + counts[2] + counts[3] + counts[4]; }
  double throughput() const { return duration_s > 0 ? double(counts[0]) / duration_s : 0; }
};

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t i = size_t(std::ceil(q * double(sorted.size())));
  return sorted[std::min(sorted.size() - 1, i ? i - 1 : 0)];
}

// Latency percentiles over the answered (ok) requests only: a rejection's fast answer
// would make an overloaded level look quick.
Stats summarize(const std::vector<const Record*>& recs, double duration_s) {
  Stats s;
  s.duration_s = duration_s;
  std::vector<double> lat, lag;
  for (const Record* r : recs) {
    ++s.counts[int(r->outcome)];
    lag.push_back(r->lag_us);
    if (r->outcome == Outcome::ok) lat.push_back(r->latency_us);
  }
  std::sort(lat.begin(), lat.end());
  std::sort(lag.begin(), lag.end());
  s.p50 = percentile(lat, 0.5);
  s.p95 = percentile(lat, 0.95);
  s.p99 = percentile(lat, 0.99);
  s.max = lat.empty() ? 0 : lat.back();
  for (double v : lat) s.mean += v / double(lat.size());
  s.lag_p99 = percentile(lag, 0.99);
  return s;
}

json stats_json(const Stats& s) {
  json j = {{"throughput_rps", s.throughput()},
            {"latency_us",
             {{"p50", s.p50}, {"p95", s.p95}, {"p99", s.p99}, {"mean", s.mean}, {"max", s.max}}},
            {"client_lag_p99_us", s.lag_p99},
            {"sent", s.sent()}};
  for (int o = 0; o < 5; ++o) j[kOutcomeNames[o]] = s.counts[o];
  return j;
}

class Run {
 public:
  explicit Run(const Options& o) : o_(o) {}

  void execute() {
    std::vector<std::pair<std::string, Tensor>> inputs;
    for (const std::string& spec : o_.inputs) {
      const size_t eq = spec.find('=');
      if (eq == std::string::npos || eq == 0)
        throw Error(ErrorCode::invalid_argument, "--input '" + spec + "': expected NAME=FILE.npy");
      inputs.emplace_back(spec.substr(0, eq), slim::read_npy(spec.substr(eq + 1)));
    }
    const Protocol default_protocol = parse_protocol(o_.protocol);
    for (size_t i = 0; i < o_.streams.size(); ++i) {
      auto s = std::make_unique<Stream>();
      s->spec = parse_stream(o_.streams[i], default_protocol);
      s->payload = make_payload(s->spec, o_.model, inputs);
      s->rng.seed(o_.seed + i);
      streams_.push_back(std::move(s));
    }
    int workers = 0;
    for (const auto& s : streams_) workers += s->spec.clients + s->spec.connections;

    // Connections are made before the clock starts; then every worker starts together.
    std::latch connected(workers), go(1);
    std::vector<std::thread> threads;
    std::mutex setup_mu;
    std::string setup_error;
    for (auto& s : streams_)
      for (int w = 0; w < s->spec.clients + s->spec.connections; ++w)
        threads.emplace_back([&, stream = s.get()] {
          std::unique_ptr<Connection> c;
          try {
            c = connect(*stream);
          } catch (const std::exception& e) {
            std::lock_guard lock(setup_mu);
            setup_error = e.what();
          }
          connected.count_down();
          go.wait();
          if (c && setup_error.empty()) work(*stream, *c);
        });
    connected.wait();
    start_ = Clock::now();
    go.count_down();
    for (auto& t : threads) t.join();
    if (!setup_error.empty()) throw Error(ErrorCode::unavailable, setup_error);
  }

  void report() const {
    const double duration = measured_seconds();
    std::map<uint32_t, std::vector<const Record*>> by_level;
    std::vector<const Record*> all;
    json out = {
        {"host", o_.host},         {"model", o_.model},        {"duration_s", o_.duration_s},
        {"warmup_s", o_.warmup_s}, {"streams", json::array()}, {"levels", json::array()}};
    for (const auto& s : streams_) {
      std::vector<const Record*> recs;
      for (const Record& r : s->records)
        if (measured(r)) recs.push_back(&r);
      by_level[s->spec.priority].insert(by_level[s->spec.priority].end(), recs.begin(), recs.end());
      all.insert(all.end(), recs.begin(), recs.end());
      json j = stats_json(summarize(recs, duration));
      j["spec"] = s->spec.text;
      j["priority"] = s->spec.priority;
      j["protocol"] = protocol_name(s->spec.protocol);
      j["mode"] = s->spec.clients ? "closed" : "open";
      j["clients"] = s->spec.clients;
      j["rate"] = s->spec.rate;
      j["connections"] = s->spec.connections;
      if (!s->first_error.empty()) j["first_error"] = s->first_error;
      out["streams"].push_back(std::move(j));
    }

    std::printf("%-8s %-28s %8s %8s %8s %6s %6s %10s %9s %9s %9s %9s\n", "priority", "streams",
                "sent", "ok", "rejected", "unav", "errors", "ok/s", "p50 us", "p95 us", "p99 us",
                "max us");
    const auto row = [&](const std::string& level, const std::string& what, const Stats& st) {
      std::printf("%-8s %-28s %8lld %8lld %8lld %6lld %6lld %10.1f %9.0f %9.0f %9.0f %9.0f\n",
                  level.c_str(), what.c_str(), (long long)st.sent(), (long long)st.counts[0],
                  (long long)st.counts[1], (long long)st.counts[2],
                  (long long)(st.counts[3] + st.counts[4]), st.throughput(), st.p50, st.p95, st.p99,
                  st.max);
    };
    for (const auto& [level, recs] : by_level) {
      std::string what;
      for (const auto& s : streams_)
        if (s->spec.priority == level) {
          what += (what.empty() ? "" : "+") + std::string(protocol_name(s->spec.protocol)) + " " +
                  (s->spec.clients ? std::to_string(s->spec.clients) + "c"
                                   : std::to_string(int(s->spec.rate)) + "/s");
        }
      const Stats st = summarize(recs, duration);
      row(level ? std::to_string(level) : "default", what, st);
      json j = stats_json(st);
      j["priority"] = level;
      out["levels"].push_back(std::move(j));
    }
    const Stats total = summarize(all, duration);
    // Every answered request, warm-up included: what the server did while the run lasted.
    int64_t requests_total = 0;
    for (const auto& s : streams_) requests_total += int64_t(s->records.size());
    out["requests_total"] = requests_total;
    // The client's own CPU time: on a small machine it competes with the server's.
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    out["client_cpu_s"] = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                          double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    if (by_level.size() > 1) row("all", "", total);
    out["total"] = stats_json(total);
    for (size_t i = 0; i < streams_.size(); ++i) {
      const Stream& s = *streams_[i];
      if (!s.first_error.empty())
        std::printf("stream '%s': first error: %s\n", s.spec.text.c_str(), s.first_error.c_str());
      const double lag = out["streams"][i]["client_lag_p99_us"];
      if (lag > 1000)
        std::printf(
            "stream '%s': sends left p99 %.0f us behind schedule (all connections busy, or no free "
            "core "
            "for the client); that delay counts in its latency\n",
            s.spec.text.c_str(), lag);
    }

    if (!o_.json_path.empty()) {
      std::ofstream f(o_.json_path);
      if (!f)
        throw Error(ErrorCode::invalid_argument, "--json: cannot write '" + o_.json_path + "'");
      f << out.dump(2) << "\n";
    }
    if (!o_.csv_path.empty()) {
      std::ofstream f(o_.csv_path);
      if (!f) throw Error(ErrorCode::invalid_argument, "--csv: cannot write '" + o_.csv_path + "'");
      f << "stream,priority,start_us,latency_us,outcome\n";
      for (size_t i = 0; i < streams_.size(); ++i)
        for (const Record& r : streams_[i]->records)
          if (measured(r))
            f << i << ',' << streams_[i]->spec.priority << ',' << int64_t(r.start_us) << ','
              << int64_t(r.latency_us) << ',' << kOutcomeNames[int(r.outcome)] << '\n';
    }
  }

 private:
  std::unique_ptr<Connection> connect(const Stream& s) const {
    if (s.spec.protocol == Protocol::grpc)
      return std::make_unique<GrpcConnection>(o_.host, o_.grpc_port, s.payload, o_.timeout_s);
    return std::make_unique<RestConnection>(o_.host, o_.http_port, s.payload, o_.timeout_s);
  }

  double end_us() const { return (o_.warmup_s + o_.duration_s) * 1e6; }
  double now_us() const {
    return std::chrono::duration<double, std::micro>(Clock::now() - start_).count();
  }
  bool measured(const Record& r) const { return r.start_us >= o_.warmup_s * 1e6; }
  // The window the measured requests started in: the whole duration, or less when a
  // count bound ended the run first.
  double measured_seconds() const {
    double last = 0;
    for (const auto& s : streams_)
      for (const Record& r : s->records) last = std::max(last, r.start_us + r.latency_us);
    return std::max(0.0, std::min(last, end_us()) / 1e6 - o_.warmup_s);
  }

  // Claims the next request of the stream's count bound; false once it is spent.
  static bool claim(Stream& s) {
    return s.spec.requests == 0 || s.issued.fetch_add(1) < s.spec.requests;
  }

  void work(Stream& s, Connection& c) {
    std::vector<Record> mine;
    std::string error;
    for (;;) {
      double start = now_us(), lag = 0;
      if (s.spec.rate > 0) {
        {
          std::lock_guard lock(s.mu);
          s.next_arrival_us += std::exponential_distribution<double>(s.spec.rate)(s.rng) * 1e6;
          start = s.next_arrival_us;
        }
        if (start >= end_us()) break;
        std::this_thread::sleep_until(start_ +
                                      std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double, std::micro>(start)));
        lag = std::max(0.0, now_us() - start);
      }
      if (start >= end_us() || g_stop || !claim(s)) break;
      const Outcome outcome = c.send(&error);
      mine.push_back({start, now_us() - start, lag, outcome});
      if (outcome != Outcome::ok) {
        std::lock_guard lock(s.mu);
        if (s.first_error.empty()) s.first_error = error;
      }
    }
    std::lock_guard lock(s.mu);
    s.records.insert(s.records.end(), mine.begin(), mine.end());
  }

  const Options& o_;
  std::vector<std::unique_ptr<Stream>> streams_;
  Clock::time_point start_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "serve_loadgen: load generator for slim serve (KServe v2 REST JSON, REST binary tensors, "
      "gRPC), loopback only.\n"
      "Each --stream is closed loop (clients=N) or open loop with Poisson arrivals (rate=R per "
      "second), with keys\n"
      "priority=L (the KServe 'priority' parameter; default: none sent), connections=N (open loop "
      "pool),\n"
      "requests=N (count bound) and protocol=rest-json|rest-binary|grpc. Reports throughput and "
      "p50/p95/p99\n"
      "latency per priority level. Example:\n"
      "  serve_loadgen --grpc-port 8001 --model cnn --input image=x.npy \\\n"
      "      --stream priority=1,rate=50 --stream priority=3,clients=32 --duration 10"};
  app.add_option("--host", o.host, "Server address; loopback only (default 127.0.0.1)");
  app.add_option("--http-port", o.http_port, "REST port (default 8000)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--grpc-port", o.grpc_port, "gRPC port (default 8001)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--model", o.model, "Model name")->required();
  app.add_option("--input", o.inputs,
                 "NAME=FILE.npy, one per model input (sent as is: the first dim is the batch)")
      ->required();
  app.add_option("--stream", o.streams, "Stream spec, repeatable (see above)")->required();
  app.add_option("--protocol", o.protocol, "Protocol of streams that name none (default grpc)")
      ->check(CLI::IsMember({"rest-json", "rest-binary", "grpc"}));
  app.add_option("--duration", o.duration_s, "Measured seconds (default 10; SIGINT ends the run sooner)")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup_s, "Seconds of load before measuring (default 1)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--timeout", o.timeout_s,
                 "Client timeout per request and connection, seconds (default 30)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "Seed of the arrival schedules (default 1)");
  app.add_option("--json", o.json_path, "Write the results as JSON");
  app.add_option(
      "--csv", o.csv_path,
      "Write one line per measured request: stream,priority,start_us,latency_us,outcome");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!is_loopback(o.host))
      throw Error(ErrorCode::invalid_argument,
                  "--host '" + o.host +
                      "' is not a loopback address: the load generator only loads this machine");
    std::signal(SIGINT, [](int) { g_stop = true; });
    Run run(o);
    run.execute();
    run.report();
  } catch (const std::exception& e) {
    std::cerr << "serve_loadgen: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
