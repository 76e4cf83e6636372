#!/usr/bin/env bash
# Sign/verify throughput of `slim sign` and `slim verify` against `sha256sum` on the same
# generated model directory (default 1 GiB in 8 files), measured in the same run.
#
#   bench/trust/run.sh [BUILD_DIR]      env: SIZE_MB=1024 FILES=8 REPEATS=3 KEYALG=ecdsa-p256
#
# The files are read once before timing so every tool hashes from the page cache: the
# comparison is of hashing and I/O-path cost, not of disk speed. sha256sum is one
# process on one core; slim hashes several files at once on its thread pool, so the
# script also reports slim with --threads 1 for a like-for-like single-core figure.
set -euo pipefail

BUILD=${1:-build}
SLIM=$(realpath "${SLIM:-$BUILD/tools/slim}")
SIZE_MB=${SIZE_MB:-1024}
FILES=${FILES:-8}
REPEATS=${REPEATS:-3}
KEYALG=${KEYALG:-ecdsa-p256}
[ -x "$SLIM" ] || { echo "no slim binary at $SLIM (build the 'slim' target first)" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/slim-trust-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
MODEL="$WORK/model"
mkdir -p "$MODEL/weights"
per_file=$((SIZE_MB / FILES))
echo "generating $FILES files x ${per_file} MiB in $MODEL ..."
for i in $(seq 1 "$FILES"); do
  head -c "$((per_file * 1024 * 1024))" /dev/urandom > "$MODEL/weights/shard_$i.bin"
done
echo '{"name": "bench"}' > "$MODEL/config.json"
cat "$MODEL"/weights/* > /dev/null  # warm the page cache for every tool alike
"$SLIM" keygen --alg "$KEYALG" -o "$WORK/key.pem" > /dev/null

now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
time_cmd() {  # prints the median wall time of REPEATS runs of "$@"
  for _ in $(seq 1 "$REPEATS"); do
    local t0 t1
    t0=$(now)
    "$@" > /dev/null
    t1=$(now)
    awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.6f\n", b - a}'
  done | median
}

bytes=$(du -sb "$MODEL" | cut -f1)
t_sha=$(time_cmd bash -c "cd '$MODEL' && find . -type f ! -name model.sig -print0 | sort -z | xargs -0 sha256sum")
t_sign=$(time_cmd "$SLIM" sign "$MODEL" --key "$WORK/key.pem")
t_verify=$(time_cmd "$SLIM" verify "$MODEL" --pub "$WORK/key.pem.pub")
t_sign1=$(time_cmd "$SLIM" sign "$MODEL" --key "$WORK/key.pem" --threads 1)
t_verify1=$(time_cmd "$SLIM" verify "$MODEL" --pub "$WORK/key.pem.pub" --threads 1)

mbps() { awk -v b="$bytes" -v t="$1" 'BEGIN {printf "%.0f", b / t / 1e6}'; }
ratio() { awk -v s="$t_sha" -v t="$1" 'BEGIN {printf "%.2f", s / t}'; }
echo
echo "model: $((bytes / 1048576)) MiB in $FILES files, key $KEYALG, $(nproc) cores, median of $REPEATS"
printf '%-34s %8s s %6s MB/s   ratio vs sha256sum\n' tool median throughput
printf '%-34s %8.3f s %6s MB/s   1.00\n' "sha256sum (1 process)" "$t_sha" "$(mbps "$t_sha")"
printf '%-34s %8.3f s %6s MB/s   %s\n' "slim sign (thread pool)" "$t_sign" "$(mbps "$t_sign")" "$(ratio "$t_sign")"
printf '%-34s %8.3f s %6s MB/s   %s\n' "slim verify (thread pool)" "$t_verify" "$(mbps "$t_verify")" "$(ratio "$t_verify")"
printf '%-34s %8.3f s %6s MB/s   %s\n' "slim sign --threads 1" "$t_sign1" "$(mbps "$t_sign1")" "$(ratio "$t_sign1")"
printf '%-34s %8.3f s %6s MB/s   %s\n' "slim verify --threads 1" "$t_verify1" "$(mbps "$t_verify1")" "$(ratio "$t_verify1")"
echo "(ratio = sha256sum time / slim time; >= 0.80 is the issue's bar)"
