#!/usr/bin/env bash
# Session 21's first device call, run with bench/results/h100-subbuffers-v34/keep-arena.patch applied (the arena on
# GPUs, keeping its segments and every sub-buffer; not in the tree): which sub-buffer release NVIDIA's driver cannot
# take (bench/subbuffer_release.py, each case a process of its own; the call's run also had a case of resnet18 steps
# in that arena), then the memory A/B (bench/run_h200_memory.sh: resnet50 b128 twice each way, mobilenet_v2 b64 once,
# SIDES alternated).
set -u
SIDES=${SIDES:-.bench-snap-base .}
(source bench/h200_env.sh && nvidia-smi --query-gpu=name,driver_version --format=csv &&
 CLNET_CACHE_DIR=/tmp/cache-main timeout 300 python3 bench/subbuffer_release.py --device gpu 2>&1 | grep -v Warn) \
  > /tmp/probe.log 2>&1
source bench/h200_env.sh
cp /tmp/probe.log "$OUT/probe.log"
SIDES="$SIDES" MODELS="resnet50:128" ROUNDS=2 bash bench/run_h200_memory.sh > /dev/null 2>&1
[ $SECONDS -lt ${BUDGET:-420} ] && SIDES="$SIDES" MODELS="mobilenet_v2:64" bash bench/run_h200_memory.sh > /dev/null 2>&1
echo "done at $SECONDS s" >> "$OUT/memory.log"
