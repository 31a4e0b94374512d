#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on the suites that run the
# head-dim-split backward (D192, D256, the scored kernels at D128 and D256, the general D256).
set -u
O=$1
SAN=gpu_attention_head_dims,gpu_attention_softcap,gpu_attention_alibi SAN_TOOLS=memcheck,racecheck,synccheck,initcheck SAN_JOBS=4 T_SAN=540 \
bash scripts/device_run.sh $O/r
