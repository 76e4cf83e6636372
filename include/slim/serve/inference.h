// What the front doors (REST, gRPC) hand the server and get back: one inference request
// with its input tensors, and its result. Protocol-neutral: no JSON, no protobuf.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "slim/core/error.h"
#include "slim/core/tensor.h"

namespace slim::serve {

using Clock = std::chrono::steady_clock;

struct RequestedOutput {
  std::string name;
  bool binary = false;  // REST binary tensor extension: send this output as raw bytes
};

struct InferRequest {
  std::string model;
  std::string version;  // "" : the version the version policy serves (the newest)
  std::string id;       // echoed back
  std::vector<std::pair<std::string, Tensor>> inputs;  // contiguous tensors
  std::vector<RequestedOutput> outputs;                // empty: every output
  std::optional<uint32_t> priority;                   // 1 = most urgent; none: model default
  std::optional<uint64_t> timeout_us;                  // queue timeout override
  Clock::time_point arrival = Clock::now();
  // The calling thread may run the model itself when nothing is queued: a thread with a
  // full-size stack that may block (REST's connection threads). gRPC's callback threads
  // may not: a ResNet batch run on one crashed.
  bool caller_may_run = false;
  bool energy = false;  // report the request's energy in the response (slim serve --energy)
};

// A request's share of the energy of the batch that ran it (by its rows), and its carbon.
struct RequestEnergy {
  double joules = 0, grams = 0;
  std::string source, region;  // EnergyLedger::source(), the grid region
};

struct InferResponse {
  std::string model;
  std::string version;
  std::string id;
  // In the order of the request's outputs (or the model's when it named none).
  std::vector<std::pair<std::string, Tensor>> outputs;
  std::optional<RequestEnergy> energy;  // when the request asked for it
};

// Exactly one of error / response is meaningful.
struct InferResult {
  std::optional<Error> error;
  InferResponse response;
};

// Called exactly once per request, from a server thread (or inline when the request
// fails before it is queued). Must not block for long.
using InferCallback = std::function<void(InferResult&&)>;

// Protocol status for an error code: HTTP status and gRPC status code number.
int http_status_for(ErrorCode code);
int grpc_status_for(ErrorCode code);

}  // namespace slim::serve
