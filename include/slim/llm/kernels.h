// Dot-product kernels over GGML blocks and the activation formats they pair with. One
// implementation per ISA (scalar, AVX2, AVX-512 VNNI), picked once at startup from what
// the CPU reports, so one binary runs everywhere.
#pragma once

#include <cstdint>
#include <vector>

#include "slim/llm/ggml_types.h"

namespace slim::llm {

// The format activations are converted to before a dot product with a weight type:
// the same pairing ggml uses, so results track llama.cpp's. A q8_0 row is BlockQ8_0
// blocks followed by space for an unpacked copy of them that kernel sets with Q8_0/Q4_0
// tiles fill in (quantize_act_row) and read; likewise an f16 row is followed by room for
// its f32 copy, which F16 tiles read. The dot functions read the blocks or the f16 row
// only; the tile functions need rows converted by quantize_act_row of their own kernel set.
enum class ActType { f32, f16, bf16, q8_0, q8_k };

ActType act_type_for(GgmlType weight);
// Bytes of one converted row of n values.
int64_t act_row_bytes(ActType type, int64_t n);
// The widest of them (activation buffers hold any format).
int64_t max_act_row_bytes(int64_t n);
// Where an f16 activation row's f32 copy starts (see KernelSet::widen_f16).
int64_t f16_copy_offset(int64_t n);

// Dot product of n weights (a row of the weight's type) with n activations.
using DotFn = float (*)(int64_t n, const void* w, const void* x);

// y[t * ldy + r] = dot(weight row r, activation row t) for a tile of nr <= 4 weight rows
// (stride ws bytes) and nt <= 4 activation rows (stride xs bytes); results are identical
// to the single dot of the same kernel set.
using TileFn = void (*)(int64_t n, const uint8_t* w, int64_t ws, int nr, const uint8_t* x, int64_t xs, int nt,
                        float* y, int64_t ldy);

struct KernelSet {
  const char* isa;
  DotFn dot_f32, dot_f16, dot_bf16, dot_q8_0, dot_q4_0, dot_q4_k, dot_q6_k;
  void (*quantize_q8_0)(const float* x, void* dst, int64_t n);
  void (*quantize_q8_k)(const float* x, void* dst, int64_t n);
  // y[i] += a * f16(x[i])
  void (*axpy_f16)(int64_t n, float a, const uint16_t* x, float* y);
  void (*f32_to_f16_row)(const float* x, uint16_t* y, int64_t n);
  TileFn tile_q8_0 = nullptr, tile_q4_0 = nullptr;  // where the ISA has a tiled kernel
  // Writes the tiles' copy of n values of Q8_0 blocks (see ActType); null where unused.
  void (*unpack_q8_0)(const void* blocks, void* dst, int64_t n) = nullptr;
  // Appends to an f16 activation row its values as f32 (at f16_copy_offset), which the
  // F16 tiles read; null where unused.
  void (*widen_f16)(const uint16_t* h, float* f, int64_t n) = nullptr;
  TileFn tile_f16 = nullptr;
};

const KernelSet& kernels();              // best for this CPU
const KernelSet& scalar_kernels();       // for tests: the reference the others must match
// Every kernel set this CPU can run, scalar first (for tests and benchmarks).
const std::vector<const KernelSet*>& available_kernel_sets();
DotFn dot_fn(const KernelSet& k, GgmlType weight);
// The tiled matmul kernel for a weight type, or nullptr where the set has none (then use
// dot_fn per row and token).
TileFn tile_fn(const KernelSet& k, GgmlType weight);
void quantize_act_row(const KernelSet& k, ActType type, const float* x, void* dst, int64_t n);

}  // namespace slim::llm
