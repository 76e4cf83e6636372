// cpp-httplib serves each connection on a thread of its task queue; the handlers below
// only translate between HTTP and the InferenceServer (see rest_codec.h for the bodies).
#include "slim/serve/http.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "http_routes.h"
#include "slim/core/cpu_features.h"
#include "slim/llm/kernels.h"
#include "slim/serve/rest_codec.h"

namespace slim::serve {
namespace {

using httplib::Request;
using httplib::Response;
using HandlerResponse = httplib::Server::HandlerResponse;

constexpr char kJson[] = "application/json";
constexpr int kRejectingThreads = 2;
constexpr time_t kIoTimeoutSeconds = 10;  // a stalled client frees its thread after this
constexpr size_t kRequestsPerConnection = 1000;

// Set on the threads that answer connections over the limit, and when the current
// request's handling began (for the access log).
thread_local bool t_over_limit = false;
thread_local std::optional<Clock::time_point> t_request_start;

// Serves each connection on a worker while fewer than `limit` are open. A connection over
// the limit still has its request read, so that it can be answered 503 instead of waiting,
// on a small pool of its own: httplib hands the queue a task, not the socket.
class ConnectionQueue : public httplib::TaskQueue {
 public:
  explicit ConnectionQueue(int limit)
      : limit_(limit), workers_(size_t(limit)), rejecting_(kRejectingThreads) {}

  // Called from the accepting thread only.
  void enqueue(std::function<void()> fn) override {
    if (open_.load() < limit_) {
      open_.fetch_add(1);
      workers_.enqueue([this, fn = std::move(fn)] {
        fn();
        open_.fetch_sub(1);
      });
    } else {
      rejecting_.enqueue([fn = std::move(fn)] {
        t_over_limit = true;
        fn();
        t_over_limit = false;
      });
    }
  }

  void shutdown() override {
    workers_.shutdown();
    rejecting_.shutdown();
  }

 private:
  const int limit_;
  std::atomic<int> open_{0};
  httplib::ThreadPool workers_;
  httplib::ThreadPool rejecting_;
};

void set_error(Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(encode_error(message), kJson);
}

// Runs a handler; whatever it throws becomes a KServe error response.
template <typename Fn>
void guarded(Response& res, Fn&& fn) {
  run_guarded(fn, [&res](int status, const std::string& message) { set_error(res, status, message); });
}

void set_body(Response& res, std::string body, const char* content_type) {
  res.body = std::move(body);  // set_content would copy it
  res.set_header("Content-Type", content_type);
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void log_access(const Request& req, const Response& res) {
  nlohmann::ordered_json line = {{"time", utc_now()},
                                 {"remote", req.remote_addr + ":" + std::to_string(req.remote_port)},
                                 {"method", req.method},
                                 {"path", req.path},
                                 {"status", res.status},
                                 {"request_bytes", req.body.size()},
                                 {"response_bytes", res.body.size()}};
  if (t_request_start)
    line["duration_us"] = std::chrono::duration_cast<std::chrono::microseconds>(
                              Clock::now() - *t_request_start)
                              .count();
  t_request_start.reset();
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::fputs(text.c_str(), stderr);  // one call per line: lines from threads do not interleave
}

}  // namespace

// One httplib server on its own listening thread, with the limits every front door shares.
class HttpService {
 public:
  HttpService(HttpOptions options, std::string what) : options_(std::move(options)), what_(std::move(what)) {
    const int limit = std::max(1, options_.max_connections);
    http.new_task_queue = [limit] { return new ConnectionQueue(limit); };
    http.set_tcp_nodelay(true);  // responses go out in two writes (head, body)
    // httplib's default is SO_REUSEPORT, with which a second server on the same port binds
    // too and the kernel splits the connections between them.
    http.set_socket_options([](int sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    http.set_read_timeout(kIoTimeoutSeconds);
    http.set_write_timeout(kIoTimeoutSeconds);
    http.set_keep_alive_max_count(kRequestsPerConnection);
    http.set_payload_max_length(options_.max_body_bytes);
    http.set_pre_routing_handler([this](const Request& req, Response& res) {
      t_request_start = Clock::now();
      if (refuse_early(req, res)) return HandlerResponse::Handled;
      // Two of httplib's ways of reading a body do not fit this protocol, so the request
      // (httplib's own object, not const) is corrected before the body is read:
      Request& request = const_cast<Request&>(req);
      // - a request with neither Content-Length nor Transfer-Encoding has no body (RFC
      //   9112, 6.3), but httplib would read one until the client closes (`curl -X POST`);
      if (!req.has_header("Content-Length")) request.set_header("Content-Length", "0");
      // - KServe bodies are JSON or binary, but `curl -d` labels them a form, which
      //   httplib parses as one and refuses above 8 KiB.
      if (req.get_header_value("Content-Type").rfind("application/x-www-form-urlencoded", 0) == 0)
        request.headers.erase("Content-Type");
      return HandlerResponse::Unhandled;
    });
    // A client that asks before sending a large body is refused before it sends it.
    // (httplib writes `res` for any status but 100 and 417, so it gets the status too.)
    http.set_expect_100_continue_handler([this](const Request& req, Response& res) {
      if (req.get_header_value<uint64_t>("Content-Length") <= options_.max_body_bytes) return 100;
      res.status = 413;
      return 413;
    });
    // Responses httplib makes itself (unknown route, unreadable request, body too large)
    // get a JSON error body like every other error.
    http.set_error_handler([this](const Request& req, Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 404) {
        set_error(res, 404, "no route for " + req.method + " " + req.path);
      } else if (res.status == 413) {
        res.set_header("Connection", "close");  // the body was not read
        set_error(res, 413, "request body of " + req.get_header_value("Content-Length") +
                                " bytes is above the limit of " +
                                std::to_string(options_.max_body_bytes) + " bytes");
      } else if (res.status == 400) {
        set_error(res, 400, "malformed or incomplete HTTP request");
      } else {
        set_error(res, res.status, "HTTP status " + std::to_string(res.status));
      }
    });
    http.set_exception_handler([](const Request&, Response& res, std::exception_ptr ep) {
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        set_error(res, 500, e.what());
      } catch (...) {
        set_error(res, 500, "unknown exception");
      }
    });
    if (options_.access_log) http.set_logger(log_access);
  }

  ~HttpService() { stop(); }

  int start() {
    int port = options_.port;
    bool bound = port == 0 ? (port = http.bind_to_any_port(options_.host)) > 0
                           : http.bind_to_port(options_.host, port);
    if (!bound)
      throw Error(ErrorCode::unavailable, what_ + ": cannot listen on " + options_.host + ":" +
                                              std::to_string(options_.port));
    thread_ = std::thread([this] { http.listen_after_bind(); });
    // httplib's stop() does nothing until the loop runs, so return only once it does.
    while (!http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return port;
  }

  void stop() {
    if (!thread_.joinable()) return;
    http.stop();
    thread_.join();
  }

  const HttpOptions& options() const { return options_; }

  httplib::Server http;

 private:
  // Requests refused before routing: over the connection limit, or with a body httplib
  // would read without a bound (chunked: no length to check; compressed: inflated
  // without a limit).
  bool refuse_early(const Request& req, Response& res) {
    if (t_over_limit) {
      res.set_header("Connection", "close");
      set_error(res, 503, "too many connections (limit " +
                              std::to_string(std::max(1, options_.max_connections)) + ")");
      return true;
    }
    if (req.has_header("Transfer-Encoding")) {
      res.set_header("Connection", "close");
      set_error(res, 411, "a request body needs a Content-Length (no chunked transfer)");
      return true;
    }
    if (req.has_header("Content-Encoding") && req.get_header_value("Content-Encoding") != "identity") {
      res.set_header("Connection", "close");
      set_error(res, 415, "compressed request bodies are not accepted (Content-Encoding: " +
                              req.get_header_value("Content-Encoding") + ")");
      return true;
    }
    return false;
  }

  HttpOptions options_;
  std::string what_;
  std::thread thread_;
};

namespace {

// Model routes: name, then an optional version.
const std::string kModel = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";

void add_kserve_routes(httplib::Server& http, InferenceServer& server, RestLimits limits) {
  http.Get("/v2/health/live", [&server](const Request&, Response& res) {
    guarded(res, [&] {
      if (!server.live()) set_error(res, 503, "server is not live");
    });
  });
  http.Get("/v2/health/ready", [&server](const Request&, Response& res) {
    guarded(res, [&] {
      if (!server.ready()) set_error(res, 503, "server is not ready");
    });
  });
  http.Get("/v2", [&server](const Request&, Response& res) {
    guarded(res, [&] {
      const SlimServerInfo slim{isa_name(active_isa()), llm::kernels().isa,
                                !server.options().require_signature_keys.empty()};
      set_body(res,
               encode_server_metadata(InferenceServer::kName, SLIM_VERSION_STRING,
                                      InferenceServer::extensions(), slim),
               kJson);
    });
  });
  http.Get(kModel, [&server](const Request& req, Response& res) {
    guarded(res, [&] {
      set_body(res, encode_model_metadata(server.model_metadata(req.matches[1], req.matches[2])),
               kJson);
    });
  });
  http.Get(kModel + "/config", [&server](const Request& req, Response& res) {
    guarded(res, [&] {
      set_body(res, encode_model_config(server.model_config(req.matches[1], req.matches[2])), kJson);
    });
  });
  // Triton's answer: 200 when ready, else 400 with an error body.
  http.Get(kModel + "/ready", [&server](const Request& req, Response& res) {
    guarded(res, [&] {
      const std::string name = req.matches[1], version = req.matches[2];
      if (!server.model_ready(name, version))
        set_error(res, 400, "model '" + name + "'" +
                                (version.empty() ? "" : " version '" + version + "'") +
                                " is not ready");
    });
  });
  http.Post(kModel + "/infer", [&server, limits](const Request& req, Response& res) {
    guarded(res, [&] {
      std::optional<size_t> header_length;
      if (req.has_header(kHeaderLengthHeader))
        header_length = parse_header_length(req.get_header_value(kHeaderLengthHeader));
      RestInferRequest decoded =
          decode_infer_request(req.body, header_length, req.matches[1], req.matches[2], limits);
      // The server answers on its own thread; this connection's thread waits for it.
      auto done = std::make_shared<std::promise<InferResult>>();
      std::future<InferResult> result = done->get_future();
      decoded.request.caller_may_run = true;  // this connection's thread waits for the answer anyway
      std::vector<bool> binary;  // per output of the response, which keeps the request's order
      for (const auto& o : decoded.request.outputs) binary.push_back(o.binary);
      server.infer(std::move(decoded.request),
                   [done](InferResult&& r) { done->set_value(std::move(r)); });
      InferResult r = result.get();
      if (r.error) throw *r.error;
      RestBody out = encode_infer_response(r.response, decoded.all_outputs_binary, binary);
      if (out.header_length) {
        res.set_header(kHeaderLengthHeader, std::to_string(*out.header_length));
        set_body(res, std::move(out.body), "application/octet-stream");
      } else {
        set_body(res, std::move(out.body), kJson);
      }
    });
  });
  http.Post("/v2/repository/index", [&server](const Request& req, Response& res) {
    guarded(res, [&] {
      bool ready_only = decode_repository_index_ready(req.body);
      set_body(res, encode_repository_index(server.repository_index(), ready_only), kJson);
    });
  });
  http.Post(R"(/v2/repository/models/([^/]+)/(load|unload|rollback))",
            [&server](const Request& req, Response& res) {
              guarded(res, [&] {
                if (req.matches[2] == "load") server.load_model(req.matches[1]);
                else if (req.matches[2] == "rollback") server.rollback_model(req.matches[1]);
                else server.unload_model(req.matches[1]);
                set_body(res, "{}", kJson);
              });
            });
}

}  // namespace

HttpFrontend::HttpFrontend(InferenceServer& server, HttpOptions options)
    : service_(std::make_unique<HttpService>(std::move(options), "HTTP")) {
  RestLimits limits;
  limits.max_header_bytes = service_->options().max_header_bytes;
  add_kserve_routes(service_->http, server, limits);
  add_openai_routes(service_->http, server);
}

HttpFrontend::~HttpFrontend() = default;
int HttpFrontend::start() { return service_->start(); }
void HttpFrontend::stop() { service_->stop(); }

MetricsFrontend::MetricsFrontend(InferenceServer& server, HttpOptions options)
    : service_(std::make_unique<HttpService>(std::move(options), "metrics")) {
  service_->http.Get("/metrics", [&server](const Request&, Response& res) {
    guarded(res, [&] {
      set_body(res, server.metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
    });
  });
}

MetricsFrontend::~MetricsFrontend() = default;
int MetricsFrontend::start() { return service_->start(); }
void MetricsFrontend::stop() { service_->stop(); }

}  // namespace slim::serve
