// Runs one instruction of the instruction set named on the command line and exits 0, or
// prints what core's CPU probe sees. The emulation tests run it under qemu-x86_64 with
// several CPU models to check that the emulator really refuses what a CPU lacks (SIGILL),
// so that a test passing there means the code under test never ran such an instruction.
#include <cstdio>
#include <cstring>

#include "slim/core/cpu_features.h"

#if defined(__x86_64__)
// Inline assembly, so that the compiler can neither fold the instruction away nor pick
// another one for it.
void run_avx2() { asm volatile("vpaddd %%ymm0, %%ymm0, %%ymm0" ::: "xmm0"); }
void run_avx512() { asm volatile("vpaddd %%zmm0, %%zmm0, %%zmm0" ::: "xmm0"); }
#endif

int main(int argc, char** argv) {
  if (argc != 2 || !std::strcmp(argv[1], "--help")) {
    std::printf("usage: slim_isa_probe avx2|avx512|report\n"
                "  avx2, avx512: execute one instruction of that set (SIGILL where the CPU lacks it)\n"
                "  report: print the level slim's CPU probe picks\n");
    return argc == 2 ? 0 : 2;
  }
  const char* what = argv[1];
  if (!std::strcmp(what, "report")) {
    std::printf("%s\n", slim::isa_name(slim::hardware_isa()));
    return 0;
  }
#if defined(__x86_64__)
  if (!std::strcmp(what, "avx2")) return run_avx2(), 0;
  if (!std::strcmp(what, "avx512")) return run_avx512(), 0;
#endif
  std::fprintf(stderr, "slim_isa_probe: unknown instruction set '%s'\n", what);
  return 2;
}
