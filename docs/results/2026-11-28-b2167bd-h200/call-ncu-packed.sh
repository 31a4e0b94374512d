#!/usr/bin/env bash
# The final code's bundle (b2167bd): one launch each of the dense and the packed main backward kernel
# at D128 (8 x 2048, H16, f16, full mask) under ncu, with warp state statistics and the stall
# samples of every SASS instruction, to see where the packed kernel's extra 7% goes.
set -u
O=$1
mkdir -p /tmp/ncu
python3 .pack/dedupe_pack.py unpack .pack/bundle.dd.tgz /tmp/new > /dev/null
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; [print(os.path.join(p, q, "lib")) for p in nvidia.__path__ for q in os.listdir(p)]' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
sections=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats
  --section LaunchStats --section SourceCounters --section MemoryWorkloadAnalysis)
for layout in dense packed; do
  k=$([ $layout = dense ] && echo flash_wg_bwd_d128_f16 || echo flash_wg_bwd_packed_d128_f16)
  RGK_BENCH_FAMILIES=attention_varlen timeout 200 "$ncu" --clock-control none --kill yes -c 1 \
    -k "regex:$k" "${sections[@]}" -o /tmp/ncu/$layout -f \
    /tmp/new/bundle/bench/ops --bench "attn_varlen/f16/B8H16S2048D128/${layout}/full/fwdbwd\$" \
    > /tmp/ncu/run_$layout.log 2>&1
  echo "ncu $layout rc=$?"
  "$ncu" -i /tmp/ncu/$layout.ncu-rep > /tmp/ncu/ncu_$layout.txt 2>&1
  "$ncu" -i /tmp/ncu/$layout.ncu-rep --page source --csv --print-source sass > /tmp/ncu/${layout}_source.csv 2>&1
  grep -E "Duration|Issue Slots Busy|Warp Cycles Per Issued|Executed Instructions  " /tmp/ncu/ncu_$layout.txt | head -8
done
rm -f /tmp/ncu/*.ncu-rep
gzip -f /tmp/ncu/*_source.csv
tar czf $O/ncu.tgz -C /tmp ncu
