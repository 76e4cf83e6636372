// The one CPU-feature probe of the project: what the processor can run, read once
// (cpuid on x86-64, getauxval(AT_HWCAP) on aarch64), and the instruction-set level every
// module picks its kernel set from. SLIM_ISA (or set_isa_limit, the CLI's --isa) lowers
// that level, so the fallbacks run and are tested on any machine.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace slim {

// Kernel-set levels. On x86-64 they are ordered scalar < avx2 < avx512; on aarch64
// scalar < neon. avx2 means AVX2 + FMA + F16C (Haswell, Zen 1 and later); avx512 means
// AVX-512 F, BW, DQ and VL on top of it (Skylake-SP, Zen 4 and later).
enum class Isa { scalar, avx2, avx512, neon };

struct CpuFeatures {
  // x86-64
  bool avx2 = false, fma = false, f16c = false, popcnt = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false, avx512vnni = false;
  // Intel's microcode mitigation of Gather Data Sampling is on (Skylake to Tiger Lake; Linux
  // reports it in sysfs): vpgatherdd runs several times slower, so kernels that have a
  // gather-free way take it. SLIM_SLOW_GATHERS=1 or 0 overrides the probe.
  bool slow_gathers = false;
  // aarch64 (ASIMD is part of the base architecture, so neon is true on every aarch64 CPU)
  bool neon = false, dotprod = false, fp16 = false;
};

// What the hardware reports (and the OS has enabled), probed on first use.
const CpuFeatures& cpu_features();
// The highest level the hardware runs.
Isa hardware_isa();
// The level kernels use now: the hardware's, lowered by SLIM_ISA or set_isa_limit.
// Throws Error(invalid_argument) on the first call when SLIM_ISA names no level or
// one this CPU cannot run.
Isa active_isa();
// True when kernels of `level` may run: the CPU has it and the limit allows it.
bool isa_enabled(Isa level);
// Lowers (or restores, up to the hardware's) the level, by name. Throws
// Error(invalid_argument) for an unknown name or a level this CPU lacks.
void set_isa_limit(std::string_view name);
void set_isa_limit(Isa level);

const char* isa_name(Isa level);
std::optional<Isa> parse_isa(std::string_view name);
// The levels this build knows for this architecture, lowest first ("scalar, avx2, avx512").
std::string isa_names();

}  // namespace slim
