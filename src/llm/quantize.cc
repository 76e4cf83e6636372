#include "slim/llm/quantize.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "slim/core/error.h"
#include "slim/core/thread_pool.h"
#include "slim/llm/gguf.h"

namespace slim::llm {

QuantScheme parse_quant_scheme(const std::string& name) {
  if (name == "q8_0") return QuantScheme::q8_0;
  if (name == "q4_0") return QuantScheme::q4_0;
  if (name == "q4_k") return QuantScheme::q4_k;
  if (name == "q6_k") return QuantScheme::q6_k;
  if (name == "q4_k_m") return QuantScheme::q4_k_m;
  throw Error(ErrorCode::invalid_argument, "unknown quantization type '" + name + "' (q8_0, q4_0, q4_k, q6_k, q4_k_m)");
}

const char* quant_scheme_name(QuantScheme s) {
  switch (s) {
    case QuantScheme::q8_0: return "q8_0";
    case QuantScheme::q4_0: return "q4_0";
    case QuantScheme::q4_k: return "q4_k";
    case QuantScheme::q6_k: return "q6_k";
    case QuantScheme::q4_k_m: return "q4_k_m";
  }
  return "?";
}

namespace {

// llama_ftype values for general.file_type.
uint32_t file_type_of(QuantScheme s) {
  switch (s) {
    case QuantScheme::q8_0: return 7;
    case QuantScheme::q4_0: return 2;
    case QuantScheme::q4_k: return 14;  // Q4_K_S: the closest named mix
    case QuantScheme::q6_k: return 18;
    case QuantScheme::q4_k_m: return 15;
  }
  return 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// llama-quantize gives these layers of attn_v and ffn_down more bits in *_M mixes: the
// first and last eighth of the network and every third layer between.
bool use_more_bits(int layer, int n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

}  // namespace

GgmlType quant_type_for(QuantScheme s, const std::string& name, int64_t row_len, int layer, int n_layer,
                        bool* fell_back) {
  GgmlType t = GgmlType::q8_0;
  switch (s) {
    case QuantScheme::q8_0: t = GgmlType::q8_0; break;
    case QuantScheme::q4_0: t = GgmlType::q4_0; break;
    case QuantScheme::q4_k: case QuantScheme::q4_k_m: t = GgmlType::q4_k; break;
    case QuantScheme::q6_k: t = GgmlType::q6_k; break;
  }
  if (name == "output.weight" && s != QuantScheme::q8_0) t = GgmlType::q6_k;
  if (s == QuantScheme::q4_k_m && layer >= 0 &&
      (ends_with(name, "attn_v.weight") || name.find(".ffn_down") != std::string::npos) && use_more_bits(layer, n_layer))
    t = GgmlType::q6_k;
  if (fell_back) *fell_back = false;
  // K-quants need rows of whole 256-element super-blocks. llama.cpp falls back to Q5_0 /
  // Q8_0 here; slim has no Q5_0, so Q4_K falls back to Q4_0 (same bits, coarser scales).
  if ((t == GgmlType::q4_k || t == GgmlType::q6_k) && row_len % kQk != 0) {
    t = t == GgmlType::q4_k ? GgmlType::q4_0 : GgmlType::q8_0;
    if (fell_back) *fell_back = true;
  }
  if (row_len % 32 != 0) t = GgmlType::f16;  // no block type fits; keep it 16-bit
  return t;
}

QuantizeReport quantize_model(const std::string& in_path, const std::string& out_path, QuantScheme scheme,
                              int threads, const std::function<void(int64_t, int64_t)>& progress) {
  auto in = GgufFile::open(in_path);
  const std::string arch = in->get_string("general.architecture");
  const int n_layer = int(in->get_int(arch + ".block_count", 0));
  GgufWriter w;
  for (const std::string& key : in->metadata_order()) {
    if (key == "general.alignment" || key == "general.file_type" || key == "general.quantization_version") continue;
    w.copy_value(key, *in, in->metadata().at(key));
  }
  w.set_u32("general.quantization_version", 2);
  w.set_u32("general.file_type", file_type_of(scheme));

  ThreadPool pool(threads);
  QuantizeReport rep;
  const int64_t total = int64_t(in->tensors().size());
  int64_t done = 0;
  for (const GgufTensorInfo& t : in->tensors()) {
    rep.bytes_in += int64_t(t.size);
    const GgmlTypeInfo* src_info = ggml_type_info(t.type_id);
    // Matrices, and the 3-D tensors of a MoE layer's experts; llama.cpp's quantizer
    // keeps the routers (ffn_gate_inp) as they are, and so does this one.
    const bool is_weight = (t.dims.size() == 2 || t.dims.size() == 3) && ends_with(t.name, ".weight") &&
                           !ends_with(t.name, ".ffn_gate_inp.weight");
    if (!is_weight || !src_info->computable) {
      // Norms, biases, routers and anything slim cannot decode are copied unchanged.
      const uint8_t* p = in->tensor_data(t);
      w.add_tensor(t.name, t.type(), t.dims, std::vector<uint8_t>(p, p + t.size));
      rep.bytes_out += int64_t(t.size);
      rep.tensors_per_type[std::string(src_info->name)]++;
      if (progress) progress(++done, total);
      continue;
    }
    int layer = -1;
    if (t.name.rfind("blk.", 0) == 0) layer = std::atoi(t.name.c_str() + 4);
    bool fell_back = false;
    const GgmlType dst = quant_type_for(scheme, t.name, t.dims[0], layer, n_layer, &fell_back);
    rep.fallbacks += fell_back;
    const int64_t cols = t.dims[0], rows = t.rows();
    const int64_t src_row = ggml_row_bytes(t.type(), cols), dst_row = ggml_row_bytes(dst, cols);
    std::vector<uint8_t> out(size_t(dst_row * rows));
    const uint8_t* src = in->tensor_data(t);
    const int T = pool.num_threads();
    pool.parallel_for(T, [&](int64_t b, int64_t e) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t s = b; s < e; ++s)
        for (int64_t r = rows * s / T; r < rows * (s + 1) / T; ++r) {
          dequantize_row(t.type(), src + r * src_row, row.data(), cols);
          quantize_row(dst, row.data(), out.data() + r * dst_row, cols);
        }
    });
    rep.bytes_out += int64_t(out.size());
    rep.weights_quantized += rows * cols;
    rep.tensors_per_type[ggml_type_name(uint32_t(dst))]++;
    w.add_tensor(t.name, dst, t.dims, std::move(out));
    if (progress) progress(++done, total);
  }
  w.write(out_path);
  return rep;
}

}  // namespace slim::llm
