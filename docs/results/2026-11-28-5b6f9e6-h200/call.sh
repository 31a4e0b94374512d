#!/usr/bin/env bash
# The persistent TMA forward (branch persistent-dynamic, 5b6f9e6): the forward attention suites,
# then D128 (and D96/D192 on their tiles, D64 with its spills) against e48ab59's bundle, cuDNN in
# the same call.
set -u
O=$1
R='^(attn_fwd/f16/(B16H16S2048D128|B4H16S8192D128|B2H16S16384D128|B16H16S2048D64|B4H16S8192D64)/|attn_fwd/bf16/B4H16S8192D128/|attn_hdim/f16/B4H16S4096D(96|192)/bhsd/(full|causal)/fwd$)'
P="attn_fwd/f16/B16H16S2048D128/,attn_fwd/f16/B4H16S8192D128/,attn_fwd/f16/B2H16S16384D128/,attn_fwd/bf16/B4H16S8192D128/"
TESTS="gpu_attention gpu_attention_head_dims gpu_attention_windows gpu_attention_gqa gpu_attention_layouts gpu_attention_varlen gpu_attention_softcap gpu_attention_alibi" \
TEST_JOBS=4 T_TEST=120 \
RGK_BENCH_FAMILIES=attention,attention_head_dims BENCH="$R" BASE=1 T_BENCH=200 PEERS="$P" PEER_NAMES=sdpa-cudnn T_PEERS=60 \
bash scripts/device_run.sh $O/r
