#!/usr/bin/env bash
# The seed-shape forward's eager rescale: the forward suite, three sanitizers on it (in parallel,
# capped), then the seed rows against the base bundle and SDPA (scripts/device_run.sh).
set -u
python3 .pack/dedupe_pack.py unpack .pack/bundle.dd.tgz /tmp/new >/dev/null || { echo "unpack failed"; exit 1; }
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; [print(os.path.join(p, q, "lib")) for p in nvidia.__path__ for q in os.listdir(p)]' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
mkdir -p "$OUT/san"
for tool in memcheck racecheck synccheck; do
  ( s=$(date +%s); RGK_SANITIZE=1 RGK_SANITIZE_TOOL=$tool RGK_FUZZ_CASES=3 timeout 50 compute-sanitizer --tool $tool --print-limit 50 --error-exitcode 99 --target-processes all /tmp/new/bundle/tests/gpu_attention --test-threads=1 > "$OUT/san/$tool.log" 2>&1; echo "$tool gpu_attention rc=$? $(( $(date +%s) - s )) s" >> "$OUT/san/summary.txt" ) &
done
wait
cat "$OUT/san/summary.txt"
TESTS=gpu_attention T_TEST=60 RGK_BENCH_FAMILIES=attention BENCH='^attn_fwd/(f16|bf16)/B4H8S512D64/' BASE=1 PEERS=attn_fwd/f16/B4H8S512D64,attn_fwd/bf16/B4H8S512D64 PEER_NAMES=sdpa-cudnn,sdpa-flash T_BENCH=60 T_PEERS=60 scripts/device_run.sh "$OUT/x"
