// Weight quantization of GGUF models: every 2-D weight is re-encoded with ggml's reference
// quantizers and the file is written back as GGUF that llama.cpp loads. The per-tensor type
// choice follows llama-quantize (output matrix at Q6_K, Q4_K_M's extra bits for attn_v and
// ffn_down), so slim's files and llama.cpp's are comparable.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "slim/llm/ggml_types.h"

namespace slim::llm {

enum class QuantScheme { q8_0, q4_0, q4_k, q6_k, q4_k_m };

// Parses "q8_0", "q4_0", "q4_k", "q6_k", "q4_k_m"; throws invalid_argument otherwise.
QuantScheme parse_quant_scheme(const std::string& name);
const char* quant_scheme_name(QuantScheme s);

struct QuantizeReport {
  int64_t bytes_in = 0, bytes_out = 0;
  int64_t weights_quantized = 0;
  std::map<std::string, int> tensors_per_type;  // output type name -> tensor count
  int fallbacks = 0;  // K-quant tensors whose rows are not a multiple of 256
};

// The type a tensor gets under a scheme (exposed for tests). n_layer and layer (-1 when
// the tensor belongs to no block) drive Q4_K_M's choice of layers with more bits.
GgmlType quant_type_for(QuantScheme s, const std::string& name, int64_t row_len, int layer, int n_layer,
                        bool* fell_back = nullptr);

// Throws invalid_model/not_found for a bad input, invalid_argument when the output cannot
// be written. progress(done, total) is called per tensor.
QuantizeReport quantize_model(const std::string& in_path, const std::string& out_path, QuantScheme scheme,
                              int threads, const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace slim::llm
