// The HTTP front doors' own limits and plumbing, on a server with no models: connection
// limit, body and header limits, bodies httplib would read unbounded, binding, the access
// log and the metrics endpoint. The KServe routes with models are tested end to end by
// tests/serve/test_rest.py.
#include "slim/serve/http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "slim/core/cpu_features.h"
#include "slim/trust/keys.h"

namespace slim::serve {
namespace {

HttpOptions loopback() {
  HttpOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  return o;
}

// A raw connection, for requests httplib's client would not send (partial, Expect).
class RawConnection {
 public:
  explicit RawConnection(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  }
  ~RawConnection() { close(fd_); }

  void send(const std::string& s) { ASSERT_EQ(::send(fd_, s.data(), s.size(), 0), ssize_t(s.size())); }

  // One response: its head and a body of Content-Length bytes.
  std::string response() {
    std::string in;
    char buf[4096];
    size_t head_end, want = std::string::npos;
    while (want == std::string::npos || in.size() < want) {
      ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      in.append(buf, size_t(n));
      if (want == std::string::npos && (head_end = in.find("\r\n\r\n")) != std::string::npos) {
        size_t p = in.find("Content-Length: ");
        want = head_end + 4 + (p < head_end ? std::stoul(in.substr(p + 16)) : 0);
      }
    }
    return in;
  }

 private:
  int fd_;
};

// Repeats a GET until it answers `status`: the server takes and frees connections on its
// own threads. Returns the last response.
httplib::Response get_until(httplib::Client& client, const char* path, int status) {
  httplib::Response last;
  for (int i = 0; i < 1000 && last.status != status; ++i) {
    if (i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (auto r = client.Get(path)) last = *r;
  }
  return last;
}

class HttpFrontendTest : public testing::Test {
 protected:
  void SetUp() override { server_.start(); }

  // Starts a front door with these options and a client for it.
  void serve(HttpOptions options) {
    http_ = std::make_unique<HttpFrontend>(server_, options);
    port_ = http_->start();
    ASSERT_GT(port_, 0);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
  }

  InferenceServer server_{ServerOptions{}};
  std::unique_ptr<HttpFrontend> http_;
  std::unique_ptr<httplib::Client> client_;
  int port_ = 0;
};

TEST_F(HttpFrontendTest, HealthMetadataAndUnknownRoutes) {
  serve(loopback());
  auto live = client_->Get("/v2/health/live");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
  EXPECT_EQ(live->body, "");
  auto ready = client_->Get("/v2/health/ready");
  EXPECT_EQ(ready->status, server_.ready() ? 200 : 503);

  auto meta = client_->Get("/v2");
  EXPECT_EQ(meta->status, 200);
  EXPECT_EQ(meta->get_header_value("Content-Type"), "application/json");
  auto j = nlohmann::json::parse(meta->body);
  EXPECT_EQ(j["name"], "slim");
  EXPECT_FALSE(j["version"].get<std::string>().empty());
  EXPECT_EQ(j["extensions"], nlohmann::json(InferenceServer::extensions()));
  EXPECT_EQ(j["slim"]["isa"], isa_name(active_isa()));
  EXPECT_FALSE(j["slim"]["kernels"].get<std::string>().empty());
  EXPECT_EQ(j["slim"]["require_signature"], false);

  auto config = client_->Get("/v2/models/nothing/config");
  EXPECT_EQ(config->status, 404);
  EXPECT_EQ(config->body, R"j({"error":"unknown model 'nothing'"})j");

  auto missing = client_->Get("/v3/anything");
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(missing->body, R"j({"error":"no route for GET /v3/anything"})j");
  auto wrong_method = client_->Delete("/v2/health/live");
  EXPECT_EQ(wrong_method->status, 404);
  EXPECT_EQ(wrong_method->body, R"j({"error":"no route for DELETE /v2/health/live"})j");
}

TEST(HttpFrontend, SignatureRequirementIsInTheServerMetadata) {
  const std::string pub =
      (std::filesystem::temp_directory_path() / ("slim_http_test_" + std::to_string(getpid()) + ".pub")).string();
  std::ofstream(pub) << trust::PrivateKey::generate(trust::KeyAlg::ed25519).public_key().to_pem();
  ServerOptions options;
  options.require_signature_keys = {pub};
  InferenceServer server(options);
  server.start();
  HttpFrontend http(server, loopback());
  httplib::Client client("127.0.0.1", http.start());
  auto meta = client.Get("/v2");
  ASSERT_TRUE(meta);
  EXPECT_EQ(nlohmann::json::parse(meta->body)["slim"]["require_signature"], true);
  std::filesystem::remove(pub);
}

TEST_F(HttpFrontendTest, CodecErrorsAreJson400) {
  serve(loopback());
  auto r = client_->Post("/v2/models/m/infer", "[]", "application/json");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(r->body, R"j({"error":"request body must be a JSON object"})j");
  r = client_->Post("/v2/models/m/infer", httplib::Headers{{"Inference-Header-Content-Length", "x"}},
                    "{}", "application/json");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(r->body, R"j({"error":"Inference-Header-Content-Length 'x' is not a byte count"})j");
  r = client_->Post("/v2/repository/index", R"j({"ready":1})j", "application/json");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(r->body, R"j({"error":"repository index 'ready' must be true or false"})j");
}

TEST_F(HttpFrontendTest, ConnectionsOverTheLimitAreAnswered503) {
  HttpOptions o = loopback();
  o.max_connections = 1;
  serve(o);
  // The one connection the limit allows, held open by a request still being sent.
  RawConnection held(port_);
  held.send("GET /v2/health/live HTTP/1.1\r\nHost: x\r\n");
  // Once the server has taken it, another connection is refused.
  httplib::Response refused = get_until(*client_, "/v2/health/live", 503);
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.get_header_value("Connection"), "close");
  EXPECT_EQ(refused.body, R"j({"error":"too many connections (limit 1)"})j");
  // The held connection is still served.
  held.send("\r\n");
  EXPECT_EQ(held.response().substr(0, 15), "HTTP/1.1 200 OK");
}

TEST_F(HttpFrontendTest, ASlotFreesWhenItsConnectionCloses) {
  HttpOptions o = loopback();
  o.max_connections = 1;
  serve(o);
  {
    RawConnection first(port_);
    first.send("GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_EQ(first.response().substr(0, 15), "HTTP/1.1 200 OK");
  }
  EXPECT_EQ(get_until(*client_, "/v2/health/live", 200).status, 200);
}

TEST_F(HttpFrontendTest, BodyAndHeaderLimits) {
  HttpOptions o = loopback();
  o.max_body_bytes = 100;
  o.max_header_bytes = 10;
  serve(o);
  auto r = client_->Post("/v2/models/m/infer", std::string(101, ' '), "application/json");
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(r->body, R"j({"error":"request body of 101 bytes is above the limit of 100 bytes"})j");
  // A client that asks first is refused before it sends the body.
  RawConnection asking(port_);
  asking.send(
      "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
      "Expect: 100-continue\r\n\r\n");
  std::string reply = asking.response();
  EXPECT_EQ(reply.substr(0, 30), "HTTP/1.1 413 Payload Too Large");
  EXPECT_NE(reply.find("Connection: close\r\n"), std::string::npos);
  EXPECT_EQ(reply.substr(reply.find("\r\n\r\n") + 4),
            R"j({"error":"request body of 5000 bytes is above the limit of 100 bytes"})j");

  r = client_->Post("/v2/models/m/infer", httplib::Headers{{"Inference-Header-Content-Length", "11"}},
                    std::string(20, ' '), "application/octet-stream");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(r->body,
            R"j({"error":"Inference-Header-Content-Length 11 is above the limit of 10 bytes"})j");
}

TEST_F(HttpFrontendTest, BodiesHttplibWouldMisreadAreRefusedOrRead) {
  serve(loopback());
  RawConnection chunked(port_);
  chunked.send(
      "POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
      "2\r\n{}\r\n0\r\n\r\n");
  std::string reply = chunked.response();
  EXPECT_EQ(reply.substr(0, 28), "HTTP/1.1 411 Length Required");
  EXPECT_EQ(reply.substr(reply.find("\r\n\r\n") + 4),
            R"j({"error":"a request body needs a Content-Length (no chunked transfer)"})j");

  auto gz = client_->Post("/v2/repository/index", httplib::Headers{{"Content-Encoding", "gzip"}},
                          "xx", "application/json");
  EXPECT_EQ(gz->status, 415);
  EXPECT_EQ(gz->body,
            R"j({"error":"compressed request bodies are not accepted (Content-Encoding: gzip)"})j");

  // A body labelled as a form (curl -d) is read as it is, at any size.
  auto form = client_->Post("/v2/repository/index", "{}" + std::string(10000, ' '),
                            "application/x-www-form-urlencoded");
  EXPECT_EQ(form->status, 200);
  EXPECT_EQ(form->body, "[]");

  // No Content-Length and no Transfer-Encoding: no body (not "read until close").
  RawConnection bare(port_);
  bare.send("POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n\r\n");
  reply = bare.response();
  EXPECT_EQ(reply.substr(0, 15), "HTTP/1.1 200 OK");
  EXPECT_EQ(reply.substr(reply.find("\r\n\r\n") + 4), "[]");
}

TEST_F(HttpFrontendTest, AccessLogWritesOneJsonLinePerRequest) {
  HttpOptions o = loopback();
  o.access_log = true;
  testing::internal::CaptureStderr();
  serve(o);
  client_->Get("/v2/health/live");
  client_->Get("/nothing");
  client_.reset();
  http_->stop();
  std::string log = testing::internal::GetCapturedStderr();
  std::vector<nlohmann::json> lines;
  for (size_t at = 0, nl; (nl = log.find('\n', at)) != std::string::npos; at = nl + 1)
    lines.push_back(nlohmann::json::parse(log.substr(at, nl - at)));
  ASSERT_EQ(lines.size(), 2u) << log;
  // Each request came on a connection (and thread) of its own: the lines may come in either order.
  if (lines[0]["path"] != "/v2/health/live") std::swap(lines[0], lines[1]);
  EXPECT_EQ(lines[0]["method"], "GET");
  EXPECT_EQ(lines[0]["path"], "/v2/health/live");
  EXPECT_EQ(lines[0]["status"], 200);
  EXPECT_EQ(lines[1]["path"], "/nothing");
  EXPECT_EQ(lines[1]["status"], 404);
  EXPECT_EQ(lines[1]["response_bytes"], 37);
  for (const auto& l : lines) {
    EXPECT_TRUE(l["duration_us"].is_number_integer());
    EXPECT_EQ(l["remote"].get<std::string>().substr(0, 10), "127.0.0.1:");
    EXPECT_EQ(l["time"].get<std::string>().size(), 20u);  // 2026-01-31T12:00:00Z
  }
}

TEST_F(HttpFrontendTest, APortInUseIsUnavailable) {
  serve(loopback());
  HttpOptions o = loopback();
  o.port = port_;
  HttpFrontend second(server_, o);
  try {
    second.start();
    FAIL() << "bound a port in use";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unavailable);
    EXPECT_EQ(e.what(), "HTTP: cannot listen on 127.0.0.1:" + std::to_string(port_));
  }
}

TEST_F(HttpFrontendTest, StopIsIdempotent) {
  serve(loopback());
  http_->stop();
  http_->stop();
  EXPECT_FALSE(client_->Get("/v2/health/live"));
}

TEST_F(HttpFrontendTest, MetricsEndpoint) {
  MetricsFrontend metrics(server_, loopback());
  httplib::Client client("127.0.0.1", metrics.start());
  auto r = client.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_FALSE(r->body.empty());  // the numbers move (process CPU time): their text is the server's
  EXPECT_EQ(client.Get("/v2/health/live")->status, 404);
}

}  // namespace
}  // namespace slim::serve
