// libFuzzer target for the KServe v2 REST request decoder (JSON tensors and the binary
// tensor data extension): any body must decode or end in a slim::Error, never a crash, a
// hang or an allocation the body does not account for. An input "N\n<body>" is also
// decoded as a request whose Inference-Header-Content-Length header says N. Whatever
// decodes is encoded back as a response, inputs as outputs.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "slim/core/error.h"
#include "slim/serve/rest_codec.h"

namespace {

void decode_and_encode(std::string_view body, std::optional<size_t> header_length) {
  using namespace slim::serve;
  try {
    RestInferRequest d = decode_infer_request(body, header_length, "m", "", RestLimits{});
    InferResponse response;
    response.outputs = std::move(d.request.inputs);
    std::vector<bool> binary;
    for (size_t i = 0; i < response.outputs.size(); ++i) binary.push_back(i % 2);
    encode_infer_response(response, d.all_outputs_binary, binary);
  } catch (const slim::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  decode_and_encode(input, std::nullopt);
  size_t newline = input.substr(0, 24).find('\n');
  if (newline != std::string_view::npos) {
    try {
      size_t n = slim::serve::parse_header_length(input.substr(0, newline));
      decode_and_encode(input.substr(newline + 1), n);
    } catch (const slim::Error&) {
    }
  }
  return 0;
}
