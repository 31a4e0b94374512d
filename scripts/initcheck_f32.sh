#!/usr/bin/env bash
# initcheck on gpu_clifford and on gpu_matmul's f32 tests (the f16/bf16 ones carry the known TMA-store host-copy findings and take minutes)
o="$1"; mkdir -p "$o"; b=/tmp/new/bundle
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; [print(os.path.join(p, q, "lib")) for p in nvidia.__path__ for q in os.listdir(p)]' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
timeout 90 "$b/xtask" sanitize --bins "$b" --log-dir "$o/san" --tools initcheck --jobs 8 --only gpu_clifford > "$o/initcheck_gpu_clifford.log" 2>&1; echo "initcheck gpu_clifford rc=$?" | tee -a "$o/summary.txt"
tail -4 "$o/initcheck_gpu_clifford.log" | tee -a "$o/summary.txt"
for t in matmul_f32_into_bias_and_accumulate_match_f64_reference matmul_f32_precision_error_table matmul_matches_f64_reference_on_odd_shapes matmul_f32_precisions_run_what_they_name matmul_random_shapes_fuzz matmul_f32_portable_build_matches_f64_reference; do
  timeout 90 compute-sanitizer --tool initcheck --error-exitcode 9 "$b/tests/gpu_matmul" --test-threads=1 --exact "$t" > "$o/initcheck_$t.log" 2>&1
  echo "initcheck gpu_matmul $t rc=$? $(grep -h 'ERROR SUMMARY' "$o/initcheck_$t.log") $(grep -h 'test result' "$o/initcheck_$t.log")" | tee -a "$o/summary.txt"
done
tar czf "$o.tgz" -C "$(dirname "$o")" "$(basename "$o")" && rm -rf "$o"
