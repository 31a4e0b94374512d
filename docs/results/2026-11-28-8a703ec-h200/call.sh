#!/usr/bin/env bash
# Per-warpgroup tile walk (the drain) at every TMA forward, and the D128 tile with three consumer
# warpgroups on 64-key tiles: the forward suites, the sanitizer tools on them, the f16 forward grid
# and four bf16 rows against the base bundle, cuDNN and flash in the same call.
set -u
O=$1
S="B4H8S512D64 B16H16S2048D64 B16H16S2048D128 B4H16S8192D64 B4H16S8192D128 B2H16S16384D64 B2H16S16384D128"
R='^attn_fwd/(f16/('"$(echo $S | tr ' ' '|')"')|bf16/(B4H16S8192D64|B4H16S8192D128))/'
P=""; for s in $S; do P="$P${P:+,}attn_fwd/f16/$s/"; done; P="$P,attn_fwd/bf16/B4H16S8192D64/,attn_fwd/bf16/B4H16S8192D128/"
TESTS="gpu_attention gpu_attention_head_dims gpu_attention_windows gpu_attention_gqa gpu_attention_layouts gpu_attention_varlen gpu_attention_softcap gpu_attention_alibi" \
TEST_JOBS=4 T_TEST=100 SAN=gpu_attention SAN_TOOLS=memcheck,racecheck,synccheck,initcheck SAN_JOBS=4 T_SAN=120 \
RGK_BENCH_FAMILIES=attention BENCH="$R" BASE=1 T_BENCH=190 PEERS="$P" PEER_NAMES=sdpa-cudnn,sdpa-flash T_PEERS=90 \
bash scripts/device_run.sh $O/r
