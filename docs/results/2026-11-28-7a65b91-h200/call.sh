#!/usr/bin/env bash
# The NaN-LSE change: the forward-side attention suites, the four sanitizer tools on gpu_attention,
# and the forward rows it touches against the bundle of 3245c10 (same call).
set -u
O=$1
TESTS="gpu_attention gpu_attention_backward gpu_attention_head_dims gpu_attention_windows gpu_attention_gqa gpu_attention_layouts gpu_attention_varlen gpu_attention_softcap gpu_attention_alibi" \
TEST_JOBS=3 T_TEST=200 SAN=gpu_attention SAN_TOOLS=memcheck,racecheck,synccheck,initcheck SAN_JOBS=4 T_SAN=200 \
RGK_BENCH_FAMILIES=attention BENCH='^attn_fwd/f16/(B4H8S512D64|B4H16S8192D64|B4H16S8192D128)/' BASE=1 T_BENCH=120 \
bash scripts/device_run.sh $O/r
