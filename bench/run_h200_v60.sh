#!/usr/bin/env bash
# bench/NOTES.md v60 in one call, from a checkout of branch maxpool-tiles-v60 (carry .whl, .data and .bench-snap-head,
# the base before both of v60's changes:
#   mkdir .bench-snap-head && git archive 6bf982b clnet cl_kernels bench | tar -x -C .bench-snap-head &&
#   rm -rf .bench-snap-head/bench/results && echo 6bf982b > .bench-snap-head/.rev
# ): vgg11_bn's kernels by kind at both sides (bench/net_kernels.py), the small steps (bench/run_h200_small_steps.sh,
# one round), then vgg11_bn's replayed step at both sides against PyTorch's CUDA graph (bench/run_h200_networks.sh).
set -u
source bench/h200_env.sh
ROOT=$PWD
for side in .bench-snap-head .; do
  cd "$ROOT/$side"
  PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=/tmp/cache-k$(basename "$PWD") timeout 100 python3 bench/net_kernels.py \
    --device gpu --networks vgg11_bn --batch 64 2>&1 | grep -v -i warn | head -24 > "$OUT/vgg-kernels-$(basename "$PWD").log"
  cd "$ROOT"
done
ROUNDS=1 bash bench/run_h200_small_steps.sh
SIDES=".bench-snap-head ." NETS=vgg11_bn ROUNDS=1 bash bench/run_h200_networks.sh
