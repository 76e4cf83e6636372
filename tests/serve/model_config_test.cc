#include "slim/serve/model_config.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "slim/core/error.h"

using namespace slim;
using namespace slim::serve;

namespace {

// A config in the style of Triton's ONNX Runtime examples (densenet_onnx), with every
// field slim reads and a few it only warns about.
constexpr const char* kDensenetPbtxt =
    R"cfg(# DenseNet from the ONNX model zoo
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size : 8
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape { shape: [ 1, 3, 224, 224 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape { shape: [ 1, 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
version_policy: { latest { num_versions: 2 } }
instance_group [
  { count: 2, kind: KIND_GPU, gpus: [ 0, 1 ] },
  { name: "cpu_group" count: 1 kind: KIND_CPU }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  preserve_ordering: true
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 50000 allow_timeout_override: true max_queue_size: 32 }
  priority_queue_policy { key: 1 value { max_queue_size: 8 } }
  priority_queue_policy [ { key: 3, value: { timeout_action: REJECT, default_timeout_microseconds: 1000 } } ]
}
default_model_filename: "densenet.onnx"
optimization { graph { level: -1 } execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }
parameters { key: "intra_op_thread_count" value: { string_value: "4" } }
model_warmup [ { name: "warm" batch_size: 1 inputs { key: "data_0" value: { data_type: TYPE_FP32 dims: [ 3, 224, 224 ] zero_data: true } } } ]
)cfg";

// The same config as Triton's JSON form writes it: int64 values as strings, enum values as
// strings, the map as an object keyed by level.
constexpr const char* kDensenetJson = R"js({
  "name": "densenet_onnx",
  "platform": "onnxruntime_onnx",
  "max_batch_size": 8,
  "input": [{"name": "data_0", "data_type": "TYPE_FP32", "format": "FORMAT_NCHW",
             "dims": ["3", "224", "224"], "reshape": {"shape": ["1", "3", "224", "224"]}}],
  "output": [{"name": "fc6_1", "data_type": "TYPE_FP32", "dims": ["1000"],
              "reshape": {"shape": ["1", "1000", "1", "1"]}, "label_filename": "densenet_labels.txt"}],
  "version_policy": {"latest": {"num_versions": 2}},
  "instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1]},
                     {"name": "cpu_group", "count": 1, "kind": "KIND_CPU"}],
  "dynamic_batching": {
    "preferred_batch_size": [4, 8],
    "max_queue_delay_microseconds": "100",
    "preserve_ordering": true,
    "priority_levels": "3",
    "default_priority_level": "2",
    "default_queue_policy": {"timeout_action": "DELAY", "default_timeout_microseconds": "50000",
                             "allow_timeout_override": true, "max_queue_size": 32},
    "priority_queue_policy": {"1": {"max_queue_size": 8},
                              "3": {"timeout_action": "REJECT", "default_timeout_microseconds": "1000"}}
  },
  "default_model_filename": "densenet.onnx",
  "optimization": {"graph": {"level": -1}},
  "parameters": {"intra_op_thread_count": {"string_value": "4"}},
  "model_warmup": [{"name": "warm", "batch_size": 1}],
  "sequence_batching": null
})js";

ModelConfig pbtxt(std::string_view text) {
  return parse_model_config_pbtxt(text, "config.pbtxt");
}
ModelConfig json(std::string_view text) {
  return parse_model_config_json(text, "config.json");
}

bool has_warning(const ModelConfig& c, std::string_view needle) {
  return std::any_of(c.warnings.begin(), c.warnings.end(),
                     [&](const std::string& w) { return w.find(needle) != std::string::npos; });
}

std::string all_warnings(const ModelConfig& c) {
  std::string s;
  for (const auto& w : c.warnings) s += w + "\n";
  return s;
}

// The message of the error parsing `text` throws, with its code.
template <typename Parse>
std::pair<ErrorCode, std::string> error_of(Parse parse, std::string_view text) {
  try {
    parse(text);
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  return {ErrorCode::internal, "<no error>"};
}

std::pair<ErrorCode, std::string> pbtxt_error(std::string_view text) {
  return error_of(pbtxt, text);
}
std::pair<ErrorCode, std::string> json_error(std::string_view text) {
  return error_of(json, text);
}

// A batching model around which the error cases vary one field.
std::string batched(const std::string& extra) {
  return "max_batch_size: 8\n"
         "input { name: \"x\" data_type: TYPE_FP32 dims: [ 4 ] }\n"
         "output { name: \"y\" data_type: TYPE_FP32 dims: [ 2 ] }\n" +
         extra;
}

TEST(ModelConfig, TritonOnnxRuntimeExample) {
  ModelConfig c = pbtxt(kDensenetPbtxt);
  EXPECT_EQ(c.name, "densenet_onnx");
  EXPECT_EQ(c.platform, "onnxruntime_onnx");
  EXPECT_EQ(c.backend, "");
  EXPECT_EQ(c.max_batch_size, 8);
  ASSERT_EQ(c.inputs.size(), 1u);
  EXPECT_EQ(c.inputs[0].name, "data_0");
  EXPECT_EQ(c.inputs[0].dtype, DType::f32);
  EXPECT_EQ(c.inputs[0].dims, (std::vector<int64_t>{3, 224, 224}));
  EXPECT_FALSE(c.inputs[0].allow_ragged_batch);
  ASSERT_EQ(c.outputs.size(), 1u);
  EXPECT_EQ(c.outputs[0].name, "fc6_1");
  EXPECT_EQ(c.outputs[0].dims, (std::vector<int64_t>{1000}));
  EXPECT_EQ(c.version_policy.kind, VersionPolicy::Kind::latest);
  EXPECT_EQ(c.version_policy.latest_num_versions, 2u);
  EXPECT_EQ(c.instance_count, 3u);
  EXPECT_EQ(c.default_model_filename, "densenet.onnx");

  ASSERT_TRUE(c.dynamic_batching);
  const DynamicBatchingConfig& b = *c.dynamic_batching;
  EXPECT_EQ(b.preferred_batch_size, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(b.max_queue_delay_microseconds, 100u);
  EXPECT_TRUE(b.preserve_ordering);
  EXPECT_EQ(b.priority_levels, 3u);
  EXPECT_EQ(b.default_priority_level, 2u);
  EXPECT_EQ(b.default_queue_policy.timeout_action, QueuePolicy::TimeoutAction::delay);
  EXPECT_EQ(b.default_queue_policy.default_timeout_microseconds, 50000u);
  EXPECT_TRUE(b.default_queue_policy.allow_timeout_override);
  EXPECT_EQ(b.default_queue_policy.max_queue_size, 32u);
  ASSERT_EQ(b.priority_queue_policy.size(), 2u);
  EXPECT_EQ(b.priority_queue_policy.at(1).max_queue_size, 8u);
  EXPECT_EQ(b.priority_queue_policy.at(1).timeout_action, QueuePolicy::TimeoutAction::reject);
  EXPECT_EQ(b.priority_queue_policy.at(3).default_timeout_microseconds, 1000u);
  EXPECT_FALSE(b.priority_queue_policy.at(3).allow_timeout_override);

  // Each field slim does not act on is named once, with where it is.
  const char* expected[] = {
      "config.pbtxt:9:13: field 'input[0].format' is not used by slim; ignored",
      "config.pbtxt:11:13: field 'input[0].reshape' is not used by slim (the tensor keeps the "
      "shape of 'dims'); ignored",
      "field 'output[0].reshape' is not used by slim",
      "config.pbtxt:20:21: field 'output[0].label_filename' is not used by slim (outputs carry no "
      "class labels); ignored",
      "config.pbtxt:25:21: 'instance_group[0].kind' is KIND_GPU: slim runs the instances on the "
      "CPU",
      "field 'instance_group[0].gpus' is not used by slim (instances run on the CPU); ignored",
      "config.pbtxt:39:14: field 'optimization' is not used by slim; ignored",
      "field 'model_warmup' is not used by slim; ignored",
  };
  for (const char* w : expected)
    EXPECT_TRUE(has_warning(c, w)) << w << "\nin:\n" << all_warnings(c);
  EXPECT_EQ(c.warnings.size(), std::size(expected)) << all_warnings(c);
  // Parameters are kept (language models read their options there).
  EXPECT_EQ(c.parameters, (std::map<std::string, std::string>{{"intra_op_thread_count", "4"}}));
}

TEST(ModelConfig, JsonGivesTheSameConfig) {
  ModelConfig from_text = pbtxt(kDensenetPbtxt);
  ModelConfig from_json = json(kDensenetJson);
  EXPECT_EQ(from_json.warnings.size(), from_text.warnings.size()) << all_warnings(from_json);
  EXPECT_TRUE(
      has_warning(from_json, "config.json: field 'optimization' is not used by slim; ignored"));
  from_text.warnings.clear();
  from_json.warnings.clear();
  EXPECT_EQ(from_json, from_text);
}

TEST(ModelConfig, LeadFixtureDigitsConfig) {
  // tests/serve/make_repository.py writes this one; the server's tests rely on its values.
  ModelConfig c = pbtxt(R"cfg(name: "digits"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ { name: "pixels" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
dynamic_batching {
  preferred_batch_size: [ 8, 16, 32 ]
  max_queue_delay_microseconds: 2000
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy { max_queue_size: 256 }
  priority_queue_policy {
    key: 3
    value: { timeout_action: REJECT, default_timeout_microseconds: 5000000,
             allow_timeout_override: true, max_queue_size: 64 }
  }
}
)cfg");
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  ASSERT_TRUE(c.dynamic_batching);
  EXPECT_EQ(c.dynamic_batching->default_queue_policy.max_queue_size, 256u);
  EXPECT_EQ(c.dynamic_batching->priority_queue_policy.at(3).default_timeout_microseconds, 5000000u);
  EXPECT_EQ(c.dynamic_batching->priority_queue_policy.at(3).max_queue_size, 64u);
}

TEST(ModelConfig, Defaults) {
  ModelConfig c = pbtxt("  # nothing but a comment\n");
  EXPECT_EQ(c.max_batch_size, 0);
  EXPECT_TRUE(c.inputs.empty());
  EXPECT_EQ(c.instance_count, 1u);
  EXPECT_EQ(c.version_policy.kind, VersionPolicy::Kind::latest);
  EXPECT_EQ(c.version_policy.latest_num_versions, 1u);
  EXPECT_FALSE(c.dynamic_batching);
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(json("{}"), c);

  // An empty dynamic_batching block turns batching on with Triton's defaults.
  ModelConfig d = pbtxt(batched("dynamic_batching { }"));
  ASSERT_TRUE(d.dynamic_batching);
  EXPECT_EQ(*d.dynamic_batching, DynamicBatchingConfig{});
  EXPECT_EQ(*json(R"({"max_batch_size": 4, "dynamic_batching": {}})").dynamic_batching,
            DynamicBatchingConfig{});
}

TEST(ModelConfig, MissingDefaultPriorityLevelIsTheLeastUrgent) {
  ModelConfig c = pbtxt(batched("dynamic_batching { priority_levels: 4 }"));
  EXPECT_EQ(c.dynamic_batching->default_priority_level, 4u);
  EXPECT_TRUE(has_warning(
      c,
      "config.pbtxt:4:18: 'dynamic_batching.default_priority_level' is not set: requests "
      "without a priority get the least urgent level 4"))
      << all_warnings(c);
  ModelConfig zero =
      pbtxt(batched("dynamic_batching { priority_levels: 2 default_priority_level: 0 }"));
  EXPECT_EQ(zero.dynamic_batching->default_priority_level, 2u);
  EXPECT_EQ(zero.warnings.size(), 1u);
}

TEST(ModelConfig, VersionPoliciesAndInstanceGroups) {
  EXPECT_EQ(pbtxt("version_policy: { all { } }").version_policy.kind, VersionPolicy::Kind::all);
  VersionPolicy s =
      pbtxt("version_policy { specific { versions: [ 1, 3 ] versions: 7 } }").version_policy;
  EXPECT_EQ(s.kind, VersionPolicy::Kind::specific);
  EXPECT_EQ(s.specific_versions, (std::vector<int64_t>{1, 3, 7}));
  VersionPolicy j =
      json(R"({"version_policy": {"specific": {"versions": ["2", 5]}}})").version_policy;
  EXPECT_EQ(j.kind, VersionPolicy::Kind::specific);
  EXPECT_EQ(j.specific_versions, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(
      pbtxt("instance_group [ { count: 3 kind: KIND_AUTO }, { kind: KIND_CPU } ]").instance_count,
      4u);
  ModelConfig m = pbtxt("instance_group { kind: KIND_MODEL }");
  EXPECT_EQ(m.instance_count, 1u);
  EXPECT_TRUE(
      has_warning(m, "'instance_group[0].kind' is KIND_MODEL: slim runs the instances on the CPU"));
}

TEST(ModelConfig, TextFormatSyntax) {
  // <...> brackets, ':' before a message, ';' and ',' separators, lists of one, hex,
  // booleans in all of protobuf's spellings, strings with escapes and concatenation,
  // floats and negative numbers in ignored fields.
  ModelConfig c = pbtxt(R"cfg(
name: 'a\"b\n\x41\101\u00e9' "-tail";
max_batch_size: 0x10,
input < name: "x" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: True >
input: { name: "y", data_type: TYPE_BOOL, dims: -1 optional: t }
output [ { name: "z" data_type: TYPE_BF16 dims: 1 } ]
dynamic_batching: { preserve_ordering: 1 preferred_batch_size: 16 }
optimization { graph { level: -1 } priority: PRIORITY_MAX cuda { busy_wait_events: false } input_pinned_memory { enable: f } }
model_warmup { name: "w" inputs { key: "x" value { dims: [ 1 ] random_data: true } } batch_size: 2 }
parameters [ { key: "scale", value: { string_value: "1.5e-3" } } ]
response_cache { enable: false }
metric_tags: { key: "team" value: "vision" }
runtime: "model.py"
)cfg");
  EXPECT_EQ(c.name, "a\"b\nAA\xc3\xa9-tail");
  EXPECT_EQ(c.max_batch_size, 16);
  ASSERT_EQ(c.inputs.size(), 2u);
  EXPECT_EQ(c.inputs[0].dtype, DType::i64);
  EXPECT_TRUE(c.inputs[0].allow_ragged_batch);
  EXPECT_EQ(c.inputs[1].dtype, DType::boolean);
  EXPECT_EQ(c.outputs[0].dtype, DType::bf16);
  EXPECT_TRUE(c.dynamic_batching->preserve_ordering);
  EXPECT_EQ(c.dynamic_batching->preferred_batch_size, (std::vector<int64_t>{16}));
  EXPECT_EQ(c.parameters.at("scale"), "1.5e-3");
  EXPECT_TRUE(has_warning(c, "field 'input[0].allow_ragged_batch' is not acted on"));
  EXPECT_TRUE(has_warning(c, "config.pbtxt:5:62: field 'input[1].optional' is not used by slim"))
      << all_warnings(c);
  for (const char* f : {"response_cache", "metric_tags", "runtime"})
    EXPECT_TRUE(has_warning(c, "field '" + std::string(f) + "' is not used by slim; ignored")) << f;

  // Floats of every protobuf spelling pass in fields slim ignores.
  ModelConfig f = pbtxt("optimization { x: 1.5 y: -2e-3 z: .5 w: 1.0f v: -inf u: nan t: 1E+5 }");
  EXPECT_EQ(f.warnings.size(), 1u);
}

TEST(ModelConfig, UnknownFieldsAreWarnings) {
  ModelConfig c =
      pbtxt(batched("colour: RED\ninput { name: \"w\" data_type: TYPE_FP32 dims: 1 shape: [ 2 ] }\n"
                    "dynamic_batching { default_queue_policy { speed: 3 } }\n"
                    "instance_group { count: 1 colour: BLUE colour: GREEN }"));
  EXPECT_TRUE(has_warning(c, "config.pbtxt:4:9: unknown field 'colour' ignored"))
      << all_warnings(c);
  EXPECT_TRUE(has_warning(c, "unknown field 'input[1].shape' ignored"));
  EXPECT_TRUE(
      has_warning(c, "unknown field 'dynamic_batching.default_queue_policy.speed' ignored"));
  EXPECT_TRUE(has_warning(c, "unknown field 'instance_group[0].colour' ignored"));
  EXPECT_EQ(c.warnings.size(), 4u) << all_warnings(c);  // a repeated unknown field is named once
  EXPECT_TRUE(has_warning(
      json(
          R"({"colour": "red", "input": [{"name": "a", "data_type": "TYPE_FP32", "dims": [1], "x": 1}]})"),
      "config.json: unknown field 'input[0].x' ignored"));
}

TEST(ModelConfig, SyntaxErrorsNameLineAndColumn) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"name: \"abc", "config.pbtxt:1:7: string is not closed on its line"},
      {"name: \"a\nb\"", "config.pbtxt:1:7: string is not closed on its line"},
      {"name \"x\"", "config.pbtxt:1:6: expected ':' or '{' after field name 'name', found '\"'"},
      {"input {\n  name: \"x\"\n", "config.pbtxt:1:7: message is not closed with '}'"},
      {"input < name: \"x\" }", "config.pbtxt:1:19: expected a field name, found '}'"},
      {"dims: [ 1 2 ]", "config.pbtxt:1:11: expected ',' or ']' in the list of 'dims', found '2'"},
      {"dims: [ 1, ]", "config.pbtxt:1:12: expected a value for 'dims', found ']'"},
      {"x: 1.2.3", "config.pbtxt:1:4: malformed number '1.2.3'"},
      {"x: 0x", "config.pbtxt:1:4: malformed number '0x'"},
      {"x: -foo", "config.pbtxt:1:4: malformed number '-foo'"},
      {"x: \"\\q\"", "config.pbtxt:1:5: unknown escape '\\q' in string"},
      {"x: \"\\777\"", "config.pbtxt:1:5: octal escape above \\377"},
      {"x: \"\\ud800\"", "config.pbtxt:1:5: '\\u' escape is not a Unicode code point"},
      {"x: \"\\u12\"", "config.pbtxt:1:5: '\\u' needs 4 hex digits"},
      {"x: \"\\xff\"", "config.pbtxt:1:4: string is not valid UTF-8"},
      {"x: \"\xc3\" \"\xa9\" y: \"\xe0\x80\x80\"", "config.pbtxt:1:15: string is not valid UTF-8"},
      {"x: [ [ 1 ] ]", "config.pbtxt:1:6: expected a value for 'x', found '['"},
      {"\n\n  @", "config.pbtxt:3:3: expected a field name, found '@'"},
      {"x: \x01", "config.pbtxt:1:4: expected a value for 'x', found byte 0x01"},
      {"x:", "config.pbtxt:1:3: expected a value for 'x', found the end of the text"},
      {"x: 1 }", "config.pbtxt:1:6: expected a field name, found '}'"},
  };
  for (const Case& k : cases) {
    auto [code, message] = pbtxt_error(k.text);
    EXPECT_EQ(code, ErrorCode::invalid_model) << k.text;
    EXPECT_NE(message.find(k.message), std::string::npos) << k.text << "\n got: " << message;
  }
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += "a {";
  EXPECT_NE(pbtxt_error(deep).second.find("messages nested deeper than 64 levels"),
            std::string::npos);
  std::string deep_json = "{";
  for (int i = 0; i < 100; ++i) deep_json += "\"a\": {";
  deep_json += std::string(100, '}') + "}";
  EXPECT_NE(json_error(deep_json).second.find("objects nested deeper than 64 levels"),
            std::string::npos);
  EXPECT_NE(
      json_error("{\"name\": ")
          .second.find(
              "config.json: [json.exception.parse_error.101] parse error at line 1, column 10"),
      std::string::npos);
  EXPECT_NE(json_error(R"({"x": 1e999})")
                .second.find("config.json: [json.exception.out_of_range.406] number overflow"),
            std::string::npos);
  EXPECT_EQ(json_error("[1]").second, "config.json: the configuration is not a JSON object");
  EXPECT_EQ(json_error(R"({"dims": [[1]]})").second,
            "config.json: field 'dims': a list inside a list");
}

TEST(ModelConfig, ValueErrorsNameTheField) {
  struct Case {
    std::string text;
    std::string message;
    ErrorCode code = ErrorCode::invalid_model;
  };
  const Case cases[] = {
      {"max_batch_size: \"8\"",
       "config.pbtxt:1:17: field 'max_batch_size': expected an integer, found the string \"8\""},
      {"max_batch_size: 1.5", "field 'max_batch_size': expected an integer, found '1.5'"},
      {"max_batch_size: -1", "field 'max_batch_size': -1 is out of range (0 to 2147483647)"},
      {"max_batch_size: 2147483648", "field 'max_batch_size': 2147483648 is out of range"},
      {"max_batch_size: 99999999999999999999",
       "field 'max_batch_size': 99999999999999999999 is out of range"},
      {"max_batch_size: 1 max_batch_size: 2",
       "config.pbtxt:1:35: field 'max_batch_size': given more than once"},
      {"name: foo", "field 'name': expected a string, found 'foo'"},
      {"input: 3", "field 'input[0]': expected a message { ... }, found '3'"},
      {"dynamic_batching: { }",
       "config.pbtxt:1:19: field 'dynamic_batching': given with max_batch_size 0"},
      {batched("input { name: \"x\" data_type: TYPE_FP32 dims: 1 }"),
       "field 'input[1].name': two inputs named 'x'"},
      {batched("output { name: \"y\" data_type: TYPE_FP32 dims: 1 }"),
       "field 'output[1].name': two outputs named 'y'"},
      {"input { data_type: TYPE_FP32 dims: 1 }", "field 'input[0].name': an input without a name"},
      {"output { name: \"y\" dims: 1 }", "field 'output[0].data_type': 'y' has no data_type"},
      {"input { name: \"x\" data_type: TYPE_FP32 }",
       "field 'input[0].dims': 'x' has no dims; without batching"},
      {"input { name: \"x\" data_type: TYPE_FP32 dims: [ 2, -2 ] }",
       "field 'input[0].dims[1]': -2 is not a dimension"},
      {"input { name: \"x\" data_type: TYPE_FP32 dims: -9223372036854775808 }",
       "field 'input[0].dims[0]': -9223372036854775808 is not a dimension"},
      {"input { name: \"x\" data_type: TYPE_FP32 dims: -9223372036854775809 }",
       "field 'input[0].dims[0]': -9223372036854775809 is out of range (-9223372036854775808 to "
       "9223372036854775807)"},
      {"input { name: \"x\" data_type: TYPE_FP32 dims: 0x7fffffffffffffff dims: -0x2 }",
       "field 'input[0].dims[1]': -2 is not a dimension"},
      {"input { name: \"x\" data_type: TYPE_FP32 dims: [ 0 ] }",
       "field 'input[0].dims[0]': 0 is not a dimension"},
      {"input { name: \"x\" data_type: TYPE_FLOAT dims: 1 }",
       "field 'input[0].data_type': unknown Triton data type 'TYPE_FLOAT'"},
      {"input { name: \"x\" data_type: TYPE_STRING dims: 1 }",
       "field 'input[0].data_type': string tensors are not supported (TYPE_STRING)",
       ErrorCode::unsupported},
      {"input { name: \"x\" data_type: \"TYPE_FP32\" dims: 1 }",
       "field 'input[0].data_type': expected an enum value, found the string \"TYPE_FP32\""},
      {"input { name: \"x\" data_type: TYPE_FP32 dims: 1 format: FORMAT_NCWH }",
       "field 'input[0].format': unknown value 'FORMAT_NCWH' (expected one of FORMAT_NONE, "
       "FORMAT_NHWC, FORMAT_NCHW)"},
      {"input { name: \"x\" data_type: TYPE_FP32 dims: 1 allow_ragged_batch: yes }",
       "field 'input[0].allow_ragged_batch': expected true or false, found 'yes'"},
      {"version_policy { latest { num_versions: 0 } }",
       "field 'version_policy.latest.num_versions': 0 is out of range"},
      {"version_policy { latest { } all { } }",
       "field 'version_policy': takes only one of 'latest', 'all' and 'specific'"},
      {"version_policy { specific { } }",
       "field 'version_policy.specific.versions': no versions listed"},
      {"version_policy { specific { versions: 0 } }",
       "field 'version_policy.specific.versions[0]': 0 is out of range"},
      {"instance_group { count: 0 }",
       "field 'instance_group[0].count': 0 is out of range (1 to 2147483647)"},
      {"instance_group [ { }, { count: -2 } ]",
       "field 'instance_group[1].count': -2 is out of range"},
      {"instance_group { kind: KIND_TPU }",
       "field 'instance_group[0].kind': unknown value 'KIND_TPU'"},
      {batched("dynamic_batching { preferred_batch_size: [ 4, 16 ] }"),
       "field 'dynamic_batching.preferred_batch_size[1]': 16 is above max_batch_size 8"},
      {batched("dynamic_batching { preferred_batch_size: 0 }"),
       "field 'dynamic_batching.preferred_batch_size[0]': 0 is not a batch size (>= 1)"},
      {batched("dynamic_batching { priority_levels: 2 default_priority_level: 3 }"),
       "config.pbtxt:4:63: field 'dynamic_batching.default_priority_level': 3 is above "
       "priority_levels 2"},
      {batched("dynamic_batching { default_priority_level: 1 }"),
       "field 'dynamic_batching.default_priority_level': 1 is above priority_levels 0"},
      {batched(
           "dynamic_batching { priority_levels: 2 priority_queue_policy { key: 3 value { } } }"),
       "field 'dynamic_batching.priority_queue_policy[0].key': level 3 is not among the priority "
       "levels 1..2"},
      {batched("dynamic_batching { priority_levels: 2 priority_queue_policy { key: 0 } }"),
       "field 'dynamic_batching.priority_queue_policy[0].key': level 0 is not among the priority "
       "levels 1..2"},
      {batched("dynamic_batching { priority_levels: 2 priority_queue_policy { value { } } }"),
       "field 'dynamic_batching.priority_queue_policy[0].key': a map entry without a key"},
      {batched("dynamic_batching { priority_levels: 2 priority_queue_policy [ { key: 1 }, { key: 1 "
               "} ] }"),
       "field 'dynamic_batching.priority_queue_policy[1].key': level 1 has two policies"},
      {batched("dynamic_batching { default_queue_policy { timeout_action: WAIT } }"),
       "field 'dynamic_batching.default_queue_policy.timeout_action': unknown value 'WAIT' "
       "(expected one of REJECT, DELAY)"},
      {batched("dynamic_batching { default_queue_policy { max_queue_size: 4294967296 } }"),
       "field 'dynamic_batching.default_queue_policy.max_queue_size': 4294967296 is out of range "
       "(0 to 4294967295)"},
      {batched("dynamic_batching { max_queue_delay_microseconds: -5 }"),
       "field 'dynamic_batching.max_queue_delay_microseconds': -5 is out of range"},
      {batched("dynamic_batching { } sequence_batching { }"),
       "field 'sequence_batching': given with 'dynamic_batching': a model has one scheduler"},
  };
  for (const Case& k : cases) {
    auto [code, message] = pbtxt_error(k.text);
    EXPECT_EQ(code, k.code) << k.text << "\n got: " << message;
    EXPECT_NE(message.find(k.message), std::string::npos) << k.text << "\n got: " << message;
  }
}

TEST(ModelConfig, JsonValueErrors) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {R"({"max_batch_size": "eight"})",
       "config.json: field 'max_batch_size': expected an integer, found the string \"eight\""},
      {R"({"max_batch_size": true})", "field 'max_batch_size': expected an integer, found 'true'"},
      {R"({"max_batch_size": 8.0})", "field 'max_batch_size': expected an integer, found '8.0'"},
      {R"({"max_batch_size": 18446744073709551615})",
       "field 'max_batch_size': 18446744073709551615 is out of range"},
      {R"({"max_batch_size": [1, 2]})", "field 'max_batch_size': given more than once"},
      {R"({"name": 7})", "field 'name': expected a string, found '7'"},
      {R"({"input": [{"name": "x", "data_type": 11, "dims": [1]}]})",
       "field 'input[0].data_type': expected an enum value, found '11'"},
      {R"({"instance_group": [{"count": 1, "kind": "KIND_CPU", "passive": "yes"}], "dynamic_batching": {"preserve_ordering": 1}})",
       "field 'dynamic_batching': given with max_batch_size 0"},
      {R"({"max_batch_size": 2, "dynamic_batching": {"preserve_ordering": 1}})",
       "field 'dynamic_batching.preserve_ordering': expected true or false, found '1'"},
      {R"({"max_batch_size": 2, "dynamic_batching": {"priority_levels": 2, "priority_queue_policy": {"3": {}}}})",
       "field 'dynamic_batching.priority_queue_policy.3': level 3 is not among the priority levels "
       "1..2"},
      {R"({"max_batch_size": 2, "dynamic_batching": {"priority_levels": 2, "priority_queue_policy": {"high": {}}}})",
       "field 'dynamic_batching.priority_queue_policy.high': expected an integer, found 'high'"},
  };
  for (const Case& k : cases) {
    auto [code, message] = json_error(k.text);
    EXPECT_EQ(code, ErrorCode::invalid_model) << k.text;
    EXPECT_NE(message.find(k.message), std::string::npos) << k.text << "\n got: " << message;
  }
}

TEST(ModelConfig, DTypeNames) {
  const std::pair<DType, const char*> names[] = {
      {DType::boolean, "BOOL"}, {DType::u8, "UINT8"},   {DType::u16, "UINT16"},
      {DType::u32, "UINT32"},   {DType::u64, "UINT64"}, {DType::i8, "INT8"},
      {DType::i16, "INT16"},    {DType::i32, "INT32"},  {DType::i64, "INT64"},
      {DType::f16, "FP16"},     {DType::f32, "FP32"},   {DType::f64, "FP64"},
      {DType::bf16, "BF16"},
  };
  static_assert(std::size(names) == kNumDTypes);
  for (auto [t, kserve] : names) {
    EXPECT_EQ(kserve_dtype_name(t), kserve);
    EXPECT_EQ(triton_dtype_name(t), std::string("TYPE_") + kserve);
    EXPECT_EQ(parse_kserve_dtype(kserve), t);
    EXPECT_EQ(parse_triton_dtype(std::string("TYPE_") + kserve), t);
  }
  auto code_of = [](auto parse, const char* name) {
    try {
      parse(name);
    } catch (const Error& e) {
      return std::make_pair(e.code(), std::string(e.what()));
    }
    return std::make_pair(ErrorCode::internal, std::string());
  };
  EXPECT_EQ(code_of(parse_triton_dtype, "TYPE_STRING"),
            std::make_pair(ErrorCode::unsupported,
                           std::string("string tensors are not supported (TYPE_STRING)")));
  EXPECT_EQ(code_of(parse_kserve_dtype, "BYTES"),
            std::make_pair(ErrorCode::unsupported,
                           std::string("string tensors are not supported (BYTES)")));
  EXPECT_EQ(
      code_of(parse_triton_dtype, "FP32"),
      std::make_pair(ErrorCode::invalid_argument, std::string("unknown Triton data type 'FP32'")));
  EXPECT_EQ(code_of(parse_kserve_dtype, "TYPE_FP32"),
            std::make_pair(ErrorCode::invalid_argument,
                           std::string("unknown KServe datatype 'TYPE_FP32'")));
}

}  // namespace
