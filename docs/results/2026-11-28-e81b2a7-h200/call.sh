#!/usr/bin/env bash
# Three consumer warpgroups at D <= 64: the forward suites, the sanitizer tools on them (as far as
# the limit goes), the D64 rows against 3245c10's bundle, cuDNN and flash in the same call.
set -u
O=$1
R='^attn_fwd/f16/(B4H8S512D64|B16H16S2048D64|B4H16S8192D64|B2H16S16384D64)/'
P=""; for s in B4H8S512D64 B16H16S2048D64 B4H16S8192D64 B2H16S16384D64; do P="$P${P:+,}attn_fwd/f16/$s/"; done
TESTS="gpu_attention gpu_attention_head_dims gpu_attention_windows gpu_attention_gqa gpu_attention_layouts gpu_attention_varlen gpu_attention_softcap gpu_attention_alibi" \
TEST_JOBS=4 T_TEST=120 SAN=gpu_attention SAN_TOOLS=memcheck,racecheck,synccheck,initcheck SAN_JOBS=4 T_SAN=90 \
RGK_BENCH_FAMILIES=attention BENCH="$R" BASE=1 T_BENCH=100 PEERS="$P" PEER_NAMES=sdpa-cudnn,sdpa-flash T_PEERS=100 \
bash scripts/device_run.sh $O/r
