#!/usr/bin/env bash
# The dense backward kernels adding dQ in the accumulator's pairs, against the bundle of d5be0b2 in
# the same call: the attn_hdim rows (B4 H16 S4096 f16, head dims 32-256, both masks; forward,
# forward + backward deterministic and not) and the training shapes' forward + backward
# (attn_fwdbwd f16), with SDPA flash (default and under torch.use_deterministic_algorithms(True))
# and cuDNN.
set -u
O=$1
RGK_BENCH_FAMILIES=attention_head_dims,attention_backward BENCH='^(attn_hdim/|attn_fwdbwd/f16/)' \
PEERS=attn_hdim,attn_fwdbwd/f16 PEER_NAMES=sdpa-flash,sdpa-flash-det,sdpa-cudnn \
BASE=1 T_BENCH=220 T_PEERS=220 \
bash scripts/device_run.sh $O/r
