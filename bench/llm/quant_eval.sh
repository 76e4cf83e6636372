#!/usr/bin/env bash
# Perplexity and KL divergence of each quantization type on the shared model, the evidence
# llama.cpp asks of a quantization type: quantizes slimlm-f16.gguf with `slim quantize`,
# then runs `slim perplexity --kl-base` (F16 as the base) on the held-out text.
# Usage: bench/llm/quant_eval.sh [SLIM_BINARY] [CHUNKS] [CTX] [THREADS]
# MODEL and TEXT override the shared model and text (default: ../shared/models beside the
# repository); SLIM_ISA=scalar|avx2|avx512|neon holds slim's kernels to a lower set.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
slim=${1:-$root/build/tools/slim}
chunks=${2:-40}
ctx=${3:-512}
threads=${4:-2}
model=${MODEL:-$root/../shared/models/slimlm-f16.gguf}
text=${TEXT:-$root/../shared/models/heldout-long.txt}
work=$root/bench/.work/quant_eval
mkdir -p "$work"
printf "%-8s %10s %12s %10s %10s\n" type "size MiB" perplexity "KL(F16||q)" "top-1 %"
out=$("$slim" perplexity "$model" -f "$text" --ctx "$ctx" --chunks "$chunks" --threads "$threads")
ppl=$(sed -n 's/^perplexity: //p' <<<"$out")
printf "%-8s %10.2f %12s %10s %10s\n" f16 "$(du -m "$model" | cut -f1)" "$ppl" 0 100
for t in q8_0 q6_k q4_k_m q4_k q4_0; do
  q=$work/slimlm-$t.gguf
  "$slim" quantize "$model" "$q" --type "$t" --threads "$threads" >"$work/quantize-$t.log"
  out=$("$slim" perplexity "$q" -f "$text" --ctx "$ctx" --chunks "$chunks" --threads "$threads" --kl-base "$model")
  ppl=$(sed -n 's/^perplexity: //p' <<<"$out")
  kl=$(sed -n 's/^mean KL(base || model): //p' <<<"$out")
  top1=$(sed -n 's/^top-1 agreement: //p' <<<"$out")
  size=$(stat -c %s "$q")
  printf "%-8s %10.2f %12s %10s %10s\n" "$t" "$(echo "$size / 1048576" | bc -l)" "$ppl" "$kl" "${top1%\%}"
done
echo "(held-out text, $chunks chunks of $ctx tokens, second half of each chunk scored; slim kernels: ${SLIM_ISA:-the CPU's best})"
