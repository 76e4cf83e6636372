// The KServe v2 (Open Inference Protocol) REST bodies: JSON infer requests, with the
// binary tensor data extension, into InferRequest, and InferResponse, server and model
// metadata and the repository index back into bodies. Pure functions, no sockets, so the
// fuzz target and the unit tests drive them directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "slim/serve/inference.h"
#include "slim/serve/server.h"

namespace slim::serve {

inline constexpr char kHeaderLengthHeader[] = "Inference-Header-Content-Length";

struct RestLimits {
  size_t max_header_bytes = 8192;  // Inference-Header-Content-Length above this: 400
  int64_t max_tensor_elements = int64_t(1) << 28;  // per input tensor
};

// The Inference-Header-Content-Length value: a decimal byte count. Throws
// invalid_argument naming the header otherwise.
size_t parse_header_length(std::string_view value);

// Decodes a request body. `header_length` is the Inference-Header-Content-Length value
// when the request had one: the JSON is then body[0, n) and the inputs whose parameters
// give binary_data_size follow it as raw little-endian tensors, in input order. `model` and
// `version` come from the URL. A malformed body, a wrong type or a tensor whose data does
// not fit its shape throws invalid_argument (BYTES tensors: unsupported) naming the field
// or tensor.
struct RestInferRequest {
  InferRequest request;
  // binary_data_output with no outputs named: every output comes back as binary data.
  bool all_outputs_binary = false;
};
RestInferRequest decode_infer_request(std::string_view body,
                                      std::optional<size_t> header_length,
                                      const std::string& model, const std::string& version,
                                      const RestLimits& limits);

struct RestBody {
  std::string body;
  std::optional<size_t> header_length;  // set when binary outputs follow the JSON
};

// The response JSON; an output sent as binary data (binary[i] for output i, or every output
// with all_outputs_binary) is appended as raw bytes after it, in output order, and its JSON
// gives parameters.binary_data_size instead of data.
RestBody encode_infer_response(const InferResponse& response, bool all_outputs_binary,
                               const std::vector<bool>& binary = {});

// What slim adds to the server metadata as "slim": {...} (`slim check` reads it; other
// KServe servers have no such object).
struct SlimServerInfo {
  std::string isa;      // kernel level in use (core's active_isa)
  std::string kernels;  // the language models' kernel set, the finest choice (e.g. "avx512vnni")
  bool require_signature = false;
};
std::string encode_server_metadata(const std::string& name, const std::string& version,
                                   const std::vector<std::string>& extensions,
                                   const std::optional<SlimServerInfo>& slim = std::nullopt);
std::string encode_model_metadata(const ModelMetadata& metadata);
// GET /v2/models/{m}/config: the config as Triton's JSON form names its fields (input,
// output, data_type "TYPE_FP32", version_policy {"latest": {...}}, priority_queue_policy
// keyed by level, parameters {"k": {"string_value": ...}}); 64-bit numbers as numbers.
std::string encode_model_config(const ModelConfig& config);
// The repository index request body: empty, or {"ready": bool}; true lists only the
// models that are ready.
bool decode_repository_index_ready(std::string_view body);
std::string encode_repository_index(const std::vector<RepositoryEntry>& entries,
                                    bool ready_only);
std::string encode_error(std::string_view message);  // {"error": "..."}

}  // namespace slim::serve
