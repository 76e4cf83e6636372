#!/usr/bin/env bash
# Checks that qemu-x86_64 refuses what each emulated CPU lacks, so that the emulation
# tests (tests/CMakeLists.txt) would catch an AVX-512 or AVX2 instruction run where the
# CPU has none: under -cpu max and Haswell (AVX2, no AVX-512) an AVX-512 instruction must
# raise SIGILL while AVX2 runs; under qemu64 (SSE only) AVX2 must raise SIGILL; and
# slim's CPU probe must report avx2 and scalar there.
# usage: check_emulator.sh QEMU PROBE
set -u
qemu=$1 probe=$2
fail=0
expect() {  # expect CPU WHAT RC [OUTPUT]
  local out rc
  out=$("$qemu" -cpu "$1" "$probe" "$2" 2>/dev/null)
  rc=$?
  if [ "$rc" != "$3" ] || { [ $# -eq 4 ] && [ "$out" != "$4" ]; }; then
    echo "FAIL: -cpu $1: slim_isa_probe $2 gave exit $rc '$out', expected exit $3 ${4:+'$4'}"
    fail=1
  else
    echo "ok: -cpu $1: slim_isa_probe $2 -> exit $rc${4:+ '$out'}"
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
exit $fail
