#!/usr/bin/env bash
# Diagnostic: ncu of the D192 and D32 backward (scripts/ncu_attention_backward.sh), then the attn_hdim
# D32 / D192 rows with SDPA flash and cuDNN in the same call.
set -u
O=$1
python3 .pack/dedupe_pack.py unpack .pack/bundle.dd.tgz /tmp/new >/dev/null
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; [print(os.path.join(p, q, "lib")) for p in nvidia.__path__ for q in os.listdir(p)]' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
mkdir -p /tmp/ncu
BUNDLE=/tmp/new/bundle D=192 timeout 280 bash scripts/ncu_attention_backward.sh /tmp/ncu > /tmp/ncu/run192.log 2>&1
BUNDLE=/tmp/new/bundle D=32 timeout 200 bash scripts/ncu_attention_backward.sh /tmp/ncu > /tmp/ncu/run32.log 2>&1
rm -f /tmp/ncu/*.ncu-rep
gzip -f /tmp/ncu/*_source.csv
tar czf $O/ncu.tgz -C /tmp ncu
RGK_BENCH_FAMILIES=attention_head_dims BENCH='^attn_hdim/f16/B4H16S4096D(32|192)/' PEERS=attn_hdim PEER_NAMES=sdpa-flash,sdpa-cudnn T_BENCH=260 T_PEERS=150 \
bash scripts/device_run.sh $O/r
