#!/usr/bin/env bash
# One device call: unpack the carried bundle (.pack/bundle.dd.tgz, see scripts/dedupe_pack.py), then run
# the stages the environment names, each under its own time limit, copying every log and report flat
# into OUT_DIR as soon as its stage ends (so a call cut short still returns what finished).
#   DOCTOR=1                              cargo xtask doctor (GPU, tools, every family's module load)
#   COLDSTART=1                           xtask coldstart (Gpu::new + first call, fresh processes)
#   DEMO=1                                the README's demo
#   TESTS="gpu_clifford gpu_lrp"          test binaries to run (names under bundle/tests; "all": every one;
#                                         TEST_JOBS=N: N binaries at once; TEST_FILTER="a b": only
#                                         the tests whose names contain a or b)
#   SAN="gpu_lrp,gpu_clifford" SAN_TOOLS=memcheck,...  compute-sanitizer over those binaries (comma list of name
#                                         prefixes; SAN_JOBS=N: one process
#                                         a test, N at a time)
#   BENCH="regex" PEERS="prefix,prefix"   criterion filter for ours, peers.py --only prefixes
#   PEER_NAMES="sdpa-cudnn,..."           only these peers
#   RGK_BENCH_FAMILIES="attention_gqa,.."  only these bench functions of ours (benches/benches/ops.rs)
#   BASE=1                                the same BENCH filter with the bench binary of
#                                         .pack/base.dd.tgz (another commit's bundle) on this card, in
#                                         this call, then bench-compare base against ours
#   BASE_DEMO=1                           that bundle's demo with an empty JIT cache, timed (its start-up)
#   FLOOR=1                               scripts/start_floor.py: the driver's and PyTorch's own start
#   DIST=1 DIST_FLAGS="--quick"           xtask dist: multi-GPU tests, benches and PyTorch's all-reduce on
#                                         every GPU (T_DIST limit)
#   T_TEST / T_SAN / T_BENCH / T_PEERS    per-stage limits in seconds
# Usage: scripts/device_run.sh OUT_DIR. Logs go to /tmp/o and come back as OUT_DIR/o.tgz with
# OUT_DIR/summary.txt beside it (a device call returns at most 8 files), packed also when the call is
# interrupted.
set -u
# NVLink multicast stays off: the multi-GPU hosts are shared.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
final="$1"; mkdir -p "$final"
out=/tmp/o; rm -rf "$out"; mkdir -p "$out"
finish() { cp "$out/summary.txt" "$final/" 2>/dev/null; tar czf "$final/o.tgz" -C /tmp o 2>/dev/null; }
trap finish EXIT
trap 'exit 143' TERM INT
python3 .pack/dedupe_pack.py unpack .pack/bundle.dd.tgz /tmp/new >/dev/null || { echo "unpack failed"; exit 1; }
b=/tmp/new/bundle
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; [print(os.path.join(p, q, "lib")) for p in nvidia.__path__ for q in os.listdir(p)]' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
nvidia-smi -L | tee "$out/gpu.txt"
sum="$out/summary.txt"
stage() { echo "=== $1 ($(date +%T))" | tee -a "$sum"; }
if [ -n "${BASE:-}${BASE_DEMO:-}" ]; then
  python3 .pack/dedupe_pack.py unpack .pack/base.dd.tgz /tmp/base >/dev/null || echo "base unpack failed" | tee -a "$sum"
fi
if [ -n "${BASE_DEMO:-}" ]; then
  stage "base demo, empty JIT cache"
  # A private, empty cache that the base bench reuses afterwards (its module is JIT-compiled once).
  export CUDA_CACHE_PATH=/tmp/base-jit-cache
  s=$(date +%s.%N)
  timeout 400 /tmp/base/bundle/demo > "$out/base_demo.log" 2>&1
  rc=$?
  echo "base demo rc=$rc wall_s=$(python3 -c "print(round($(date +%s.%N) - $s, 2))")" | tee -a "$sum"
  unset CUDA_CACHE_PATH
fi
if [ -n "${FLOOR:-}" ]; then
  stage "start floor"
  timeout 120 python3 scripts/start_floor.py 5 > "$out/floor.txt" 2>&1; cat "$out/floor.txt" | tee -a "$sum"
fi
if [ -n "${DOCTOR:-}" ]; then
  stage doctor
  CUDA_CACHE_DISABLE=1 timeout 120 "$b/xtask" doctor > "$out/doctor.log" 2>&1; echo "doctor rc=$?" | tee -a "$sum"
fi
if [ -n "${COLDSTART:-}" ]; then
  stage coldstart
  timeout 400 "$b/xtask" coldstart --bins "$b" --out "$out" > "$out/coldstart.log" 2>&1
  echo "coldstart rc=$?" | tee -a "$sum"
fi
if [ -n "${DEMO:-}" ]; then
  stage demo
  timeout 300 "$b/demo" > "$out/demo.log" 2>&1; echo "demo rc=$?" | tee -a "$sum"; tail -5 "$out/demo.log" | tee -a "$sum"
fi
if [ -n "${DIST:-}" ]; then
  stage dist
  timeout "${T_DIST:-500}" "$b/xtask" dist --bins "$b" --out /tmp/dist ${DIST_FLAGS:-} > "$out/dist.log" 2>&1
  echo "dist rc=$?" | tee -a "$sum"; tail -40 "$out/dist.log" | tee -a "$sum"
  cp /tmp/dist/* "$out/" 2>/dev/null
fi
tests="${TESTS:-}"; [ "$tests" = all ] && tests=$(ls "$b/tests")
run_test() {
  # --nocapture: the seeds and any SKIP line reach the log (a skipped GPU test must be visible).
  timeout "${T_TEST:-300}" "$b/tests/$1" --test-threads=1 --nocapture ${TEST_FILTER:-} > "$out/test_$1.log" 2>&1
  rc=$?
  echo "test $1 rc=$rc skips=$(grep -c SKIP "$out/test_$1.log") $(grep -h 'test result' "$out/test_$1.log" | tr '\n' ' ')" | tee -a "$sum"
}
# TEST_JOBS=N: N test binaries at once on the one GPU (correctness only: no test times anything).
export -f run_test; export b out sum TEST_FILTER
[ -n "$tests" ] && printf '%s\n' $tests | xargs -P "${TEST_JOBS:-1}" -I{} bash -c 'run_test {}'
if [ -n "${SAN:-}" ]; then
  stage sanitize
  timeout "${T_SAN:-300}" "$b/xtask" sanitize --bins "$b" --log-dir /tmp/san ${SAN_TOOLS:+--tools $SAN_TOOLS} ${SAN_JOBS:+--jobs $SAN_JOBS} --only "$SAN" > "$out/sanitize.log" 2>&1
  echo "sanitize rc=$?" | tee -a "$sum"; tail -25 "$out/sanitize.log" | tee -a "$sum"
  (cd /tmp && tar czf "$out/san.tgz" san 2>/dev/null)
fi
if [ -n "${BENCH:-}" ]; then
  stage bench
  flags=(--bins "$b" --out /tmp/bench --filter "$BENCH" --peers-timeout "${T_PEERS:-300}")
  if [ -n "${PEERS:-}" ]; then flags+=(--peers-only "$PEERS"); else flags+=(--no-peers); fi
  [ -n "${PEER_NAMES:-}" ] && flags+=(--peer-names "$PEER_NAMES")
  timeout "${T_BENCH:-500}" "$b/xtask" bench "${flags[@]}" > "$out/bench.log" 2>&1
  echo "bench rc=$?" | tee -a "$sum"
  cp /tmp/bench/ours.json "$out/ours.json" 2>/dev/null; cp /tmp/bench/report.md "$out/report.md" 2>/dev/null
  if [ -n "${BASE:-}" ]; then
    stage "base bench"
    # The base bundle's one module, JIT-compiled once into the cache its demo filled (if it ran here).
    CUDA_CACHE_PATH=/tmp/base-jit-cache timeout "${T_BENCH:-500}" "$b/xtask" bench --bins /tmp/base/bundle --out /tmp/base-bench --filter "$BENCH" --no-peers > "$out/base_bench.log" 2>&1
    echo "base bench rc=$?" | tee -a "$sum"
    cp /tmp/base-bench/ours.json "$out/base_ours.json" 2>/dev/null
    "$b/xtask" bench-compare /tmp/base-bench/ours.json /tmp/bench/ours.json > "$out/compare.txt" 2>&1
    echo "bench-compare rc=$?" | tee -a "$sum"; tail -40 "$out/compare.txt" | tee -a "$sum"
  fi
fi
