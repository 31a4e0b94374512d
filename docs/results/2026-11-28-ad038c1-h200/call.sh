#!/usr/bin/env bash
# Experiment call: tests + bench vs base + cuDNN; share variants; ncu pipe counts.
set -u
O=$1; mkdir -p $O
D64='B(16H16S2048|4H16S8192|4H8S512)D64/'
D128='B(16H16S2048|4H16S8192)D128/'
P=""; for s in B16H16S2048D64 B16H16S2048D128 B4H16S8192D64 B4H16S8192D128 B4H8S512D64; do P="$P${P:+,}attn_fwd/f16/$s/"; done
TESTS="gpu_attention gpu_attention_head_dims gpu_attention_windows gpu_attention_gqa gpu_attention_layouts gpu_attention_varlen gpu_attention_softcap gpu_attention_alibi" \
TEST_JOBS=3 T_TEST=150 RGK_BENCH_FAMILIES=attention BENCH="^attn_fwd/f16/($D64|$D128)" BASE=1 \
PEERS="$P" PEER_NAMES=sdpa-cudnn,sdpa-flash T_PEERS=150 T_BENCH=150 \
bash scripts/device_run.sh $O/r1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
b=/tmp/new/bundle
run() { # v filter
  RGK_FMA_EXP=$1 RGK_BENCH_FAMILIES=attention timeout 100 $b/xtask bench --bins $b --out /tmp/bx$1_$3 --filter "$2" --no-peers > $O/bx$1_$3.log 2>&1
  cp /tmp/bx$1_$3/ours.json $O/bx$1_$3.json; $b/xtask bench-compare /tmp/base-bench/ours.json /tmp/bx$1_$3/ours.json > $O/cmp_x$1_$3.txt 2>&1; echo "x$1 $3 done $(date +%T)"
}
for v in 0 1 3 4; do run $v "^attn_fwd/f16/$D64" d64; done
for v in 0 2; do run $v "^attn_fwd/f16/$D128" d128; done
N=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M=sm__inst_executed_pipe_xu.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_alu.sum
for bb in $b /tmp/base/bundle; do
  RGK_BENCH_FAMILIES=attention timeout 60 $N --clock-control none --kill yes -c 1 -k "regex:flash_tma_fwd_d64_f16" --section ComputeWorkloadAnalysis --metrics $M $bb/bench/ops --bench 'attn_fwd/f16/B4H16S8192D64/full$' > $O/ncu_$(basename $(dirname $bb)).txt 2>&1
done
cat > /tmp/sd.py <<PY
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
q,k,v=(torch.randn(4,16,8192,64,device="cuda",dtype=torch.float16) for _ in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(3): torch.nn.functional.scaled_dot_product_attention(q,k,v)
torch.cuda.synchronize()
PY
timeout 60 $N --clock-control none -c 1 -k "regex:sdpa|fmha|flash|attn|cudnn" --section ComputeWorkloadAnalysis --metrics $M python3 /tmp/sd.py > $O/ncu_cudnn.txt 2>&1
echo all done $(date +%T)
