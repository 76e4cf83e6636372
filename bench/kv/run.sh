#!/bin/sh
# KV-cache measurements on the shared model: quality of each setting against the full F16
# cache (slim kv-eval), the passkey grid, and decode throughput / KV memory for many
# sequences (slim kv-bench). Usage: bench/kv/run.sh [OUT_DIR]; SLIM, MODEL, TEXT and
# THREADS override the defaults; PARTS=quality or PARTS=throughput runs one half; ISA
# (scalar, avx2, avx512, neon; default the CPU's best) holds slim's kernels to a lower set,
# and every table's header line says which set ran. Takes about an hour on 2 cores
# (throughput alone: about 30 minutes).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
SLIM=${SLIM:-$here/../../build/tools/slim}
MODEL=${MODEL:-$here/../../../shared/models/slimlm-f16.gguf}
TEXT=${TEXT:-$here/../../../shared/models/heldout-long.txt}
THREADS=${THREADS:-1}
ISA=${ISA:-${SLIM_ISA:-}}
PARTS=${PARTS:-all}
out=${1:-$here/results}
mkdir -p "$out"
run() {
  name=$1; shift; echo "== $name: slim $*"
  "$SLIM" "$@" --threads "$THREADS" ${ISA:+--isa "$ISA"} 2>&1 | tee "$out/$name.txt"
}

if [ "$PARTS" != throughput ]; then
# Quality: 2 chunks of 1,024 tokens (prefill 512, then 512 scored decode steps), text skipped
# past the first document's start; then the 25% budget over 3 x 16 chunks spread over the text.
run eval_types kv-eval "$MODEL" -f "$TEXT" --ctx 1024 --chunks 2 --skip 20000 --kv-type f16,q8,q4
run eval_policies kv-eval "$MODEL" -f "$TEXT" --ctx 1024 --chunks 2 --skip 20000 --policy all --budget 0.5,0.25
run eval_composed kv-eval "$MODEL" -f "$TEXT" --ctx 1024 --chunks 2 --skip 20000 --policy streaming,h2o,layered --budget 0.25 --kv-type q8,q4
for skip in 0 50000 100000; do
  run eval_wide_$skip kv-eval "$MODEL" -f "$TEXT" --ctx 1024 --chunks 16 --skip $skip --policy streaming,h2o,snapkv,layered --budget 0.25,0.5
done
run passkey kv-eval "$MODEL" --passkey --ctx 1024 --passkey-lengths 256,512,1024 --passkey-trials 2 --policy all --budget 0.25
fi
[ "$PARTS" = quality ] && exit 0

# The machine's bound on batching from the matmuls alone (ceiling.cc, built against the
# build directory's libraries).
echo "== ceiling: bench/kv/ceiling.sh"
bash "$here/ceiling.sh" "$(dirname "$(dirname "$SLIM")")" | tee "$out/ceiling.txt"
# Throughput: decode tokens/s over all sequences, KV peak, per setting (best of 4 timings).
run bench_policies kv-bench "$MODEL" -f "$TEXT" --seqs 1,8,32 --ctx 512,2048 --policy all --budget 0.5,0.25 --decode 64 --repeats 4
run bench_types kv-bench "$MODEL" -f "$TEXT" --seqs 1,8 --ctx 512,2048 --policy all --budget 0.5,0.25 --kv-type f16,q8,q4 --decode 64 --repeats 4
run bench_scheduler kv-bench "$MODEL" --scheduler --seqs 8 --ctx 64,512 --decode 256
# Batching, 8 sequences per step against one at a time, at 64 context too: there attention
# costs little, so the ratio shows what sharing the weight reads alone can give here.
run bench_batching kv-bench "$MODEL" -f "$TEXT" --seqs 1,8 --ctx 64,512,2048 --policy full,streaming,layered --budget 0.25 --decode 64 --repeats 4
# The same with both cores working.
(THREADS=2; run bench_batching_threads2 kv-bench "$MODEL" -f "$TEXT" --seqs 1,8 --ctx 64,512,2048 --policy full,streaming,layered --budget 0.25 --decode 64 --repeats 4)
(THREADS=2; run bench_scheduler_threads2 kv-bench "$MODEL" --scheduler --seqs 8 --ctx 64,512 --decode 256)
