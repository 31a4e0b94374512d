#!/usr/bin/env bash
# Packed batches with the final code: `attn_varlen` (8 sequences of 2048, packed and dense) and
# `attn_varlen_mixed` (16 sequences of 128 to 4096), forward and forward+backward, against the base
# bundle in the same call.
set -u
O=$1
RGK_BENCH_FAMILIES=attention_varlen,attention_varlen_mixed BENCH='^attn_varlen' BASE=1 T_BENCH=200 \
bash scripts/device_run.sh $O/r
