#!/usr/bin/env bash
# ncu of one FlashAttention forward launch, ours against cuDNN's SDPA kernel at the same shape
# (f16, [B, H, S, D] = B4 H16 S8192 D128 unless SHAPE="B H S D" says otherwise; MASK=causal for
# the causal mask). Clocks are left as they are (--clock-control none); each report is the
# sections that say where a kernel's time goes: throughput against the units' peaks, the warp
# stall reasons, the issue slots. Usage (on the GPU machine, from the repository root, with the
# bundle unpacked at BUNDLE): scripts/ncu_attention_forward.sh OUT_DIR
set -u
out="$1"; mkdir -p "$out"
b="${BUNDLE:-bundle}"
read -r B H S D <<< "${SHAPE:-4 16 8192 128}"
mask="${MASK:-full}"
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
  --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats
  --section InstructionStats)
# Ours: the bench binary's first launch of the forward kernel at this shape; --kill ends the
# process once it is profiled (the bench would otherwise run on under the profiler).
RGK_BENCH_FAMILIES=attention timeout 300 "$ncu" --clock-control none --kill yes -c 1 \
  -k "regex:flash_tma_fwd_d${D}_f16" "${sections[@]}" \
  "$b/bench/ops" --bench "attn_fwd/f16/B${B}H${H}S${S}D${D}/${mask}\$" > "$out/ncu_ours.txt" 2>&1
echo "ours rc=$?"
causal=$([ "$mask" = causal ] && echo True || echo False)
cat > /tmp/sdpa_once.py <<PY
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
q, k, v = (torch.randn($B, $H, $S, $D, device="cuda", dtype=torch.float16) for _ in range(3))
torch.cuda.synchronize()
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(3):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=$causal)
torch.cuda.synchronize()
PY
timeout 300 "$ncu" --clock-control none -c 1 -k "regex:sdpa|fmha|flash|attn" "${sections[@]}" \
  python3 /tmp/sdpa_once.py > "$out/ncu_cudnn.txt" 2>&1
echo "cudnn rc=$?"
