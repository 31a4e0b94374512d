#!/usr/bin/env bash
# The attn_hdim family (B4 H16 S4096 f16, head dims 32-256, both masks): forward, forward + backward
# (deterministic, the default) and forward + backward with the nondeterministic dQ order, with SDPA
# flash and cuDNN in the same call.
set -u
O=$1
RGK_BENCH_FAMILIES=attention_head_dims BENCH='^attn_hdim/' PEERS=attn_hdim PEER_NAMES=sdpa-flash,sdpa-cudnn T_BENCH=540 T_PEERS=200 \
bash scripts/device_run.sh $O/r
