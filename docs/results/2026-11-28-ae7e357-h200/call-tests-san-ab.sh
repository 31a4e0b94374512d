#!/usr/bin/env bash
# A packed batch's query rows read once into shared memory (the general backward kernels): the
# attention suites that run the general kernels, the four sanitizer tools on three of them, then the
# packed-against-dense rows (attn_varlen), the unequal lengths (attn_varlen_mixed) and the scored
# D128 rows (a general kernel, not packed) against the bundle of b2167bd in the same call.
set -u
O=$1
TESTS="gpu_attention_varlen gpu_attention_head_dims gpu_attention_windows gpu_attention_softcap gpu_attention_alibi gpu_attention_backward" TEST_JOBS=3 T_TEST=150 \
SAN=gpu_attention_varlen,gpu_attention_windows,gpu_attention_softcap SAN_TOOLS=memcheck,racecheck,initcheck,synccheck T_SAN=200 \
RGK_BENCH_FAMILIES=attention_varlen,attention_scores \
BENCH='^(attn_varlen/|attn_varlen_mixed/|attn_softcap/f16/B4H16S4096D128/c50/(full|causal)/fwdbwd$)' \
BASE=1 T_BENCH=120 \
bash scripts/device_run.sh $O/r
