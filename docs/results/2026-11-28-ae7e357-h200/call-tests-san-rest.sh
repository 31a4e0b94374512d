#!/usr/bin/env bash
# The same bundle (ae7e357): the attention suites its first call did not run, and the four sanitizer
# tools on the two other suites that take the general kernels (`gpu_attention_head_dims`: narrow
# head dims; `gpu_attention_alibi`: the scored kernels).
set -u
O=$1
TESTS="gpu_attention gpu_attention_gqa gpu_attention_layouts gpu_attention_decode" TEST_JOBS=3 T_TEST=120 \
SAN=gpu_attention_head_dims,gpu_attention_alibi SAN_TOOLS=memcheck,racecheck,initcheck,synccheck T_SAN=200 \
bash scripts/device_run.sh $O/r
