#!/usr/bin/env bash
# The final code's forward against the base bundle, cuDNN and flash in the same call: seven f16
# shapes and two bf16 ones at both masks, and the head dims off the tiles (32, 96, 192); the
# backward suite first (its tests run the forward).
set -u
O=$1
S="B4H8S512D64 B16H16S2048D64 B16H16S2048D128 B4H16S8192D64 B4H16S8192D128 B2H16S16384D64 B2H16S16384D128"
R='^(attn_fwd/(f16/('"$(echo $S | tr ' ' '|')"')|bf16/(B4H16S8192D64|B4H16S8192D128))/|attn_hdim/f16/B4H16S4096D(32|96|192)/bhsd/(full|causal)/fwd$)'
P=""; for s in $S; do P="$P${P:+,}attn_fwd/f16/$s/"; done
P="$P,attn_fwd/bf16/B4H16S8192D64/,attn_fwd/bf16/B4H16S8192D128/"
for d in 32 96 192; do for m in full causal; do P="$P,attn_hdim/f16/B4H16S4096D$d/bhsd/$m/fwd"; done; done
TESTS="gpu_attention_backward" TEST_JOBS=1 T_TEST=150 \
RGK_BENCH_FAMILIES=attention,attention_head_dims BENCH="$R" BASE=1 T_BENCH=290 PEERS="$P" PEER_NAMES=sdpa-cudnn,sdpa-flash T_PEERS=140 \
bash scripts/device_run.sh $O/r
