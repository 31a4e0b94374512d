#!/usr/bin/env bash
# The final code's bundle (b2167bd): the packed batch against the dense one of equal FLOPs
# (attn_varlen, 8 x 2048, H16 D128 f16, forward and forward + backward, both masks), then each
# kernel's GPU time under ncu for one dense and one packed forward + backward (full mask): which
# kernel holds the packed call's extra time.
set -u
O=$1
mkdir -p $O/r /tmp/ncu
RGK_BENCH_FAMILIES=attention_varlen BENCH='^attn_varlen/f16/' T_BENCH=150 \
bash scripts/device_run.sh $O/r
python3 .pack/dedupe_pack.py unpack .pack/bundle.dd.tgz /tmp/new > /dev/null
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; [print(os.path.join(p, q, "lib")) for p in nvidia.__path__ for q in os.listdir(p)]' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for layout in dense packed; do
  RGK_BENCH_FAMILIES=attention_varlen timeout 150 "$ncu" --clock-control none --kill yes -c 12 \
    -k "regex:flash" --section SpeedOfLight --section LaunchStats --section Occupancy \
    /tmp/new/bundle/bench/ops --bench "attn_varlen/f16/B8H16S2048D128/${layout}/full/fwdbwd\$" \
    > /tmp/ncu/ncu_varlen_${layout}.txt 2>&1
  echo "ncu $layout rc=$?"
  grep -E "^  [a-z_0-9]+ \(|Duration|Registers Per|Grid Size|Block Size|Dynamic Shared" /tmp/ncu/ncu_varlen_${layout}.txt | head -80
done
tar czf $O/ncu.tgz -C /tmp ncu
