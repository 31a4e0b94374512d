#!/usr/bin/env bash
# One device call: unpack the carried bundle (.pack, see scripts/dedupe_pack.py), then run the stages
# named by the environment, each under its own time limit, copying every log and report flat into
# OUT_DIR as soon as its stage ends (so a call cut short still returns what finished).
#   TESTS="gpu_clifford gpu_lrp"        test binaries to run (names under bundle/tests)
#   SAN="gpu_lrp" SAN_TOOLS=memcheck,...  compute-sanitizer over those binaries (SAN_JOBS=N: one process
#                                        a test, N at a time)
#   BENCH="regex" PEERS="prefix,prefix"  criterion filter for ours, peers.py --only prefixes
#   VARIANTS=1                           bench the hidden variants too
#   T_TEST / T_SAN / T_BENCH / T_PEERS    per-stage limits in seconds
# Usage: scripts/device_run.sh OUT_DIR
set -u
out="$1"; mkdir -p "$out"
python3 .pack/dedupe_pack.py unpack .pack/bundle.dd.tgz /tmp >/dev/null || { echo "unpack failed"; exit 1; }
b=/tmp/bundle
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; [print(os.path.join(p, q, "lib")) for p in nvidia.__path__ for q in os.listdir(p)]' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
nvidia-smi -L | tee "$out/gpu.txt"
sum="$out/summary.txt"
for t in ${TESTS:-}; do
  # --nocapture: the seeds and any SKIP line reach the log (a skipped GPU test must be visible).
  timeout "${T_TEST:-300}" "$b/tests/$t" --test-threads=1 --nocapture > "$out/test_$t.log" 2>&1
  rc=$?
  echo "test $t rc=$rc skips=$(grep -c SKIP "$out/test_$t.log") $(grep -h 'test result' "$out/test_$t.log" | tr '\n' ' ')" | tee -a "$sum"
done
if [ -n "${SAN:-}" ]; then
  timeout "${T_SAN:-300}" "$b/xtask" sanitize --bins "$b" --log-dir /tmp/san ${SAN_TOOLS:+--tools $SAN_TOOLS} ${SAN_JOBS:+--jobs $SAN_JOBS} --only "$SAN" > "$out/sanitize.log" 2>&1
  echo "sanitize rc=$?" | tee -a "$sum"; tail -15 "$out/sanitize.log" | tee -a "$sum"
  mkdir -p "$out/san"; cp -r /tmp/san/* "$out/san/" 2>/dev/null
fi
if [ -n "${BENCH:-}" ]; then
  flags=(--bins "$b" --out /tmp/bench --filter "$BENCH" --peers-timeout "${T_PEERS:-300}")
  if [ -n "${PEERS:-}" ]; then flags+=(--peers-only "$PEERS"); else flags+=(--no-peers); fi
  RGK_BENCH_VARIANTS="${VARIANTS:-0}" timeout "${T_BENCH:-500}" "$b/xtask" bench "${flags[@]}" > "$out/bench.log" 2>&1
  echo "bench rc=$?" | tee -a "$sum"
  cp /tmp/bench/*.json /tmp/bench/*.md "$out/" 2>/dev/null
fi
