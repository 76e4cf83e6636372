#include "slim/serve/rest_codec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "slim/core/dispatch.h"
#include "slim/serve/model_config.h"

namespace slim::serve {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;  // responses keep the protocol's field order

// Nested data is walked recursively, one level per dim: the bound keeps the stack small.
constexpr size_t kMaxRank = 32;

[[noreturn]] void fail(const std::string& message) {
  throw Error(ErrorCode::invalid_argument, message);
}

// Text that came from a client (ids, names from the URL) may not be valid UTF-8; it is
// echoed with replacement characters instead of failing the response.
template <typename Json>
std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// A client's value quoted in a message, cut short.
std::string excerpt(const json& v) {
  std::string s = dump(v);
  return s.size() <= 40 ? s : s.substr(0, 37) + "...";
}

json parse_json(std::string_view text, const std::string& what) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a huge number
    std::string m = e.what();
    size_t p = m.find("] ");  // drop nlohmann's "[json.exception.parse_error.101] "
    fail(what + " is not valid JSON: " + (p == std::string::npos ? m : m.substr(p + 2)));
  }
}

const json* field(const json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

uint64_t as_uint(const json& v, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return uint64_t(v.get<int64_t>());
  fail(what + " must be a non-negative integer");
}

bool as_bool(const json& v, const std::string& what) {
  if (!v.is_boolean()) fail(what + " must be true or false");
  return v.get<bool>();
}

const json* parameters(const json& object, const std::string& owner) {
  const json* p = field(object, "parameters");
  if (p && !p->is_object()) fail(owner + ": 'parameters' must be an object");
  return p;
}

template <typename T>
constexpr bool kIsFloat = std::is_floating_point_v<T> || std::is_same_v<T, Half> ||
                          std::is_same_v<T, BFloat16>;

// One JSON element into the tensor's element type; a value the type cannot hold is an
// error rather than a silent wrap or cast.
template <typename T>
void put_element(const json& v, T* dst, int64_t index, const std::string& input,
                 std::string_view datatype) {
  auto bad = [&](const char* why) {
    fail("input '" + input + "': element " + std::to_string(index) + " (" + excerpt(v) + ") " + why +
         " " + std::string(datatype));
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) bad("is not a boolean, as needed for");
    *dst = v.get<bool>();
  } else if constexpr (kIsFloat<T>) {
    if (!v.is_number()) bad("is not a number, as needed for");
    double d = v.get<double>();
    if constexpr (!std::is_same_v<T, double>) {
      if (std::fabs(d) > double(std::numeric_limits<float>::max())) bad("is out of range for");
      *dst = T(float(d));
    } else {
      *dst = d;
    }
  } else {
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > uint64_t(std::numeric_limits<T>::max())) bad("is out of range for");
      *dst = T(u);
    } else if (v.is_number_integer()) {
      int64_t i = v.get<int64_t>();
      if constexpr (std::is_unsigned_v<T>) {
        if (i < 0) bad("is out of range for");
      } else {
        if (i < int64_t(std::numeric_limits<T>::min()) || i > int64_t(std::numeric_limits<T>::max()))
          bad("is out of range for");
      }
      *dst = T(i);
    } else {
      bad("is not an integer, as needed for");
    }
  }
}

// True when `v` is arrays nested exactly like shape[axis..] with non-array leaves.
bool nested_like(const json& v, const Shape& shape, size_t axis) {
  if (axis == shape.size()) return !v.is_array();
  if (!v.is_array() || int64_t(v.size()) != shape[axis]) return false;
  for (const json& e : v)
    if (!nested_like(e, shape, axis + 1)) return false;
  return true;
}

template <typename T>
void fill_nested(const json& v, size_t depth, T* dst, int64_t& index, const std::string& input,
                 std::string_view datatype) {
  if (depth == 0) {
    put_element(v, dst + index, index, input, datatype);
    ++index;
    return;
  }
  for (const json& e : v) fill_nested(e, depth - 1, dst, index, input, datatype);
}

// The JSON `data` of an input: a flat array of all elements in row-major order, or arrays
// nested like the shape.
Tensor tensor_from_json(const json& data, DType dtype, const Shape& shape, int64_t numel,
                        const std::string& input, std::string_view datatype) {
  bool flat = data.is_array() && (data.empty() || !data.front().is_array());
  if (flat && int64_t(data.size()) != numel)
    fail("input '" + input + "': shape " + shape_str(shape) + " has " + std::to_string(numel) +
         " elements but 'data' has " + std::to_string(data.size()));
  if (!flat && !nested_like(data, shape, 0))
    fail("input '" + input + "': 'data' must be a flat array of " + std::to_string(numel) +
         " elements or arrays nested like shape " + shape_str(shape));
  Tensor t(dtype, shape);
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dst = static_cast<T*>(t.raw_data());
    int64_t index = 0;
    fill_nested(data, flat ? 1 : shape.size(), dst, index, input, datatype);
  });
  return t;
}

struct BinaryReader {
  std::string_view bytes;  // what follows the JSON header
  size_t offset = 0;
};

Tensor tensor_from_binary(BinaryReader& reader, uint64_t size, DType dtype, const Shape& shape,
                          int64_t numel, const std::string& input, std::string_view datatype) {
  uint64_t expected = uint64_t(numel) * dtype_size(dtype);
  if (size != expected)
    fail("input '" + input + "': binary_data_size " + std::to_string(size) + " does not match " +
         std::string(datatype) + " shape " + shape_str(shape) + " (" + std::to_string(expected) +
         " bytes)");
  size_t left = reader.bytes.size() - reader.offset;
  if (size > left)
    fail("input '" + input + "': binary data truncated: " + std::to_string(size) +
         " bytes needed at offset " + std::to_string(reader.offset) + " of the binary data, " +
         std::to_string(left) + " left");
  const char* src = reader.bytes.data() + reader.offset;
  if (dtype == DType::boolean) {
    for (uint64_t i = 0; i < size; ++i)
      if (uint8_t(src[i]) > 1)
        fail("input '" + input + "': BOOL element " + std::to_string(i) + " is byte " +
             std::to_string(uint8_t(src[i])) + ", expected 0 or 1");
  }
  Tensor t(dtype, shape);
  if (size) std::memcpy(t.raw_data(), src, size);
  reader.offset += size;
  return t;
}

Shape parse_shape(const json& input, const std::string& name, int64_t max_elements,
                  int64_t& numel) {
  const json* shape = field(input, "shape");
  if (!shape) fail("input '" + name + "': missing 'shape'");
  if (!shape->is_array()) fail("input '" + name + "': 'shape' must be an array of integers");
  if (shape->size() > kMaxRank)
    fail("input '" + name + "': shape has " + std::to_string(shape->size()) +
         " dims, at most " + std::to_string(kMaxRank) + " are supported");
  Shape dims;
  for (const json& d : *shape) {
    if (!d.is_number_integer()) fail("input '" + name + "': 'shape' must be an array of integers");
    if (!d.is_number_unsigned() && d.get<int64_t>() < 0)
      fail("input '" + name + "': shape dim " + dump(d) + " is negative");
    if (d.get<uint64_t>() > uint64_t(max_elements))
      fail("input '" + name + "': shape dim " + dump(d) + " is above the limit of " +
           std::to_string(max_elements) + " elements per tensor");
    dims.push_back(d.get<int64_t>());
  }
  numel = 1;
  if (std::find(dims.begin(), dims.end(), 0) != dims.end()) {
    numel = 0;  // an empty tensor, whatever its other dims
    return dims;
  }
  for (int64_t d : dims) {
    if (d > max_elements / numel)
      fail("input '" + name + "': shape " + shape_str(dims) + " has more than " +
           std::to_string(max_elements) + " elements, the limit per tensor");
    numel *= d;
  }
  return dims;
}

void decode_input(const json& input, size_t index, BinaryReader* reader, const RestLimits& limits,
                  InferRequest& request) {
  const std::string at = "inputs[" + std::to_string(index) + "]";
  if (!input.is_object()) fail(at + " must be an object");
  const json* name_field = field(input, "name");
  if (!name_field || !name_field->is_string()) fail(at + ": 'name' must be a string");
  const std::string name = name_field->get<std::string>();
  for (const auto& [seen, t] : request.inputs)
    if (seen == name) fail("input '" + name + "' is given twice");

  const json* datatype_field = field(input, "datatype");
  if (!datatype_field || !datatype_field->is_string())
    fail("input '" + name + "': 'datatype' must be a string");
  const std::string datatype = datatype_field->get<std::string>();
  DType dtype;
  try {
    dtype = parse_kserve_dtype(datatype);
  } catch (const Error& e) {
    throw Error(e.code(), "input '" + name + "': " + e.what());
  }
  int64_t numel = 0;
  Shape shape = parse_shape(input, name, limits.max_tensor_elements, numel);

  const json* params = parameters(input, "input '" + name + "'");
  const json* binary_size = params ? field(*params, "binary_data_size") : nullptr;
  const json* data = field(input, "data");
  Tensor tensor;
  if (binary_size) {
    uint64_t size = as_uint(*binary_size, "input '" + name + "': binary_data_size");
    if (data) fail("input '" + name + "': has both 'data' and binary_data_size");
    if (!reader)
      fail("input '" + name + "': binary_data_size given but the request has no " +
           std::string(kHeaderLengthHeader) + " header");
    tensor = tensor_from_binary(*reader, size, dtype, shape, numel, name, datatype);
  } else {
    if (!data) fail("input '" + name + "': missing 'data'");
    tensor = tensor_from_json(*data, dtype, shape, numel, name, datatype);
  }
  request.inputs.emplace_back(name, std::move(tensor));
}

void decode_outputs(const json& outputs, bool binary_default, InferRequest& request) {
  if (!outputs.is_array()) fail("'outputs' must be an array");
  for (size_t i = 0; i < outputs.size(); ++i) {
    const json& o = outputs[i];
    const std::string at = "outputs[" + std::to_string(i) + "]";
    if (!o.is_object()) fail(at + " must be an object");
    const json* name_field = field(o, "name");
    if (!name_field || !name_field->is_string()) fail(at + ": 'name' must be a string");
    RequestedOutput out{name_field->get<std::string>(), binary_default};
    for (const RequestedOutput& seen : request.outputs)
      if (seen.name == out.name) fail("output '" + out.name + "' is requested twice");
    if (const json* params = parameters(o, "output '" + out.name + "'")) {
      if (const json* b = field(*params, "binary_data"))
        out.binary = as_bool(*b, "output '" + out.name + "': binary_data");
      if (field(*params, "classification"))
        throw Error(ErrorCode::unsupported,
                    "output '" + out.name + "': the classification extension is not supported");
    }
    request.outputs.push_back(std::move(out));
  }
}

void append_number(std::string& out, double v, bool as_float) {
  if (!std::isfinite(v)) {  // JSON has no NaN or infinity
    out += "null";
    return;
  }
  char buf[32];
  auto r = as_float ? std::to_chars(buf, buf + sizeof buf, float(v))
                    : std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

// The elements of a contiguous tensor as a flat JSON array; floats in their shortest
// round-trip form.
void append_data(std::string& out, const Tensor& t) {
  out += '[';
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = static_cast<const T*>(t.raw_data());
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (i) out += ',';
      if constexpr (std::is_same_v<T, bool>) {
        out += p[i] ? "true" : "false";
      } else if constexpr (kIsFloat<T>) {
        append_number(out, double(p[i]), !std::is_same_v<T, double>);
      } else {
        char buf[24];
        out.append(buf, std::to_chars(buf, buf + sizeof buf, p[i]).ptr);
      }
    }
  });
  out += ']';
}

ojson tensor_specs(const std::vector<TensorSpec>& specs) {
  ojson out = ojson::array();
  for (const TensorSpec& s : specs)
    out.push_back({{"name", s.name}, {"datatype", kserve_dtype_name(s.dtype)}, {"shape", s.shape}});
  return out;
}

}  // namespace

size_t parse_header_length(std::string_view value) {
  size_t n = 0;
  auto r = std::from_chars(value.data(), value.data() + value.size(), n);
  if (value.empty() || r.ec != std::errc() || r.ptr != value.data() + value.size())
    fail(std::string(kHeaderLengthHeader) + " '" + std::string(value.substr(0, 64)) +
         "' is not a byte count");
  return n;
}

RestInferRequest decode_infer_request(std::string_view body, std::optional<size_t> header_length,
                                      const std::string& model, const std::string& version,
                                      const RestLimits& limits) {
  std::string_view header = body;
  BinaryReader reader;
  if (header_length) {
    if (*header_length > limits.max_header_bytes)
      fail(std::string(kHeaderLengthHeader) + " " + std::to_string(*header_length) +
           " is above the limit of " + std::to_string(limits.max_header_bytes) + " bytes");
    if (*header_length > body.size())
      fail(std::string(kHeaderLengthHeader) + " " + std::to_string(*header_length) +
           " is larger than the body (" + std::to_string(body.size()) + " bytes)");
    header = body.substr(0, *header_length);
    reader.bytes = body.substr(*header_length);
  }
  json j = parse_json(header, "request body");
  if (!j.is_object()) fail("request body must be a JSON object");

  RestInferRequest out;
  InferRequest& r = out.request;
  r.model = model;
  r.version = version;
  if (const json* id = field(j, "id")) {
    if (!id->is_string()) fail("request 'id' must be a string");
    r.id = id->get<std::string>();
  }
  bool binary_default = false;
  if (const json* params = parameters(j, "request")) {
    if (const json* p = field(*params, "priority")) {
      uint64_t level = as_uint(*p, "request parameter 'priority'");
      if (level > std::numeric_limits<uint32_t>::max())
        fail("request parameter 'priority' " + std::to_string(level) + " is out of range");
      if (level > 0) r.priority = uint32_t(level);  // 0: the model's default (Triton's rule)
    }
    if (const json* p = field(*params, "timeout"))
      r.timeout_us = as_uint(*p, "request parameter 'timeout'");
    if (const json* p = field(*params, "binary_data_output"))
      binary_default = as_bool(*p, "request parameter 'binary_data_output'");
    if (const json* p = field(*params, "energy")) r.energy = as_bool(*p, "request parameter 'energy'");
  }

  const json* inputs = field(j, "inputs");
  if (!inputs || !inputs->is_array()) fail("request 'inputs' must be an array");
  for (size_t i = 0; i < inputs->size(); ++i)
    decode_input((*inputs)[i], i, header_length ? &reader : nullptr, limits, r);
  if (reader.offset != reader.bytes.size())
    fail(std::to_string(reader.bytes.size() - reader.offset) +
         " bytes of binary data after the last binary input");

  if (const json* outputs = field(j, "outputs")) decode_outputs(*outputs, binary_default, r);
  else out.all_outputs_binary = binary_default;
  return out;
}

RestBody encode_infer_response(const InferResponse& response, bool all_outputs_binary,
                               const std::vector<bool>& binary_outputs) {
  std::string out = "{\"model_name\":" + dump(json(response.model)) +
                    ",\"model_version\":" + dump(json(response.version));
  if (!response.id.empty()) out += ",\"id\":" + dump(json(response.id));
  if (const auto& e = response.energy)
    out += ",\"parameters\":" + dump(ojson{{"energy_joules", e->joules},
                                             {"energy_source", e->source},
                                             {"carbon_grams", e->grams},
                                             {"region", e->region}});
  out += ",\"outputs\":[";
  std::vector<Tensor> binary;
  for (size_t i = 0; i < response.outputs.size(); ++i) {
    const auto& [name, tensor] = response.outputs[i];
    Tensor t = tensor.contiguous();
    if (i) out += ',';
    out += "{\"name\":" + dump(json(name)) + ",\"datatype\":\"" +
           std::string(kserve_dtype_name(t.dtype())) + "\",\"shape\":" + dump(json(t.shape()));
    if (all_outputs_binary || (i < binary_outputs.size() && binary_outputs[i])) {
      out += ",\"parameters\":{\"binary_data_size\":" + std::to_string(t.nbytes()) + "}}";
      binary.push_back(std::move(t));
    } else {
      out += ",\"data\":";
      append_data(out, t);
      out += '}';
    }
  }
  out += "]}";
  if (binary.empty()) return {std::move(out), std::nullopt};
  size_t header_length = out.size();
  for (const Tensor& t : binary) out.append(static_cast<const char*>(t.raw_data()), t.nbytes());
  return {std::move(out), header_length};
}

std::string encode_server_metadata(const std::string& name, const std::string& version,
                                   const std::vector<std::string>& extensions,
                                   const std::optional<SlimServerInfo>& slim) {
  ojson out{{"name", name}, {"version", version}, {"extensions", extensions}};
  if (slim)
    out["slim"] = {{"isa", slim->isa}, {"kernels", slim->kernels}, {"require_signature", slim->require_signature}};
  return dump(out);
}

std::string encode_model_metadata(const ModelMetadata& m) {
  ojson j{{"name", m.name},
          {"versions", m.versions},
          {"platform", m.platform},
          {"inputs", tensor_specs(m.inputs)},
          {"outputs", tensor_specs(m.outputs)}};
  // slim's extension: what the server verified of the version, and the variant it serves.
  if (!m.digest.empty())
    j["slim"] = ojson{{"digest", m.digest}, {"signed", !m.signer.empty()},
                      {"signer", m.signer.empty() ? ojson(nullptr) : ojson(m.signer)}};
  if (!m.variant.empty()) {
    j["slim"]["variant"] = m.variant;
    j["slim"]["variants"] = m.variants;
  }
  return dump(j);
}

std::string encode_model_config(const ModelConfig& c) {
  auto tensors = [](const std::vector<TensorConfig>& ts, bool inputs) {
    ojson out = ojson::array();
    for (const TensorConfig& t : ts) {
      ojson e{{"name", t.name}, {"data_type", triton_dtype_name(t.dtype)}, {"dims", t.dims}};
      if (inputs) e["allow_ragged_batch"] = t.allow_ragged_batch;
      out.push_back(std::move(e));
    }
    return out;
  };
  auto queue_policy = [](const QueuePolicy& q) {
    return ojson{{"timeout_action", q.timeout_action == QueuePolicy::TimeoutAction::reject ? "REJECT" : "DELAY"},
                 {"default_timeout_microseconds", q.default_timeout_microseconds},
                 {"allow_timeout_override", q.allow_timeout_override},
                 {"max_queue_size", q.max_queue_size}};
  };
  ojson policy;
  switch (c.version_policy.kind) {
    case VersionPolicy::Kind::latest: policy["latest"] = {{"num_versions", c.version_policy.latest_num_versions}}; break;
    case VersionPolicy::Kind::all: policy["all"] = ojson::object(); break;
    case VersionPolicy::Kind::specific: policy["specific"] = {{"versions", c.version_policy.specific_versions}}; break;
  }
  ojson out{{"name", c.name},
            {"platform", c.platform},
            {"backend", c.backend},
            {"version_policy", policy},
            {"max_batch_size", c.max_batch_size},
            {"input", tensors(c.inputs, true)},
            {"output", tensors(c.outputs, false)},
            {"instance_group", ojson::array({{{"count", c.instance_count}, {"kind", "KIND_CPU"}}})},
            {"default_model_filename", c.default_model_filename}};
  if (const auto& d = c.dynamic_batching) {
    ojson levels = ojson::object();
    for (const auto& [level, q] : d->priority_queue_policy) levels[std::to_string(level)] = queue_policy(q);
    out["dynamic_batching"] = {{"preferred_batch_size", d->preferred_batch_size},
                               {"max_queue_delay_microseconds", d->max_queue_delay_microseconds},
                               {"preserve_ordering", d->preserve_ordering},
                               {"priority_levels", d->priority_levels},
                               {"default_priority_level", d->default_priority_level},
                               {"default_queue_policy", queue_policy(d->default_queue_policy)},
                               {"priority_queue_policy", levels}};
  }
  ojson params = ojson::object();
  for (const auto& [key, value] : c.parameters) params[key] = {{"string_value", value}};
  out["parameters"] = params;
  return dump(out);
}

bool decode_repository_index_ready(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return false;
  json j = parse_json(body, "repository index request");
  if (!j.is_object()) fail("repository index request must be a JSON object");
  const json* ready = field(j, "ready");
  return ready && as_bool(*ready, "repository index 'ready'");
}

std::string encode_repository_index(const std::vector<RepositoryEntry>& entries, bool ready_only) {
  ojson out = ojson::array();
  for (const RepositoryEntry& e : entries)
    if (!ready_only || e.state == "READY")
      out.push_back(
          {{"name", e.name}, {"version", e.version}, {"state", e.state}, {"reason", e.reason}});
  return dump(out);
}

std::string encode_error(std::string_view message) {
  return dump(ojson{{"error", std::string(message)}});
}

}  // namespace slim::serve
