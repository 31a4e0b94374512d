#!/usr/bin/env bash
# The same bundle as call-tests-san-bench-ab.sh (the CTA release in every dense backward kernel):
# the D96 and D256 forward+backward rows against the bundle of be5e381, no peers.
set -u
O=$1
RGK_BENCH_FAMILIES=attention_head_dims \
BENCH='^attn_hdim/f16/B4H16S4096D(96|256)/bhsd/(full|causal)/fwdbwd$' \
BASE=1 T_BENCH=120 \
bash scripts/device_run.sh $O/r
