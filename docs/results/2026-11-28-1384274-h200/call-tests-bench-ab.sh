#!/usr/bin/env bash
# The head-dim-split backward by queries (both warpgroups compute S^T and dP^T for half the step's
# queries, one barrier): the backward attention suites, then the split kernels' forward+backward
# rows (D192, D256; the softcap at D128 and D256, ALiBi at D128) against the bundle of 9b47e13,
# with SDPA flash and cuDNN on the attn_hdim rows, in the same call.
set -u
O=$1
TESTS="gpu_attention_backward gpu_attention_head_dims gpu_attention_softcap gpu_attention_alibi gpu_attention_varlen gpu_attention_gqa gpu_attention_windows gpu_attention_layouts" TEST_JOBS=2 T_TEST=200 \
RGK_BENCH_FAMILIES=attention_head_dims,attention_scores \
BENCH='^(attn_hdim/f16/B4H16S4096D(192|256)/bhsd|attn_softcap/f16/B4H16S4096D(128|256)/c50|attn_alibi/f16/B4H16S4096D128/geometric)/(full|causal)/fwdbwd$' \
BASE=1 PEERS=attn_hdim PEER_NAMES=sdpa-flash,sdpa-cudnn T_BENCH=200 T_PEERS=120 \
bash scripts/device_run.sh $O/r
