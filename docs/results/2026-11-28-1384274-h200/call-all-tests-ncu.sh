#!/usr/bin/env bash
# Every GPU test binary of the bundle of 1384274 (the head-dim-split backward by queries), then ncu of
# its D192 backward (scripts/ncu_attention_backward.sh: where a step's time goes now).
set -u
O=$1
python3 .pack/dedupe_pack.py unpack .pack/bundle.dd.tgz /tmp/new >/dev/null
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; [print(os.path.join(p, q, "lib")) for p in nvidia.__path__ for q in os.listdir(p)]' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
mkdir -p /tmp/ncu
BUNDLE=/tmp/new/bundle D=192 timeout 150 bash scripts/ncu_attention_backward.sh /tmp/ncu > /tmp/ncu/run192.log 2>&1
rm -f /tmp/ncu/*.ncu-rep /tmp/ncu/ncu_flash_d192.txt
gzip -f /tmp/ncu/*_source.csv
tar czf $O/ncu.tgz -C /tmp ncu
TESTS=all TEST_JOBS=3 T_TEST=300 bash scripts/device_run.sh $O/r
