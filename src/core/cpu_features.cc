#include "slim/core/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>

#include "slim/core/error.h"

#if defined(__x86_64__) && defined(__clang__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace slim {

namespace {

CpuFeatures probe() {
  CpuFeatures f;
#if defined(__x86_64__)
  // libgcc's probe also checks that the OS saves the YMM/ZMM state (XCR0).
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
#if defined(__clang__) && __clang_major__ < 15
  // clang 14's builtin does not know "f16c" (the fuzz builds use Debian's clang 14): read
  // CPUID leaf 1, ECX bit 29. F16C operates on YMM state, which the AVX check above covers.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  f.f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
#else
  f.f16c = __builtin_cpu_supports("f16c");
#endif
  f.popcnt = __builtin_cpu_supports("popcnt");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
#if defined(__linux__)
  std::ifstream gds("/sys/devices/system/cpu/vulnerabilities/gather_data_sampling");
  std::string state;
  f.slow_gathers = std::getline(gds, state) && state.rfind("Mitigation: Microcode", 0) == 0;
#endif
  // SLIM_SLOW_GATHERS=1 / 0 says otherwise (the gather-free paths' tests on any CPU).
  if (const char* env = std::getenv("SLIM_SLOW_GATHERS"); env && *env) f.slow_gathers = *env != '0';
#elif defined(__aarch64__)
  f.neon = true;
#if defined(__linux__)
  const unsigned long hw = getauxval(AT_HWCAP);
  f.dotprod = (hw & HWCAP_ASIMDDP) != 0;
  f.fp16 = (hw & HWCAP_ASIMDHP) != 0;
#endif
#endif
  return f;
}

// Position of a level in its architecture's order.
int rank(Isa level) {
  switch (level) {
    case Isa::scalar: return 0;
    case Isa::avx2: return 1;
    case Isa::avx512: return 2;
    case Isa::neon: return 1;
  }
  return 0;
}

bool hardware_runs(Isa level) {
  const CpuFeatures& f = cpu_features();
  switch (level) {
    case Isa::scalar: return true;
    case Isa::avx2: return f.avx2 && f.fma && f.f16c;
    case Isa::avx512: return hardware_runs(Isa::avx2) && f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl;
    case Isa::neon: return f.neon;
  }
  return false;
}

Isa checked_level(std::string_view name, const char* where) {
  const std::optional<Isa> level = parse_isa(name);
  if (!level)
    throw Error(ErrorCode::invalid_argument,
                std::string(where) + "'" + std::string(name) + "' is no instruction set; expected one of " + isa_names());
  if (!hardware_runs(*level))
    throw Error(ErrorCode::invalid_argument, std::string(where) + "this CPU cannot run " + isa_name(*level) +
                                                 " kernels (it runs up to " + isa_name(hardware_isa()) + ")");
  return *level;
}

constexpr int kUnset = -1;
std::atomic<int> g_limit{kUnset};  // an Isa value, or kUnset: SLIM_ISA not read yet

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = probe();
  return f;
}

Isa hardware_isa() {
  for (Isa level : {Isa::avx512, Isa::avx2, Isa::neon})
    if (hardware_runs(level)) return level;
  return Isa::scalar;
}

Isa active_isa() {
  int v = g_limit.load(std::memory_order_acquire);
  if (v == kUnset) {
    Isa level = hardware_isa();
    if (const char* env = std::getenv("SLIM_ISA"); env && *env) level = checked_level(env, "SLIM_ISA: ");
    int expected = kUnset;
    g_limit.compare_exchange_strong(expected, int(level), std::memory_order_acq_rel);
    v = g_limit.load(std::memory_order_acquire);
  }
  return Isa(v);
}

bool isa_enabled(Isa level) {
  if (!hardware_runs(level)) return false;
  const Isa active = active_isa();
  if (level == Isa::scalar) return true;
  // Levels of the other architecture never match (hardware_runs already said no).
  return rank(level) <= rank(active) && (active == Isa::neon) == (level == Isa::neon);
}

void set_isa_limit(std::string_view name) { set_isa_limit(checked_level(name, "--isa: ")); }

void set_isa_limit(Isa level) {
  if (!hardware_runs(level))
    throw Error(ErrorCode::invalid_argument, std::string("this CPU cannot run ") + isa_name(level) + " kernels");
  g_limit.store(int(level), std::memory_order_release);
}

const char* isa_name(Isa level) {
  switch (level) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::neon: return "neon";
  }
  return "scalar";
}

std::optional<Isa> parse_isa(std::string_view name) {
  for (Isa level : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::neon})
    if (name == isa_name(level)) return level;
  return std::nullopt;
}

std::string isa_names() {
#if defined(__aarch64__)
  return "scalar, neon";
#else
  return "scalar, avx2, avx512";
#endif
}

}  // namespace slim
