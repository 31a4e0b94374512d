#!/usr/bin/env bash
# The dense backward kernels adding dQ in the accumulator's pairs (red.global.add.v2.f32, no lane
# exchange): whether SDPA flash's dQ is bitwise repeatable by default and under torch's
# deterministic mode; every GPU test binary (but host, abi, integration_tests: CPU only, and
# gpu_dist: several GPUs); the four sanitizer tools on every attention suite.
set -u
O=$1
mkdir -p $O/r
python3 - > $O/r/sdpa_determinism.txt 2>&1 <<'PY'
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
torch.manual_seed(7)
print(torch.__version__, torch.cuda.get_device_name())
for d in (64, 128, 192, 256):
    q, k, v = (torch.randn(4, 16, 4096, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    g = torch.randn_like(q)
    for det in (False, True):
        torch.use_deterministic_algorithms(det)
        runs = []
        for _ in range(4):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(q, k, v)
                runs.append(torch.autograd.grad(o, (q, k, v), g))
        same = [[torch.equal(a, b) for a, b in zip(runs[0], r)] for r in runs[1:]]
        dq_diff = max((runs[0][0].float() - r[0].float()).abs().max().item() for r in runs[1:])
        print(f"D{d} use_deterministic_algorithms({det}): (dq, dk, dv) bitwise equal to run 0 in runs 1-3: {same}; max |dq - dq_0| {dq_diff:.3e}")
    torch.use_deterministic_algorithms(False)
PY
cat $O/r/sdpa_determinism.txt
TESTS=all TEST_JOBS=3 T_TEST=240 \
SAN=gpu_attention SAN_TOOLS=memcheck,racecheck,initcheck,synccheck SAN_JOBS=8 T_SAN=240 \
bash scripts/device_run.sh $O/r
