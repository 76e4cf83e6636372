#include "slim/serve/grpc.h"

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

#include "serve/grpc_service.grpc.pb.h"
#include "slim/serve/model_config.h"

namespace slim::serve {
namespace {

namespace pb = ::inference;
using InputTensor = pb::ModelInferRequest::InferInputTensor;

grpc::Status status_of(const Error& e) {
  return grpc::Status(grpc::StatusCode(grpc_status_for(e.code())), e.what());
}

// Runs `body`; a slim::Error becomes its protocol status, anything else INTERNAL.
template <typename F>
grpc::Status guarded(F&& body) {
  try {
    body();
    return grpc::Status::OK;
  } catch (const Error& e) {
    return status_of(e);
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
  }
}

std::string quoted(const std::string& input) {
  return "input '" + input + "': ";
}

// One input's typed contents, as checked against its datatype and shape.
struct TypedInput {
  const InputTensor& in;
  const Shape& shape;
  int64_t numel;
  int64_t values;  // over every field of `contents`
};

// The values must sit in `field` alone (the protocol's field for the datatype), one per
// element, each representable as T.
template <typename T, typename Field>
Tensor from_contents(const TypedInput& x, const Field& values, const char* field) {
  const std::string& name = x.in.name();
  if (values.size() != x.values)
    throw Error(ErrorCode::invalid_argument, quoted(name) + x.in.datatype() +
                                                 " values belong in contents." + field +
                                                 ", but the contents use another field");
  if (x.values != x.numel)
    throw Error(ErrorCode::invalid_argument,
                quoted(name) + "contents hold " + std::to_string(x.values) + " values, shape " +
                    shape_str(x.shape) + " needs " + std::to_string(x.numel));
  Tensor t(dtype_of<T>(), x.shape);
  T* out = static_cast<T*>(t.raw_data());
  for (int i = 0; i < values.size(); ++i) {
    const auto v = values[i];
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (!std::in_range<T>(v))
        throw Error(ErrorCode::invalid_argument, quoted(name) + "value " + std::to_string(v) +
                                                     " at index " + std::to_string(i) +
                                                     " does not fit " + x.in.datatype());
    }
    out[i] = static_cast<T>(v);
  }
  return t;
}

int64_t value_count(const pb::InferTensorContents& c) {
  return int64_t(c.bool_contents_size()) + c.int_contents_size() + c.int64_contents_size() +
         c.uint_contents_size() + c.uint64_contents_size() + c.fp32_contents_size() +
         c.fp64_contents_size() + c.bytes_contents_size();
}

Tensor typed_input(const InputTensor& in, DType dtype, const Shape& shape, int64_t numel) {
  const pb::InferTensorContents& c = in.contents();
  const TypedInput x{in, shape, numel, value_count(c)};
  switch (dtype) {
    case DType::boolean:
      return from_contents<bool>(x, c.bool_contents(), "bool_contents");
    case DType::i8:
      return from_contents<int8_t>(x, c.int_contents(), "int_contents");
    case DType::i16:
      return from_contents<int16_t>(x, c.int_contents(), "int_contents");
    case DType::i32:
      return from_contents<int32_t>(x, c.int_contents(), "int_contents");
    case DType::i64:
      return from_contents<int64_t>(x, c.int64_contents(), "int64_contents");
    case DType::u8:
      return from_contents<uint8_t>(x, c.uint_contents(), "uint_contents");
    case DType::u16:
      return from_contents<uint16_t>(x, c.uint_contents(), "uint_contents");
    case DType::u32:
      return from_contents<uint32_t>(x, c.uint_contents(), "uint_contents");
    case DType::u64:
      return from_contents<uint64_t>(x, c.uint64_contents(), "uint64_contents");
    case DType::f32:
      return from_contents<float>(x, c.fp32_contents(), "fp32_contents");
    case DType::f64:
      return from_contents<double>(x, c.fp64_contents(), "fp64_contents");
    case DType::f16:
    case DType::bf16:
      break;
  }
  throw Error(ErrorCode::invalid_argument,
              quoted(in.name()) + in.datatype() +
                  " has no typed contents field; send it in raw_input_contents");
}

// `raw`: the input's raw_input_contents entry, or null when the request sends typed
// contents. Sizes are checked before anything is allocated.
Tensor decode_input(const InputTensor& in, const std::string* raw) {
  const std::string& name = in.name();
  if (name.empty()) throw Error(ErrorCode::invalid_argument, "an input tensor has no name");
  DType dtype;
  Shape shape(in.shape().begin(), in.shape().end());
  int64_t numel;
  try {
    dtype = parse_kserve_dtype(in.datatype());
    numel = shape_numel(shape);
  } catch (const Error& e) {
    throw Error(e.code(), quoted(name) + e.what());
  }
  if (!raw) return typed_input(in, dtype, shape, numel);

  if (value_count(in.contents()) != 0)
    throw Error(ErrorCode::invalid_argument,
                quoted(name) +
                    "typed contents in a request that sends raw_input_contents "
                    "(one form per request)");
  const size_t esize = dtype_size(dtype);
  if (!(raw->size() % esize == 0 && int64_t(raw->size() / esize) == numel))
    throw Error(ErrorCode::invalid_argument,
                quoted(name) + "raw_input_contents holds " + std::to_string(raw->size()) +
                    " bytes, shape " + shape_str(shape) + " of " + in.datatype() + " needs " +
                    std::to_string(numel) + " x " + std::to_string(esize));
  Tensor t(dtype, shape);
  std::memcpy(t.raw_data(), raw->data(), raw->size());
  return t;
}

// A non-negative integer parameter; clients send them as int64 or uint64.
std::optional<uint64_t> count_parameter(const pb::ModelInferRequest& req, const std::string& key) {
  const auto it = req.parameters().find(key);
  if (it == req.parameters().end()) return std::nullopt;
  switch (it->second.parameter_choice_case()) {
    case pb::InferParameter::kUint64Param:
      return it->second.uint64_param();
    case pb::InferParameter::kInt64Param:
      if (it->second.int64_param() < 0)
        throw Error(ErrorCode::invalid_argument,
                    "parameter '" + key + "' must not be negative (got " +
                        std::to_string(it->second.int64_param()) + ")");
      return uint64_t(it->second.int64_param());
    default:
      throw Error(ErrorCode::invalid_argument,
                  "parameter '" + key + "' must be an integer (int64_param or uint64_param)");
  }
}

InferRequest decode_request(const pb::ModelInferRequest& req) {
  InferRequest r;
  r.model = req.model_name();
  r.version = req.model_version();
  r.id = req.id();
  const int raw_count = req.raw_input_contents_size();
  if (!(raw_count == 0 || raw_count == req.inputs_size()))
    throw Error(ErrorCode::invalid_argument,
                "raw_input_contents has " + std::to_string(raw_count) + " entries for " +
                    std::to_string(req.inputs_size()) + " inputs (one per input, or none)");
  r.inputs.reserve(req.inputs_size());
  for (int i = 0; i < req.inputs_size(); ++i) {
    const InputTensor& in = req.inputs(i);
    r.inputs.emplace_back(in.name(),
                          decode_input(in, raw_count ? &req.raw_input_contents(i) : nullptr));
  }
  for (const auto& out : req.outputs()) r.outputs.push_back({out.name(), false});
  // Priority 0 and timeout 0 mean "the model's default", as Triton's clients send them.
  if (auto p = count_parameter(req, "priority"); p && *p) {
    if (*p > std::numeric_limits<uint32_t>::max())
      throw Error(ErrorCode::invalid_argument,
                  "parameter 'priority' is out of range (" + std::to_string(*p) + ")");
    r.priority = uint32_t(*p);
  }
  if (auto t = count_parameter(req, "timeout"); t && *t) r.timeout_us = *t;
  if (const auto it = req.parameters().find("energy"); it != req.parameters().end()) {
    if (it->second.parameter_choice_case() != pb::InferParameter::kBoolParam)
      throw Error(ErrorCode::invalid_argument, "parameter 'energy' must be a bool_param");
    r.energy = it->second.bool_param();
  }
  return r;
}

// Outputs always travel as raw_output_contents, the protocol's recommended form.
void encode_response(const InferResponse& r, pb::ModelInferResponse* out) {
  out->set_model_name(r.model);
  out->set_model_version(r.version);
  out->set_id(r.id);
  if (const auto& e = r.energy) {
    auto& p = *out->mutable_parameters();
    p["energy_joules"].set_double_param(e->joules);
    p["energy_source"].set_string_param(e->source);
    p["carbon_grams"].set_double_param(e->grams);
    p["region"].set_string_param(e->region);
  }
  for (const auto& [name, tensor] : r.outputs) {
    auto* o = out->add_outputs();
    o->set_name(name);
    o->set_datatype(std::string(kserve_dtype_name(tensor.dtype())));
    for (int64_t d : tensor.shape()) o->add_shape(d);
    const Tensor packed = tensor.contiguous();
    out->add_raw_output_contents(static_cast<const char*>(packed.raw_data()), packed.nbytes());
  }
}

void set_tensor_metadata(const TensorSpec& spec, pb::ModelMetadataResponse::TensorMetadata* m) {
  m->set_name(spec.name);
  m->set_datatype(std::string(kserve_dtype_name(spec.dtype)));
  for (int64_t d : spec.shape) m->add_shape(d);
}

// slim serves one repository: a request naming one is refused, like Triton does.
template <typename Request>
void check_repository_request(const Request& req, const char* rpc) {
  if (!req.repository_name().empty())
    throw Error(
        ErrorCode::unsupported,
        std::string(rpc) + ": 'repository_name' is not supported (slim serves one repository)");
  if constexpr (requires { req.parameters(); }) {
    if (!req.parameters().empty())
      throw Error(ErrorCode::unsupported, std::string(rpc) + ": parameter '" +
                                              req.parameters().begin()->first +
                                              "' is not supported");
  }
}

// Loads and unloads last as long as a model load or a queue drain: they run one at a time
// on this thread rather than holding one of gRPC's callback threads.
class RepositoryWorker {
 public:
  RepositoryWorker() : thread_([this] { run(); }) {}
  ~RepositoryWorker() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  void post(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    wake_.notify_one();
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and every posted task has run
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;
};

class Service final : public pb::GRPCInferenceService::CallbackService {
 public:
  explicit Service(InferenceServer& server) : server_(server) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx,
                                       const pb::ServerLiveRequest*,
                                       pb::ServerLiveResponse* resp) override {
    return answer(ctx, [&] { resp->set_live(server_.live()); });
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const pb::ServerReadyRequest*,
                                        pb::ServerReadyResponse* resp) override {
    return answer(ctx, [&] { resp->set_ready(server_.ready()); });
  }

  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const pb::ModelReadyRequest* req,
                                       pb::ModelReadyResponse* resp) override {
    return answer(ctx, [&] { resp->set_ready(server_.model_ready(req->name(), req->version())); });
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const pb::ServerMetadataRequest*,
                                           pb::ServerMetadataResponse* resp) override {
    return answer(ctx, [&] {
      resp->set_name(InferenceServer::kName);
      resp->set_version(SLIM_VERSION_STRING);
      for (const auto& e : InferenceServer::extensions()) resp->add_extensions(e);
    });
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const pb::ModelMetadataRequest* req,
                                          pb::ModelMetadataResponse* resp) override {
    return answer(ctx, [&] {
      const serve::ModelMetadata m = server_.model_metadata(req->name(), req->version());
      resp->set_name(m.name);
      for (const auto& v : m.versions) resp->add_versions(v);
      resp->set_platform(m.platform);
      for (const auto& s : m.inputs) set_tensor_metadata(s, resp->add_inputs());
      for (const auto& s : m.outputs) set_tensor_metadata(s, resp->add_outputs());
    });
  }

  // The reactor is finished by the server's callback, from a scheduler thread once the
  // batch that holds the request has run (or inline when the server refuses it).
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const pb::ModelInferRequest* req,
                                       pb::ModelInferResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    InferRequest request;
    if (grpc::Status bad = guarded([&] { request = decode_request(*req); }); !bad.ok()) {
      reactor->Finish(bad);
      return reactor;
    }
    server_.infer(std::move(request), [reactor, resp](InferResult&& result) {
      if (result.error) return reactor->Finish(status_of(*result.error));
      reactor->Finish(guarded([&] { encode_response(result.response, resp); }));
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx,
                                            const pb::RepositoryIndexRequest* req,
                                            pb::RepositoryIndexResponse* resp) override {
    return answer(ctx, [&] {
      check_repository_request(*req, "RepositoryIndex");
      for (const RepositoryEntry& e : server_.repository_index()) {
        if (req->ready() && e.state != "READY") continue;
        auto* m = resp->add_models();
        m->set_name(e.name);
        m->set_version(e.version);
        m->set_state(e.state);
        m->set_reason(e.reason);
      }
    });
  }

  grpc::ServerUnaryReactor* RepositoryModelLoad(grpc::CallbackServerContext* ctx,
                                                const pb::RepositoryModelLoadRequest* req,
                                                pb::RepositoryModelLoadResponse*) override {
    return answer_later(ctx, [this, req] {
      check_repository_request(*req, "RepositoryModelLoad");
      server_.load_model(req->model_name());
    });
  }

  grpc::ServerUnaryReactor* RepositoryModelUnload(grpc::CallbackServerContext* ctx,
                                                  const pb::RepositoryModelUnloadRequest* req,
                                                  pb::RepositoryModelUnloadResponse*) override {
    return answer_later(ctx, [this, req] {
      check_repository_request(*req, "RepositoryModelUnload");
      server_.unload_model(req->model_name());
    });
  }

 private:
  template <typename F>
  static grpc::ServerUnaryReactor* answer(grpc::CallbackServerContext* ctx, F&& body) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(guarded(body));
    return reactor;
  }

  // The request and response stay alive until the reactor is finished.
  grpc::ServerUnaryReactor* answer_later(grpc::CallbackServerContext* ctx,
                                         std::function<void()> body) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    repository_.post([reactor, body = std::move(body)] { reactor->Finish(guarded(body)); });
    return reactor;
  }

  InferenceServer& server_;
  RepositoryWorker repository_;
};

std::string listen_address(const GrpcOptions& o) {
  const bool ipv6 = o.host.find(':') != std::string::npos;
  return (ipv6 ? "[" + o.host + "]" : o.host) + ":" + std::to_string(o.port);
}

}  // namespace

struct GrpcFrontend::Impl {
  GrpcOptions options;
  Service service;
  std::unique_ptr<grpc::Server> server;
  Impl(InferenceServer& s, GrpcOptions o) : options(std::move(o)), service(s) {}
};

GrpcFrontend::GrpcFrontend(InferenceServer& server, GrpcOptions options)
    : impl_(std::make_unique<Impl>(server, std::move(options))) {
  const GrpcOptions& o = impl_->options;
  if (!(o.port >= 0 && o.port <= 65535))
    throw Error(ErrorCode::invalid_argument,
                "gRPC port " + std::to_string(o.port) + " is out of range (0-65535)");
  if (o.max_message_bytes <= 0)
    throw Error(ErrorCode::invalid_argument, "gRPC max message size must be positive (got " +
                                                 std::to_string(o.max_message_bytes) + ")");
}

GrpcFrontend::~GrpcFrontend() {
  stop();
}

int GrpcFrontend::start() {
  if (impl_->server) throw Error(ErrorCode::internal, "the gRPC front door is already started");
  const std::string address = listen_address(impl_->options);
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &bound);
  builder.SetMaxReceiveMessageSize(impl_->options.max_message_bytes);
  builder.SetMaxSendMessageSize(impl_->options.max_message_bytes);
  // gRPC sets SO_REUSEPORT by default: a port another process holds would be shared
  // instead of refused.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(&impl_->service);
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || bound == 0) {
    impl_->server.reset();
    throw Error(ErrorCode::unavailable, "gRPC: cannot listen on " + address);
  }
  return bound;
}

void GrpcFrontend::stop() {
  if (!impl_->server) return;
  // Waits for every call in flight, including inference requests still in a batcher.
  impl_->server->Shutdown();
  impl_->server.reset();
}

}  // namespace slim::serve
