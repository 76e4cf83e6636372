// Throughput of the 16-row repacked tiles of every available kernel set (not a test):
// g++ -std=c++20 -O2 -Iinclude bench/llm/tile_bench.cc build/src/libslim_{llm,text,core}.a -lpthread
// ./a.out [N 2048] [ROWS 2048] [TOKENS 64] [TYPE e.g. Q8_0] [with-scalar]
// Prefill: 16-row groups of a ROWS x N matrix against 8 tokens at a time (the matmul's
// order: a group stays in cache while the tokens pass); decode: one token streaming the
// whole matrix from memory. Prints GMAC/s per kernel set and weight type, best of 5, in thread CPU time.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "slim/llm/kernels.h"
#include "slim/llm/ggml_types.h"

using namespace slim::llm;

// The thread's CPU time: on a shared machine, wall time counts the time others run.
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? atoll(argv[1]) : 2048, rows = argc > 2 ? atoll(argv[2]) : 2048;
  const int tokens = argc > 3 ? atoi(argv[3]) : 64;
  const std::string only = argc > 4 ? argv[4] : "";  // a weight type's name (Q8_0, ...), or all
  const bool with_scalar = argc > 5;                 // the scalar set too (slow)
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 0.2f);
  std::vector<float> wf(size_t(rows * n)), xf(size_t(tokens * n));
  for (float& v : wf) v = nd(rng);
  for (float& v : xf) v = nd(rng);
  for (const GgmlType type : {GgmlType::q4_0, GgmlType::q8_0, GgmlType::q4_k, GgmlType::f16}) {
    if ((type == GgmlType::q4_k && n % 256) || (!only.empty() && only != ggml_type_name(uint32_t(type)))) continue;
    const int64_t wb = ggml_row_bytes(type, n);
    std::vector<uint8_t> w(size_t(rows * wb));
    for (int64_t r = 0; r < rows; ++r) quantize_row(type, wf.data() + r * n, w.data() + r * wb, n);
    for (int64_t r = 0; r < rows; r += 16) repack_x16(type, w.data() + r * wb, n);
    const ActType at = act_type_for(type);
    const int64_t xb = act_row_bytes(at, n);
    for (const KernelSet* k : available_kernel_sets()) {
      const Tile16Fn tile = tile16_fn(*k, type);
      if (!tile || (k == &scalar_kernels() && !with_scalar)) continue;
      std::vector<uint8_t> x(size_t(tokens * xb));
      for (int t = 0; t < tokens; ++t) quantize_act_row(*k, at, xf.data() + t * n, x.data() + t * xb, n);
      std::vector<float> y(size_t(tokens * rows));
      auto time = [&](int nt_total) {
        double best = 1e30;
        for (int rep = 0; rep < 5; ++rep) {
          const double t0 = cpu_seconds();
          for (int64_t r = 0; r < rows; r += 16)
            for (int t = 0; t < nt_total; t += 8)
              tile(n, w.data() + r * wb, 16, x.data() + t * xb, xb, std::min(8, nt_total - t), y.data() + t * rows + r,
                   rows);
          best = std::min(best, cpu_seconds() - t0);
        }
        return double(rows) * n * nt_total / best * 1e-9;
      };
      const double pre = time(tokens), dec = time(1);
      std::printf("%-11s %-5s n %5lld rows %5lld: prefill %6.1f GMAC/s, decode %6.1f GMAC/s\n", k->isa,
                  ggml_type_name(uint32_t(type)).c_str(), (long long)n, (long long)rows, pre, dec);
    }
  }
}
