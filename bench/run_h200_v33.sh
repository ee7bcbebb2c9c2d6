#!/usr/bin/env bash
# Session 20's one H200 call: the memory A/B (bench/run_h200_memory.sh: resnet50 b128 twice each way, mobilenet_v2
# b64 once, SIDES alternated), the pool's trace of resnet50 b128 on this checkout, then the eager add's host cost
# (bench/eager_cost.py, each side's own) alternated twice, PyTorch's once, while the call has time left.
set -u
SIDES=${SIDES:-.bench-snap-base .}
SIDES="$SIDES" MODELS="resnet50:128" ROUNDS=2 bash bench/run_h200_memory.sh > /dev/null 2>&1
SIDES="$SIDES" MODELS="mobilenet_v2:64" bash bench/run_h200_memory.sh > /dev/null 2>&1
source bench/h200_env.sh
ROOT=$PWD
CLNET_CACHE_DIR=/tmp/cache-main timeout 100 python3 bench/pool_trace.py --model resnet50 --batch 128 --device gpu \
  --steps 2 2>&1 | grep -v Warn >> "$OUT/memory.log"
{
for round in 1 2; do
  for side in $SIDES; do
    [ $SECONDS -lt ${BUDGET:-500} ] || break 2
    echo "== eager add, round $round, side $side at $SECONDS s"
    (cd "$ROOT/$side" && PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=/tmp/cache-$(basename "$(pwd)") \
      timeout 60 python3 bench/eager_cost.py --device gpu 2>&1 | grep -v Warn)
  done
done
[ $SECONDS -lt ${BUDGET:-500} ] && timeout 60 python3 bench/eager_cost.py --device gpu --torch 2>&1 | grep -v Warn
} > "$OUT/eager.log" 2>&1
