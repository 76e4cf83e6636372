// Dot-product kernels over GGML blocks and the activation formats they pair with. One
// implementation per ISA (scalar; AVX2, AVX-512 VNNI on x86-64; NEON, NEON+dotprod on
// aarch64), picked at run time from core's CPU probe (cpu_features.h), so one binary runs
// everywhere.
#pragma once

#include <cstdint>
#include <vector>

#include "slim/llm/ggml_types.h"

namespace slim::llm {

// The format activations are converted to before a dot product with a weight type:
// the same pairing ggml uses, so results track llama.cpp's. A q8_0 row is BlockQ8_0
// blocks followed by space for an unpacked copy of them that kernel sets with Q8_0/Q4_0
// tiles fill in (quantize_act_row) and read, then by one Q8Aux per block (every kernel
// set fills it in; the repacked Q8_0/Q4_0 tiles read it); likewise an f16 row is followed by
// room for its f32 copy, which F16 tiles read. The dot functions read the blocks or the f16 row
// only; the tile functions need rows converted by quantize_act_row of their own kernel set.
enum class ActType { f32, f16, bf16, q8_0, q8_k };

ActType act_type_for(GgmlType weight);
// Bytes of one converted row of n values.
int64_t act_row_bytes(ActType type, int64_t n);
// The widest of them (activation buffers hold any format).
int64_t max_act_row_bytes(int64_t n);
// Where an f16 activation row's f32 copy starts (see KernelSet::widen_f16).
int64_t f16_copy_offset(int64_t n);

// Per Q8_0 activation block: its scale as f32 and the sum of its codes, which corrects
// the dot products of the repacked tiles for their unsigned weight codes.
struct Q8Aux {
  float d;
  int32_t sum;
};
// Where the Q8Aux array of a q8_0 activation row of n values starts.
int64_t q8_0_aux_offset(int64_t n);

// F16, Q8_0, Q4_0, Q4_K and Q6_K weights repacked 16 rows at a time, for tiles that keep one row
// per 32-bit lane (KernelSet::tile_f16x16 / tile_q8_0x16 / tile_q4_0x16 / tile_q4_kx16 / tile_q6_kx16).
// F16: column c is the 16 rows' values (row r at 16c + r). Per column of blocks b: the 16 rows' f16
// scales (32 bytes), then their codes as 64-byte vectors, vector k holding bytes
// 4k..4k+3 of every row's codes (row r at bytes 4r..4r+3): eight vectors of Q8_0 codes
// offset by 128 (unsigned), four of Q4_0 code bytes (two 4-bit codes each). A column is
// exactly the size of the 16 GGUF blocks it replaces, so a matrix is repacked in place,
// 16 rows of n values at a time. Q4_K columns hold 16 super-blocks: the rows' d, dmin,
// their 12 scale bytes byte-major, then 32 code vectors (2,304 bytes); Q6_K columns the
// rows' d, their 16 scales byte-major, 32 ql and 16 qh vectors (3,360 bytes). K-quant tiles
// read Q8_K activations, F16 tiles f16 ones (their f32 copy); the others read Q8_0.
bool repackable_x16(GgmlType type);
void repack_x16(GgmlType type, uint8_t* rows16, int64_t n);

// Dot product of n weights (a row of the weight's type) with n activations.
using DotFn = float (*)(int64_t n, const void* w, const void* x);

// y[t * ldy + r] = dot(weight row r, activation row t) for a tile of nr <= 4 weight rows
// (stride ws bytes) and nt <= 4 activation rows (stride xs bytes); results are identical
// to the single dot of the same kernel set.
using TileFn = void (*)(int64_t n, const uint8_t* w, int64_t ws, int nr, const uint8_t* x, int64_t xs, int nt,
                        float* y, int64_t ldy);

using Tile16Fn = void (*)(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, int nt, float* y,
                          int64_t ldy);

struct KernelSet {
  const char* isa;
  DotFn dot_f32, dot_f16, dot_bf16, dot_q8_0, dot_q4_0, dot_q4_k, dot_q6_k;
  void (*quantize_q8_0)(const float* x, void* dst, int64_t n);
  void (*quantize_q8_k)(const float* x, void* dst, int64_t n);
  // y[i] += a * f16(x[i])
  void (*axpy_f16)(int64_t n, float a, const uint16_t* x, float* y);
  void (*f32_to_f16_row)(const float* x, uint16_t* y, int64_t n);
  // The feed-forward gate: g[i] = silu(g[i]) * u[i].
  void (*silu_mul)(float* g, const float* u, int64_t n);
  // The first index of the largest of x[0..n) (n >= 1; NaNs are never the largest unless
  // all are NaN, then 0): greedy decoding's pick.
  int64_t (*argmax)(const float* x, int64_t n);
  TileFn tile_q8_0 = nullptr, tile_q4_0 = nullptr;  // where the ISA has a tiled kernel
  // Writes the tiles' copy of n values of Q8_0 blocks (see ActType); null where unused.
  void (*unpack_q8_0)(const void* blocks, void* dst, int64_t n) = nullptr;
  // Appends to an f16 activation row its values as f32 (at f16_copy_offset), which the
  // F16 tiles read; null where unused.
  void (*widen_f16)(const uint16_t* h, float* f, int64_t n) = nullptr;
  TileFn tile_f16 = nullptr;
  // y[t * ldy + r] for r < nr <= 16 and t < nt <= 8: a group of 16 repacked rows
  // (repack_x16) against activation rows of the type's ActType. Every (row, token) pair
  // adds float(block dot) x (weight scale x activation scale) block by block with one
  // fused multiply-add (Q4_K: a second one subtracts the mins term; F16: one FMA per
  // column into running sum c mod 3, then (s0 + s1) + s2), so results do not
  // depend on nt and the scalar set's version is the exact reference for the others.
  // Null where the set has none (the weights then stay in the GGUF layout).
  Tile16Fn tile_q8_0x16 = nullptr, tile_q4_0x16 = nullptr, tile_q4_kx16 = nullptr, tile_f16x16 = nullptr;
  // F16 only: two consecutive groups of 16 repacked rows (16 < nr <= 32) against nt <= 4
  // tokens, the same bits as tile_f16x16 on each group; for batches of 4 or more tokens.
  Tile16Fn tile_f16x32 = nullptr;
  // Q6_K (one FMA per block, as Q8_0); AVX-512 VNNI and scalar only.
  Tile16Fn tile_q6_kx16 = nullptr;
};

// The best set at core's active_isa() (the CPU's level, lowered by SLIM_ISA / --isa).
const KernelSet& kernels();
const KernelSet& scalar_kernels();       // for tests: the reference the others must match
// Every kernel set enabled at the active level, scalar first (for tests and benchmarks).
std::vector<const KernelSet*> available_kernel_sets();
DotFn dot_fn(const KernelSet& k, GgmlType weight);
// The tiled matmul kernel for a weight type, or nullptr where the set has none (then use
// dot_fn per row and token).
TileFn tile_fn(const KernelSet& k, GgmlType weight);
// The tile for repack_x16 weights of a type, or nullptr (then the weights stay as they are).
Tile16Fn tile16_fn(const KernelSet& k, GgmlType weight);
void quantize_act_row(const KernelSet& k, ActType type, const float* x, void* dst, int64_t n);

}  // namespace slim::llm
