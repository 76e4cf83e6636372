// The KServe v2 REST codec: JSON and binary tensor data in, exact response bytes out,
// and the message of every request it refuses.
#include "slim/serve/rest_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "slim/core/half.h"

namespace slim::serve {
namespace {

RestInferRequest decode(const std::string& body, std::optional<size_t> header_length = {},
                        RestLimits limits = {}) {
  return decode_infer_request(body, header_length, "m", "2", limits);
}

// The decoder's error for `body`: its code and message.
std::pair<ErrorCode, std::string> error_of(const std::string& body,
                                           std::optional<size_t> header_length = {},
                                           RestLimits limits = {}) {
  try {
    decode(body, header_length, limits);
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  return {ErrorCode::internal, "no error"};
}

// A request with one input `x` of this datatype, shape and data.
std::string one_input(const std::string& datatype, const std::string& shape,
                      const std::string& data) {
  return R"({"inputs":[{"name":"x","datatype":")" + datatype + R"(","shape":)" + shape +
         R"(,"data":)" + data + "}]}";
}

template <typename T>
std::vector<T> values(const Tensor& t) {
  const T* p = static_cast<const T*>(t.raw_data());
  return std::vector<T>(p, p + t.numel());
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

std::string bytes_of(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

TEST(RestDecode, JsonRequestWithParametersAndOutputs) {
  RestInferRequest d = decode(R"({
    "id": "req-7",
    "parameters": {"priority": 1, "timeout": 2500, "unknown": "ignored"},
    "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [2, 3],
                "data": [0.5, 1, -2, 3.25, 4, 5]}],
    "outputs": [{"name": "probabilities"}, {"name": "logits", "parameters": {"binary_data": true}}]
  })");
  const InferRequest& r = d.request;
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.version, "2");
  EXPECT_EQ(r.id, "req-7");
  EXPECT_EQ(r.priority, 1u);
  EXPECT_EQ(r.timeout_us, 2500u);
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.inputs[0].first, "pixels");
  const Tensor& x = r.inputs[0].second;
  EXPECT_EQ(x.dtype(), DType::f32);
  EXPECT_EQ(x.shape(), (Shape{2, 3}));
  EXPECT_EQ(values<float>(x), (std::vector<float>{0.5f, 1, -2, 3.25f, 4, 5}));
  ASSERT_EQ(r.outputs.size(), 2u);
  EXPECT_EQ(r.outputs[0].name, "probabilities");
  EXPECT_FALSE(r.outputs[0].binary);
  EXPECT_EQ(r.outputs[1].name, "logits");
  EXPECT_TRUE(r.outputs[1].binary);
  EXPECT_FALSE(d.all_outputs_binary);
}

TEST(RestDecode, OptionalFieldsAbsent) {
  RestInferRequest d = decode(one_input("INT32", "[1]", "[7]"));
  EXPECT_EQ(d.request.id, "");
  EXPECT_FALSE(d.request.priority);
  EXPECT_FALSE(d.request.timeout_us);
  EXPECT_TRUE(d.request.outputs.empty());
  EXPECT_FALSE(d.all_outputs_binary);
  EXPECT_FALSE(d.request.energy);
}

TEST(RestDecode, EnergyParameter) {
  EXPECT_TRUE(decode(R"({"parameters":{"energy":true},"inputs":[]})").request.energy);
  EXPECT_FALSE(decode(R"({"parameters":{"energy":false},"inputs":[]})").request.energy);
  EXPECT_EQ(error_of(R"({"parameters":{"energy":1},"inputs":[]})").second,
            "request parameter 'energy' must be true or false");
}

TEST(RestDecode, PriorityZeroMeansTheModelDefault) {
  RestInferRequest d = decode(
      R"({"parameters":{"priority":0,"timeout":0},"inputs":[{"name":"x","datatype":"BOOL","shape":[0],"data":[]}]})");
  EXPECT_FALSE(d.request.priority);
  EXPECT_EQ(d.request.timeout_us, 0u);
}

TEST(RestDecode, NestedDataIsRowMajor) {
  RestInferRequest d = decode(one_input("INT64", "[2,3]", "[[1,2,3],[-4,5,9007199254740993]]"));
  const Tensor& x = d.request.inputs[0].second;
  EXPECT_EQ(x.shape(), (Shape{2, 3}));
  EXPECT_EQ(values<int64_t>(x), (std::vector<int64_t>{1, 2, 3, -4, 5, 9007199254740993}));
}

TEST(RestDecode, ScalarsAndEmptyTensors) {
  EXPECT_EQ(values<double>(decode(one_input("FP64", "[]", "2.5")).request.inputs[0].second),
            std::vector<double>{2.5});
  EXPECT_EQ(values<double>(decode(one_input("FP64", "[]", "[2.5]")).request.inputs[0].second),
            std::vector<double>{2.5});
  const Tensor e = decode(one_input("FP32", "[3,0,100000000]", "[]")).request.inputs[0].second;
  EXPECT_EQ(e.shape(), (Shape{3, 0, 100000000}));
  EXPECT_EQ(e.numel(), 0);
}

TEST(RestDecode, EveryDatatypeFromJson) {
  auto first = [](const std::string& datatype, const std::string& data) {
    return decode(one_input(datatype, "[2]", data)).request.inputs[0].second;
  };
  EXPECT_EQ(values<bool>(first("BOOL", "[true,false]")), (std::vector<bool>{true, false}));
  EXPECT_EQ(values<uint8_t>(first("UINT8", "[0,255]")), (std::vector<uint8_t>{0, 255}));
  EXPECT_EQ(values<int8_t>(first("INT8", "[-128,127]")), (std::vector<int8_t>{-128, 127}));
  EXPECT_EQ(values<uint16_t>(first("UINT16", "[0,65535]")), (std::vector<uint16_t>{0, 65535}));
  EXPECT_EQ(values<int16_t>(first("INT16", "[-32768,32767]")),
            (std::vector<int16_t>{-32768, 32767}));
  EXPECT_EQ(values<uint32_t>(first("UINT32", "[0,4294967295]")),
            (std::vector<uint32_t>{0, 4294967295u}));
  EXPECT_EQ(values<int32_t>(first("INT32", "[-2147483648,2147483647]")),
            (std::vector<int32_t>{-2147483647 - 1, 2147483647}));
  EXPECT_EQ(values<uint64_t>(first("UINT64", "[0,18446744073709551615]")),
            (std::vector<uint64_t>{0, 18446744073709551615u}));
  EXPECT_EQ(values<double>(first("FP64", "[0.1,-1e300]")), (std::vector<double>{0.1, -1e300}));
  // FP16 and BF16 arrive as JSON numbers and are rounded to the nearest 16-bit value.
  EXPECT_EQ(values<uint16_t>(first("FP16", "[1.5,-0.1]")),
            (std::vector<uint16_t>{f32_to_f16(1.5f), f32_to_f16(-0.1f)}));
  EXPECT_EQ(values<uint16_t>(first("BF16", "[1.5,3]")),
            (std::vector<uint16_t>{f32_to_bf16(1.5f), f32_to_bf16(3.f)}));
  EXPECT_EQ(first("FP16", "[1,2]").dtype(), DType::f16);
  EXPECT_EQ(first("BF16", "[1,2]").dtype(), DType::bf16);
}

TEST(RestDecode, BinaryInputsFollowTheHeader) {
  const float a[4] = {1.5f, -2, 3, 4};
  const int64_t b[2] = {-9, 1ll << 40};
  const std::string header =
      R"({"inputs":[{"name":"a","datatype":"FP32","shape":[2,2],"parameters":{"binary_data_size":16}},)"
      R"({"name":"j","datatype":"INT32","shape":[1],"data":[5]},)"
      R"({"name":"b","datatype":"INT64","shape":[2],"parameters":{"binary_data_size":16}},)"
      R"({"name":"c","datatype":"BOOL","shape":[3],"parameters":{"binary_data_size":3}}],)"
      R"("parameters":{"binary_data_output":true}})";
  const std::string body = header + bytes_of(a, 16) + bytes_of(b, 16) + std::string("\1\0\1", 3);
  RestInferRequest d = decode(body, header.size());
  const auto& in = d.request.inputs;
  ASSERT_EQ(in.size(), 4u);
  EXPECT_EQ(in[0].first, "a");
  EXPECT_EQ(in[0].second.shape(), (Shape{2, 2}));
  EXPECT_EQ(values<float>(in[0].second), (std::vector<float>{1.5f, -2, 3, 4}));
  EXPECT_EQ(values<int32_t>(in[1].second), std::vector<int32_t>{5});
  EXPECT_EQ(values<int64_t>(in[2].second), (std::vector<int64_t>{-9, 1ll << 40}));
  EXPECT_EQ(values<bool>(in[3].second), (std::vector<bool>{true, false, true}));
  // binary_data_output and no outputs named: every output is binary.
  EXPECT_TRUE(d.all_outputs_binary);
}

TEST(RestDecode, BinaryDataOutputIsTheDefaultOfNamedOutputs) {
  RestInferRequest d = decode(
      R"({"parameters":{"binary_data_output":true},"inputs":[],"outputs":[{"name":"a"},)"
      R"({"name":"b","parameters":{"binary_data":false}}]})");
  EXPECT_TRUE(d.request.outputs[0].binary);
  EXPECT_FALSE(d.request.outputs[1].binary);
  EXPECT_FALSE(d.all_outputs_binary);
}

TEST(RestDecode, HeaderLengthEqualToTheBodyIsPlainJson) {
  const std::string body = one_input("UINT8", "[1]", "[3]");
  EXPECT_EQ(values<uint8_t>(decode(body, body.size()).request.inputs[0].second),
            std::vector<uint8_t>{3});
}

TEST(RestDecode, HeaderLength) {
  EXPECT_EQ(parse_header_length("0"), 0u);
  EXPECT_EQ(parse_header_length("1234"), 1234u);
  for (const char* bad : {"", "abc", "-1", "12x", " 12", "99999999999999999999999"}) {
    try {
      parse_header_length(bad);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_EQ(e.what(), "Inference-Header-Content-Length '" + std::string(bad) +
                              "' is not a byte count");
    }
  }
}

struct BadRequest {
  std::string body;
  std::optional<size_t> header_length;
  std::string message;
  ErrorCode code = ErrorCode::invalid_argument;
};

TEST(RestDecode, EveryRefusalNamesTheProblem) {
  const std::string x = R"({"name":"x","datatype":"FP32","shape":[2])";
  const std::string bin4 = R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"parameters":{"binary_data_size":4}}]})";
  const std::string bin12 = R"({"inputs":[)" + x + R"(,"parameters":{"binary_data_size":12}}]})";
  const std::string bool2 = R"({"inputs":[{"name":"x","datatype":"BOOL","shape":[2],"parameters":{"binary_data_size":2}}]})";
  const std::vector<BadRequest> cases = {
      {"{x", {}, "request body is not valid JSON: parse error at line 1, column 2: syntax error "
                 "while parsing object key - invalid literal; last read: '{x'; expected string literal"},
      {"", {}, "request body is not valid JSON: parse error at line 1, column 1: syntax error while "
               "parsing value - unexpected end of input; expected '[', '{', or a literal"},
      {R"({"inputs":[1e999]})", {},
       "request body is not valid JSON: number overflow parsing '1e999'"},
      {"[1]", {}, "request body must be a JSON object"},
      {R"({"id":5,"inputs":[]})", {}, "request 'id' must be a string"},
      {R"({"parameters":[],"inputs":[]})", {}, "request: 'parameters' must be an object"},
      {R"({"parameters":{"priority":-1},"inputs":[]})", {},
       "request parameter 'priority' must be a non-negative integer"},
      {R"({"parameters":{"priority":1.5},"inputs":[]})", {},
       "request parameter 'priority' must be a non-negative integer"},
      {R"({"parameters":{"priority":4294967296},"inputs":[]})", {},
       "request parameter 'priority' 4294967296 is out of range"},
      {R"({"parameters":{"timeout":"1s"},"inputs":[]})", {},
       "request parameter 'timeout' must be a non-negative integer"},
      {R"({"parameters":{"binary_data_output":1},"inputs":[]})", {},
       "request parameter 'binary_data_output' must be true or false"},
      {R"({})", {}, "request 'inputs' must be an array"},
      {R"({"inputs":{}})", {}, "request 'inputs' must be an array"},
      {R"({"inputs":[1]})", {}, "inputs[0] must be an object"},
      {R"({"inputs":[{"datatype":"FP32"}]})", {}, "inputs[0]: 'name' must be a string"},
      {R"({"inputs":[)" + x + R"(,"data":[1,2]},)" + x + R"(,"data":[1,2]}]})", {},
       "input 'x' is given twice"},
      {R"({"inputs":[{"name":"x","shape":[1],"data":[1]}]})", {},
       "input 'x': 'datatype' must be a string"},
      {one_input("BYTES", "[1]", R"(["a"])"), {},
       "input 'x': string tensors are not supported (BYTES)", ErrorCode::unsupported},
      {one_input("FP8", "[1]", "[1]"), {}, "input 'x': unknown KServe datatype 'FP8'"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","data":[1]}]})", {}, "input 'x': missing 'shape'"},
      {one_input("FP32", "2", "[1,2]"), {}, "input 'x': 'shape' must be an array of integers"},
      {one_input("FP32", "[1.5]", "[1]"), {}, "input 'x': 'shape' must be an array of integers"},
      {one_input("FP32", "[2,-1]", "[1,2]"), {}, "input 'x': shape dim -1 is negative"},
      {one_input("FP32", "[1" + repeat(",1", 32) + "]", "[1]"), {},
       "input 'x': shape has 33 dims, at most 32 are supported"},
      {one_input("FP32", "[268435457]", "[]"), {},
       "input 'x': shape dim 268435457 is above the limit of 268435456 elements per tensor"},
      {one_input("FP32", "[65536,65536]", "[]"), {},
       "input 'x': shape [65536,65536] has more than 268435456 elements, the limit per tensor"},
      {R"({"inputs":[)" + x + R"(,"parameters":5}]})", {}, "input 'x': 'parameters' must be an object"},
      {R"({"inputs":[)" + x + "}]}", {}, "input 'x': missing 'data'"},
      {one_input("FP32", "[2,3]", "[1,2,3,4,5]"), {},
       "input 'x': shape [2,3] has 6 elements but 'data' has 5"},
      {one_input("FP32", "[2,2]", "[[1,2],[3]]"), {},
       "input 'x': 'data' must be a flat array of 4 elements or arrays nested like shape [2,2]"},
      {one_input("FP32", "[2,2]", "[[1,2],[3,[4]]]"), {},
       "input 'x': 'data' must be a flat array of 4 elements or arrays nested like shape [2,2]"},
      {one_input("FP32", "[1]", "1"), {},
       "input 'x': 'data' must be a flat array of 1 elements or arrays nested like shape [1]"},
      {one_input("FP32", "[2]", "[1,true]"), {},
       "input 'x': element 1 (true) is not a number, as needed for FP32"},
      {one_input("FP32", "[2]", "[1,[2]]"), {},
       "input 'x': element 1 ([2]) is not a number, as needed for FP32"},
      {one_input("FP16", "[1]", "[1e39]"), {},
       "input 'x': element 0 (1e+39) is out of range for FP16"},
      {one_input("INT32", "[2]", "[1,1.5]"), {},
       "input 'x': element 1 (1.5) is not an integer, as needed for INT32"},
      {one_input("INT32", "[1]", R"(["1"])"), {},
       "input 'x': element 0 (\"1\") is not an integer, as needed for INT32"},
      {one_input("UINT8", "[1]", "[256]"), {}, "input 'x': element 0 (256) is out of range for UINT8"},
      {one_input("UINT8", "[1]", "[-1]"), {}, "input 'x': element 0 (-1) is out of range for UINT8"},
      {one_input("INT8", "[1]", "[-129]"), {}, "input 'x': element 0 (-129) is out of range for INT8"},
      {one_input("INT64", "[1]", "[9223372036854775808]"), {},
       "input 'x': element 0 (9223372036854775808) is out of range for INT64"},
      {one_input("BOOL", "[1]", "[1]"), {},
       "input 'x': element 0 (1) is not a boolean, as needed for BOOL"},
      {one_input("FP32", "[1]", R"([")" + std::string(100, 'a') + R"("])"), {},
       "input 'x': element 0 (\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...) is not a number, as needed "
       "for FP32"},
      // Binary tensor data.
      {R"({"inputs":[)" + x + R"(,"parameters":{"binary_data_size":-8}}]})", {},
       "input 'x': binary_data_size must be a non-negative integer"},
      {R"({"inputs":[)" + x + R"(,"data":[1,2],"parameters":{"binary_data_size":8}}]})", {},
       "input 'x': has both 'data' and binary_data_size"},
      {bin4 + "abcd", {},
       "request body is not valid JSON: parse error at line 1, column 92: syntax error while "
       "parsing value - invalid literal; last read: '4}}]}a'; expected end of input"},
      {bin4, {},
       "input 'x': binary_data_size given but the request has no Inference-Header-Content-Length "
       "header"},
      {bin12, 0,
       "request body is not valid JSON: parse error at line 1, column 1: syntax error while "
       "parsing value - unexpected end of input; expected '[', '{', or a literal"},
      {bin12 + std::string(12, 0), bin12.size(),
       "input 'x': binary_data_size 12 does not match FP32 shape [2] (8 bytes)"},
      {bin4 + "ab", bin4.size(),
       "input 'x': binary data truncated: 4 bytes needed at offset 0 of the binary data, 2 left"},
      {bin4 + "abcdefg", bin4.size(), "3 bytes of binary data after the last binary input"},
      {bool2 + std::string("\1\2", 2), bool2.size(),
       "input 'x': BOOL element 1 is byte 2, expected 0 or 1"},
      {bin4 + "abcd", 200, "Inference-Header-Content-Length 200 is larger than the body (95 bytes)"},
      {bin4 + "abcd", 9000, "Inference-Header-Content-Length 9000 is above the limit of 8192 bytes"},
      // Outputs.
      {R"({"inputs":[],"outputs":{}})", {}, "'outputs' must be an array"},
      {R"({"inputs":[],"outputs":["y"]})", {}, "outputs[0] must be an object"},
      {R"({"inputs":[],"outputs":[{"name":1}]})", {}, "outputs[0]: 'name' must be a string"},
      {R"({"inputs":[],"outputs":[{"name":"y"},{"name":"y"}]})", {}, "output 'y' is requested twice"},
      {R"({"inputs":[],"outputs":[{"name":"y","parameters":true}]})", {},
       "output 'y': 'parameters' must be an object"},
      {R"({"inputs":[],"outputs":[{"name":"y","parameters":{"binary_data":"yes"}}]})", {},
       "output 'y': binary_data must be true or false"},
      {R"({"inputs":[],"outputs":[{"name":"y","parameters":{"classification":3}}]})", {},
       "output 'y': the classification extension is not supported", ErrorCode::unsupported},
  };
  for (const BadRequest& c : cases) {
    auto [code, message] = error_of(c.body, c.header_length);
    EXPECT_EQ(message, c.message) << c.body;
    EXPECT_EQ(code, c.code) << c.body;
  }
}

TEST(RestDecode, ElementLimitIsConfigurable) {
  RestLimits limits;
  limits.max_tensor_elements = 4;
  EXPECT_EQ(decode(one_input("FP32", "[2,2]", "[1,2,3,4]"), {}, limits).request.inputs.size(), 1u);
  EXPECT_EQ(error_of(one_input("FP32", "[5]", "[1,2,3,4,5]"), {}, limits).second,
            "input 'x': shape dim 5 is above the limit of 4 elements per tensor");
  EXPECT_EQ(error_of(one_input("FP32", "[2,3]", "[1,2,3,4,5,6]"), {}, limits).second,
            "input 'x': shape [2,3] has more than 4 elements, the limit per tensor");
  limits.max_header_bytes = 10;
  EXPECT_EQ(error_of("{\"inputs\":[]}", 13, limits).second,
            "Inference-Header-Content-Length 13 is above the limit of 10 bytes");
}

InferResponse response_with(std::vector<std::pair<std::string, Tensor>> outputs) {
  InferResponse r;
  r.model = "digits";
  r.version = "1";
  r.outputs = std::move(outputs);
  return r;
}

TEST(RestEncode, JsonOutputsExactly) {
  Tensor f = Tensor::from_vector<float>({2, 2}, {0.1f, -2.5f, 1e-7f, 3});
  Tensor i = Tensor::from_vector<int64_t>({3}, {-1, 0, int64_t(1) << 60});
  Tensor b = Tensor::from_vector<bool>({2}, {true, false});
  InferResponse r = response_with({{"p", f}, {"i", i}, {"b", b}});
  r.id = "req-1";
  RestBody out = encode_infer_response(r, false);
  EXPECT_FALSE(out.header_length);
  EXPECT_EQ(out.body,
            R"({"model_name":"digits","model_version":"1","id":"req-1","outputs":[)"
            R"({"name":"p","datatype":"FP32","shape":[2,2],"data":[0.1,-2.5,1e-07,3]},)"
            R"({"name":"i","datatype":"INT64","shape":[3],"data":[-1,0,1152921504606846976]},)"
            R"({"name":"b","datatype":"BOOL","shape":[2],"data":[true,false]}]})");
}

TEST(RestEncode, EnergyOfTheRequestInTheResponseParameters) {
  InferResponse r = response_with({{"b", Tensor::from_vector<bool>({1}, {true})}});
  r.energy = RequestEnergy{0.25, 3.0682e-06, "estimated", "FRA"};
  EXPECT_EQ(encode_infer_response(r, false).body,
            R"({"model_name":"digits","model_version":"1","parameters":{"energy_joules":0.25,)"
            R"("energy_source":"estimated","carbon_grams":3.0682e-06,"region":"FRA"},"outputs":[)"
            R"({"name":"b","datatype":"BOOL","shape":[1],"data":[true]}]})");
}

TEST(RestEncode, SixteenBitFloatsDoublesAndNonFinite) {
  Tensor h(DType::f16, {2});
  static_cast<uint16_t*>(h.raw_data())[0] = f32_to_f16(0.5f);  // f16 has no C++ type
  static_cast<uint16_t*>(h.raw_data())[1] = f32_to_f16(-3.f);
  Tensor d = Tensor::from_vector<double>(
      {3}, {0.1, std::numeric_limits<double>::quiet_NaN(), -std::numeric_limits<double>::infinity()});
  RestBody out = encode_infer_response(response_with({{"h", h}, {"d", d}}), false);
  EXPECT_EQ(out.body,
            R"({"model_name":"digits","model_version":"1","outputs":[)"
            R"({"name":"h","datatype":"FP16","shape":[2],"data":[0.5,-3]},)"
            R"({"name":"d","datatype":"FP64","shape":[3],"data":[0.1,null,null]}]})");
}

TEST(RestEncode, BinaryOutputsFollowTheJson) {
  Tensor f = Tensor::from_vector<float>({2}, {1.5f, -1});
  Tensor u = Tensor::from_vector<uint8_t>({3}, {1, 2, 3});
  Tensor v = Tensor::from_vector<int32_t>({1}, {-7});
  RestBody out = encode_infer_response(response_with({{"f", f}, {"u", u}, {"v", v}}), false,
                                       {true, false, true});
  const std::string json =
      R"({"model_name":"digits","model_version":"1","outputs":[)"
      R"({"name":"f","datatype":"FP32","shape":[2],"parameters":{"binary_data_size":8}},)"
      R"({"name":"u","datatype":"UINT8","shape":[3],"data":[1,2,3]},)"
      R"({"name":"v","datatype":"INT32","shape":[1],"parameters":{"binary_data_size":4}}]})";
  ASSERT_EQ(out.header_length, json.size());
  const float fv[2] = {1.5f, -1};
  const int32_t vv = -7;
  EXPECT_EQ(out.body, json + bytes_of(fv, 8) + bytes_of(&vv, 4));

  RestBody all = encode_infer_response(response_with({{"u", u}}), true);
  const std::string all_json =
      R"({"model_name":"digits","model_version":"1","outputs":[)"
      R"({"name":"u","datatype":"UINT8","shape":[3],"parameters":{"binary_data_size":3}}]})";
  ASSERT_EQ(all.header_length, all_json.size());
  EXPECT_EQ(all.body, all_json + "\1\2\3");
}

TEST(RestEncode, NonContiguousOutputsArePacked) {
  Tensor t = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6}).permute({1, 0});
  RestBody out = encode_infer_response(response_with({{"t", t}}), false);
  EXPECT_EQ(out.body, R"({"model_name":"digits","model_version":"1","outputs":[)"
                      R"({"name":"t","datatype":"FP32","shape":[3,2],"data":[1,4,2,5,3,6]}]})");
}

TEST(RestEncode, InvalidUtf8IsReplacedNotFatal) {
  InferResponse r = response_with({});
  r.model = "bad\xff";
  EXPECT_EQ(encode_infer_response(r, false).body,
            "{\"model_name\":\"bad\xEF\xBF\xBD\",\"model_version\":\"1\",\"outputs\":[]}");
  EXPECT_EQ(encode_error("no model 'x\xff'"), "{\"error\":\"no model 'x\xEF\xBF\xBD'\"}");
}

TEST(RestEncode, Metadata) {
  EXPECT_EQ(encode_server_metadata("slim", "0.1.0", {"binary_tensor_data", "model_repository"}),
            R"({"name":"slim","version":"0.1.0","extensions":["binary_tensor_data","model_repository"]})");
  ModelMetadata m;
  m.name = "digits";
  m.versions = {"2", "1"};
  m.platform = "onnxruntime_onnx";
  m.inputs = {{"pixels", DType::f32, {-1, 64}}};
  m.outputs = {{"probabilities", DType::f32, {-1, 10}}, {"label", DType::i64, {-1}}};
  EXPECT_EQ(encode_model_metadata(m),
            R"({"name":"digits","versions":["2","1"],"platform":"onnxruntime_onnx",)"
            R"("inputs":[{"name":"pixels","datatype":"FP32","shape":[-1,64]}],)"
            R"("outputs":[{"name":"probabilities","datatype":"FP32","shape":[-1,10]},)"
            R"({"name":"label","datatype":"INT64","shape":[-1]}]})");
  EXPECT_EQ(encode_error("model 'x' not found"), R"({"error":"model 'x' not found"})");
}

TEST(RestEncode, ServerMetadataWithSlimInfo) {
  EXPECT_EQ(encode_server_metadata("slim", "0.1.0", {"parameters"}, SlimServerInfo{"avx2", "avx2", true}),
            R"({"name":"slim","version":"0.1.0","extensions":["parameters"],)"
            R"("slim":{"isa":"avx2","kernels":"avx2","require_signature":true}})");
}

// Triton's field names, and a config read back from its encoding is the config.
TEST(RestEncode, ModelConfig) {
  ModelConfig c = parse_model_config_pbtxt(R"(name: "digits"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ { name: "pixels" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] } ]
version_policy: { specific: { versions: [ 1, 3 ] } }
instance_group [ { count: 2, kind: KIND_CPU } ]
dynamic_batching {
  preferred_batch_size: [ 8, 16 ]
  max_queue_delay_microseconds: 2000
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy { max_queue_size: 256 }
  priority_queue_policy {
    key: 3
    value: { timeout_action: DELAY, default_timeout_microseconds: 5000000, allow_timeout_override: true }
  }
}
parameters { key: "temperature" value: { string_value: "0.5" } }
)",
                                           "config.pbtxt");
  const std::string json = encode_model_config(c);
  EXPECT_EQ(json,
            R"({"name":"digits","platform":"onnxruntime_onnx","backend":"",)"
            R"("version_policy":{"specific":{"versions":[1,3]}},"max_batch_size":32,)"
            R"("input":[{"name":"pixels","data_type":"TYPE_FP32","dims":[64],"allow_ragged_batch":false}],)"
            R"("output":[{"name":"probabilities","data_type":"TYPE_FP32","dims":[10]}],)"
            R"("instance_group":[{"count":2,"kind":"KIND_CPU"}],"default_model_filename":"",)"
            R"("dynamic_batching":{"preferred_batch_size":[8,16],"max_queue_delay_microseconds":2000,)"
            R"("preserve_ordering":false,"priority_levels":3,"default_priority_level":2,)"
            R"("default_queue_policy":{"timeout_action":"REJECT","default_timeout_microseconds":0,)"
            R"("allow_timeout_override":false,"max_queue_size":256},)"
            R"("priority_queue_policy":{"3":{"timeout_action":"DELAY","default_timeout_microseconds":5000000,)"
            R"("allow_timeout_override":true,"max_queue_size":0}}},)"
            R"("parameters":{"temperature":{"string_value":"0.5"}}})");
  ModelConfig back = parse_model_config_json(json, "config.json");
  c.warnings = back.warnings = {};
  EXPECT_EQ(back, c);

  ModelConfig plain;  // no dynamic batching, the latest version
  plain.name = "plain";
  EXPECT_EQ(encode_model_config(plain),
            R"({"name":"plain","platform":"","backend":"","version_policy":{"latest":{"num_versions":1}},)"
            R"("max_batch_size":0,"input":[],"output":[],"instance_group":[{"count":1,"kind":"KIND_CPU"}],)"
            R"("default_model_filename":"","parameters":{}})");
}

TEST(RestRepository, IndexRequestAndResponse) {
  EXPECT_FALSE(decode_repository_index_ready(""));
  EXPECT_FALSE(decode_repository_index_ready(" \n"));
  EXPECT_FALSE(decode_repository_index_ready("{}"));
  EXPECT_FALSE(decode_repository_index_ready(R"({"ready":false})"));
  EXPECT_TRUE(decode_repository_index_ready(R"({"ready":true})"));
  auto message = [](const std::string& body) {
    try {
      decode_repository_index_ready(body);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(R"({"ready":1})"), "repository index 'ready' must be true or false");
  EXPECT_EQ(message("[]"), "repository index request must be a JSON object");
  EXPECT_EQ(message("{"), "repository index request is not valid JSON: parse error at line 1, "
                          "column 2: syntax error while parsing object key - unexpected end of "
                          "input; expected string literal");

  std::vector<RepositoryEntry> entries = {{"digits", "1", "READY", ""},
                                          {"broken", "", "UNAVAILABLE", "bad config"}};
  EXPECT_EQ(encode_repository_index(entries, false),
            R"([{"name":"digits","version":"1","state":"READY","reason":""},)"
            R"({"name":"broken","version":"","state":"UNAVAILABLE","reason":"bad config"}])");
  EXPECT_EQ(encode_repository_index(entries, true),
            R"([{"name":"digits","version":"1","state":"READY","reason":""}])");
  EXPECT_EQ(encode_repository_index({}, false), "[]");
}

}  // namespace
}  // namespace slim::serve
