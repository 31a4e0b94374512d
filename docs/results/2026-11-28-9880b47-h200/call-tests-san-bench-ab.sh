#!/usr/bin/env bash
# The dense backward kernels' late dQ-turn release by one thread for the CTA (one fence, then the
# eight warps' counters) instead of one red.release a warp: the backward attention suites,
# memcheck, racecheck and synccheck on three of them, then the D32/D64/D128/D192 forward+backward
# rows against the bundle of be5e381 (kernels of 1384274), SDPA flash in the same call.
set -u
O=$1
TESTS="gpu_attention_backward gpu_attention_head_dims gpu_attention_gqa gpu_attention_windows gpu_attention_layouts gpu_attention_varlen gpu_attention_softcap gpu_attention_alibi" TEST_JOBS=3 T_TEST=150 \
SAN=gpu_attention_head_dims,gpu_attention_gqa,gpu_attention_windows SAN_TOOLS=memcheck,racecheck,synccheck SAN_JOBS=5 T_SAN=120 \
RGK_BENCH_FAMILIES=attention_head_dims \
BENCH='^attn_hdim/f16/B4H16S4096D(32|64|128|192)/bhsd/(full|causal)/fwdbwd$' \
BASE=1 PEERS=attn_hdim PEER_NAMES=sdpa-flash T_BENCH=150 T_PEERS=100 \
bash scripts/device_run.sh $O/r
