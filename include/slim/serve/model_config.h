// ModelConfig: what slim reads from a model repository's config.pbtxt (Triton's
// model-configuration text format) or config.json (the same fields as JSON). Only the
// fields slim acts on are kept; any other field is a warning, not an error, so a
// repository written for Triton's ONNX Runtime backend loads unchanged.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "slim/core/dtype.h"

namespace slim::serve {

// Triton's data_type names ("TYPE_FP32") and the KServe v2 datatype names ("FP32").
// TYPE_STRING / BYTES have no slim dtype: parsing them throws `unsupported`; any other
// unknown name throws `invalid_argument`.
DType parse_triton_dtype(std::string_view name);
std::string triton_dtype_name(DType t);
DType parse_kserve_dtype(std::string_view name);
std::string_view kserve_dtype_name(DType t);

// One input or output. With max_batch_size > 0 `dims` leaves out the batch dimension
// (Triton's convention); -1 is a free dimension.
struct TensorConfig {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> dims;
  bool allow_ragged_batch = false;  // parsed, not acted on (warning)
  bool operator==(const TensorConfig&) const = default;
};

struct VersionPolicy {
  enum class Kind { latest, all, specific };
  Kind kind = Kind::latest;
  uint32_t latest_num_versions = 1;
  std::vector<int64_t> specific_versions;
  bool operator==(const VersionPolicy&) const = default;
};

struct QueuePolicy {
  enum class TimeoutAction { reject, delay };
  TimeoutAction timeout_action = TimeoutAction::reject;
  uint64_t default_timeout_microseconds = 0;  // 0: no timeout
  bool allow_timeout_override = false;
  uint32_t max_queue_size = 0;  // 0: unbounded (the server's own limit still applies)
  bool operator==(const QueuePolicy&) const = default;
};

struct DynamicBatchingConfig {
  std::vector<int64_t> preferred_batch_size;
  uint64_t max_queue_delay_microseconds = 0;
  bool preserve_ordering = false;
  // 0 means one level. Levels are 1..priority_levels, 1 the most urgent.
  uint32_t priority_levels = 0;
  // Level of requests that name none. Triton requires 1..priority_levels when there are
  // levels; the parser turns a missing one into the least urgent level, with a warning.
  uint32_t default_priority_level = 0;
  QueuePolicy default_queue_policy;
  std::map<uint32_t, QueuePolicy> priority_queue_policy;  // level -> policy
  bool operator==(const DynamicBatchingConfig&) const = default;
};

struct ModelConfig {
  std::string name;
  std::string platform;        // "onnxruntime_onnx", "slim_forest", ...
  std::string backend;         // "onnxruntime", "slim", ...
  int64_t max_batch_size = 0;  // 0: the model does not batch; dims are full shapes
  std::vector<TensorConfig> inputs;
  std::vector<TensorConfig> outputs;
  VersionPolicy version_policy;
  uint32_t instance_count = 1;  // sum of instance_group counts (KIND_CPU / KIND_AUTO)
  std::optional<DynamicBatchingConfig> dynamic_batching;
  std::string default_model_filename;  // "" : the file name from the model kind
  // Triton's `parameters` (string_value of each); language models read their options here.
  std::map<std::string, std::string> parameters;
  // Fields the parser saw but slim does not act on, and other non-fatal remarks, each a
  // full sentence naming the field and, in the text form, where it is
  // ("config.pbtxt:7:15: unknown field 'optimisation' ignored").
  std::vector<std::string> warnings;
  bool operator==(const ModelConfig&) const = default;
};

// Parse the text / JSON form. `origin` names the file in messages. A syntax error, a
// wrong value type, a value out of range or a contradiction (priority level above
// priority_levels, preferred size above max_batch_size, ...) throws `invalid_model`
// naming the origin, line and field (JSON: the field only); TYPE_STRING throws
// `unsupported`. Nesting is limited to 64 levels.
ModelConfig parse_model_config_pbtxt(std::string_view text, const std::string& origin);
ModelConfig parse_model_config_json(std::string_view text, const std::string& origin);

}  // namespace slim::serve
