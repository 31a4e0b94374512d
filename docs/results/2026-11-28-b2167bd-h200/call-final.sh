#!/usr/bin/env bash
# The final code's bundle (b2167bd: dQ pairs in the deferred order only): whether SDPA's cuDNN
# backend repeats its gradients bitwise; the attention test suites; synccheck and initcheck on every
# attention suite; the attn_hdim rows (B4 H16 S4096 f16, head dims 32-256, both masks: forward,
# forward + backward deterministic and not) and the training shapes' forward + backward
# (attn_fwdbwd f16) with SDPA flash (default and under torch.use_deterministic_algorithms(True)) and
# cuDNN in the same call.
set -u
O=$1
mkdir -p $O/r
python3 - > $O/r/sdpa_cudnn_determinism.txt 2>&1 <<'PY'
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
torch.manual_seed(7)
print(torch.__version__, torch.cuda.get_device_name())
for d in (64, 128, 192):
    q, k, v = (torch.randn(4, 16, 4096, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    g = torch.randn_like(q)
    for det in (False, True):
        torch.use_deterministic_algorithms(det)
        runs = []
        try:
            for _ in range(4):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    o = F.scaled_dot_product_attention(q, k, v)
                    runs.append(torch.autograd.grad(o, (q, k, v), g))
        except Exception as e:
            print(f"D{d} cuDNN use_deterministic_algorithms({det}): {type(e).__name__}: {str(e)[:300]}")
            continue
        same = [[torch.equal(a, b) for a, b in zip(runs[0], r)] for r in runs[1:]]
        dq_diff = max((runs[0][0].float() - r[0].float()).abs().max().item() for r in runs[1:])
        print(f"D{d} cuDNN use_deterministic_algorithms({det}): (dq, dk, dv) bitwise equal to run 0 in runs 1-3: {same}; max |dq - dq_0| {dq_diff:.3e}")
    torch.use_deterministic_algorithms(False)
PY
cat $O/r/sdpa_cudnn_determinism.txt
TESTS="gpu_attention gpu_attention_backward gpu_attention_head_dims gpu_attention_gqa gpu_attention_windows gpu_attention_layouts gpu_attention_varlen gpu_attention_softcap gpu_attention_alibi gpu_attention_decode" TEST_JOBS=3 T_TEST=150 \
SAN=gpu_attention SAN_TOOLS=synccheck,initcheck SAN_JOBS=8 T_SAN=150 \
RGK_BENCH_FAMILIES=attention_head_dims,attention_backward BENCH='^(attn_hdim/|attn_fwdbwd/f16/)' \
PEERS=attn_hdim,attn_fwdbwd/f16 PEER_NAMES=sdpa-flash,sdpa-flash-det,sdpa-cudnn T_BENCH=200 T_PEERS=200 \
bash scripts/device_run.sh $O/r
