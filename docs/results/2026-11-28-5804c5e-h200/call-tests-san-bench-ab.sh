#!/usr/bin/env bash
# D192 (the uneven split) by product with a half exchange: warpgroup 0 computes S^T and warpgroup 1
# dP^T over the step's 64 queries, then each hands the other half of its block through shared
# memory, so that both compute P^T and dS^T for 32 queries. The D192 backward tests, the four
# sanitizer tools on gpu_attention_head_dims, then the D192 and D256 forward+backward rows against
# the bundle of be5e381 (kernels of 1384274), SDPA flash and cuDNN in the same call.
set -u
O=$1
TESTS="gpu_attention_head_dims gpu_attention_backward" TEST_JOBS=2 T_TEST=200 \
SAN=gpu_attention_head_dims SAN_TOOLS=memcheck,racecheck,synccheck,initcheck SAN_JOBS=4 T_SAN=200 \
RGK_BENCH_FAMILIES=attention_head_dims \
BENCH='^attn_hdim/f16/B4H16S4096D(192|256)/bhsd/(full|causal)/fwdbwd' \
BASE=1 PEERS=attn_hdim PEER_NAMES=sdpa-flash,sdpa-cudnn T_BENCH=200 T_PEERS=150 \
bash scripts/device_run.sh $O/r
