#!/usr/bin/env bash
# The final code's forward: the eight forward attention suites, then memcheck, racecheck,
# synccheck and initcheck on each.
set -u
O=$1
TESTS="gpu_attention gpu_attention_head_dims gpu_attention_windows gpu_attention_gqa gpu_attention_layouts gpu_attention_varlen gpu_attention_softcap gpu_attention_alibi" \
TEST_JOBS=4 T_TEST=120 SAN=gpu_attention SAN_TOOLS=memcheck,racecheck,synccheck,initcheck SAN_JOBS=4 T_SAN=400 \
bash scripts/device_run.sh $O/r
