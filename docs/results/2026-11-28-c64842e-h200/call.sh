#!/usr/bin/env bash
# Tests of the final code (attention with the NaN-key test, matmul, clifford), the four sanitizer
# tools on gpu_clifford and gpu_matmul, and ncu pipe counts of the D64 forward: ours against cuDNN.
set -u
O=$1; mkdir -p $O/n
python3 .pack/dedupe_pack.py unpack .pack/bundle.dd.tgz /tmp/new >/dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
N=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M=sm__inst_executed_pipe_xu.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_alu.sum,sm__inst_executed_pipe_fmaheavy.sum
RGK_BENCH_FAMILIES=attention timeout 40 $N --clock-control none --kill yes -c 1 -k "regex:flash_tma_fwd_d64_f16" --metrics $M /tmp/new/bundle/bench/ops --bench 'attn_fwd/f16/B4H16S8192D64/full$' > $O/n/ncu_ours.txt 2>&1
cat > /tmp/sd.py <<PY
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
q,k,v=(torch.randn(4,16,8192,64,device="cuda",dtype=torch.float16) for _ in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(3): torch.nn.functional.scaled_dot_product_attention(q,k,v)
torch.cuda.synchronize()
PY
timeout 40 $N --clock-control none -c 1 -k "regex:sdpa|fmha|flash|attn|cudnn" --metrics $M python3 /tmp/sd.py > $O/n/ncu_cudnn.txt 2>&1
tar czf $O/ncu.tgz -C $O n && rm -rf $O/n
TESTS="gpu_attention gpu_matmul gpu_clifford" TEST_JOBS=3 T_TEST=200 \
SAN=gpu_clifford,gpu_matmul SAN_TOOLS=memcheck,racecheck,synccheck,initcheck SAN_JOBS=4 T_SAN=330 \
bash scripts/device_run.sh $O/r
