#!/usr/bin/env bash
# ncu of one FlashAttention backward launch (`flash_wg_bwd_d${D}_f16`), ours against the flash
# backend of SDPA at the same shape (f16, B4 H16 S4096, D from D=..., MASK=causal for the causal
# mask): where a step's time goes (warp stall reasons, issue slots, throughput against the units'
# peaks) and, for ours, the stall samples of every SASS instruction (`*_source.csv`). Clocks are
# left as they are. Usage (on the GPU machine, bundle unpacked at BUNDLE): OUT_DIR as the argument.
set -u
out="$1"; mkdir -p "$out"
b="${BUNDLE:-bundle}"
D="${D:-192}"
mask="${MASK:-full}"
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
  --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats
  --section InstructionStats --section SourceCounters)
RGK_BENCH_FAMILIES=attention_head_dims timeout 300 "$ncu" --clock-control none --kill yes -c 1 \
  -k "regex:flash_wg_bwd_d${D}_f16" "${sections[@]}" -o "$out/ours_d${D}" -f \
  "$b/bench/ops" --bench "attn_hdim/f16/B4H16S4096D${D}/bhsd/${mask}/fwdbwd\$" > "$out/ncu_ours_d${D}.log" 2>&1
echo "ours rc=$?"
"$ncu" -i "$out/ours_d${D}.ncu-rep" > "$out/ncu_ours_d${D}.txt" 2>&1
"$ncu" -i "$out/ours_d${D}.ncu-rep" --page source --csv --print-source sass > "$out/ours_d${D}_source.csv" 2>&1
causal=$([ "$mask" = causal ] && echo True || echo False)
cat > /tmp/sdpa_bwd_once.py <<PY
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
q, k, v = (torch.randn(4, 16, 4096, $D, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(2):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=$causal)
        o.backward(torch.randn_like(o))
torch.cuda.synchronize()
PY
timeout 300 "$ncu" --clock-control none -c 1 -k "regex:flash_bwd_dq_dk_dv" "${sections[@]}" \
  python3 /tmp/sdpa_bwd_once.py > "$out/ncu_flash_d${D}.txt" 2>&1
echo "flash rc=$?"
