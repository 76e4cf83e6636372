#!/usr/bin/env bash
# Checks that each emulated CPU of the emulation tests (tests/CMakeLists.txt) refuses
# what it lacks, so that they would catch an AVX-512 or AVX2 instruction run where the CPU
# has none: under qemu -cpu max and Haswell and under valgrind (AVX2, no AVX-512) an
# AVX-512 instruction must raise SIGILL while AVX2 runs; under qemu64 (SSE2) AVX2 must
# raise SIGILL; and slim's CPU probe must report avx2 and scalar there.
# usage: check_emulator.sh QEMU VALGRIND PROBE
set -u
qemu=$1 valgrind=$2 probe=$3
fail=0
expect() {  # expect CPU WHAT RC [OUTPUT]
  local out rc
  if [ "$1" = valgrind ]; then
    out=$("$valgrind" -q --tool=none "$probe" "$2" 2>/dev/null)
  else
    out=$("$qemu" -cpu "$1" "$probe" "$2" 2>/dev/null)
  fi
  rc=$?
  if [ "$rc" != "$3" ] || { [ $# -eq 4 ] && [ "$out" != "$4" ]; }; then
    echo "FAIL: $1: slim_isa_probe $2 gave exit $rc '$out', expected exit $3 ${4:+'$4'}"
    fail=1
  else
    echo "ok: $1: slim_isa_probe $2 -> exit $rc${4:+ '$out'}"
  fi
}
sigill=$((128 + 4))
expect max avx2 0
expect max avx512 $sigill
expect max report 0 avx2
expect Haswell avx2 0
expect Haswell avx512 $sigill
expect qemu64 avx2 $sigill
expect qemu64 report 0 scalar
expect valgrind avx2 0
expect valgrind avx512 $sigill
expect valgrind report 0 avx2
exit $fail
