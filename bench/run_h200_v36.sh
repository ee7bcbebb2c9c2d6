#!/usr/bin/env bash
# The next device call after session 21 (bench/NOTES.md v36-v42): what the CPU could not show.
#  1. v36-v42 (the concatenation's backward into the gradient so far, ONNX batch norms without their correction
#     launches, ReLUs run in the batch norm, convolution or add before them, chained joins) against v35: NETS through
#     ONNX at batch 64, eager and replayed, against PyTorch eager and its CUDA graph (bench/depthwise.py --networks),
#     SIDES alternated ROUNDS times; the base a snapshot of 1a10409:
#       mkdir .bench-snap-base && git archive 1a10409 clnet cl_kernels bench | tar -x -C .bench-snap-base &&
#       echo 1a10409 > .bench-snap-base/.rev
#  2. The eager add (bench/eager_cost.py), each side, and PyTorch's; what an extra int argument costs a launch
#     (bench/arg_cost.py).
#  3. With TUNE=seconds, this tree with clnet.autotune first (--tune, as PyTorch runs with cudnn.benchmark).
#   bash bench/run_h200_v36.sh   (carry .whl and .bench-snap-base; results in $OUT/v36.log)
set -u
source bench/h200_env.sh
ROOT=$PWD
SIDES=${SIDES:-.bench-snap-base .}
NETS=${NETS:-squeezenet1_1,densenet121,googlenet,resnet50,resnet18}
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for round in $(seq ${ROUNDS:-1}); do
  for side in $SIDES; do
    cd "$ROOT/$side"
    echo "== round $round, side $side ($(cat .rev 2>/dev/null || git -C "$ROOT" rev-parse --short HEAD)) at $SECONDS s"
    PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=/tmp/cache-$(basename "$PWD") timeout 300 python3 bench/depthwise.py \
      --device gpu --torch cuda --no-layers --batch 64 --networks $NETS --iterations 10 2>&1 | grep -v -i warn
    echo "== eager add, side $side"
    PYTHONPATH=/tmp/site:$PWD timeout 60 python3 bench/eager_cost.py --device gpu 2>&1 | grep -v -i warn
    cd "$ROOT"
  done
done
timeout 60 python3 bench/eager_cost.py --device gpu --torch 2>&1 | grep -v -i warn
echo "== what an extra int argument costs a launch (the memory plan's price, NOTES v42)"
timeout 60 python3 bench/arg_cost.py --device gpu 2>&1 | grep -v -i warn
if [ "${TUNE:-0}" != 0 ]; then
  echo "== this tree tuned (--tune $TUNE) at $SECONDS s"
  CLNET_CACHE_DIR=/tmp/cache-tuned timeout 400 python3 bench/depthwise.py --device gpu --torch cuda --no-layers \
    --batch 64 --networks $NETS --iterations 10 --tune $TUNE 2>&1 | grep -v -i warn
fi
echo "done at $SECONDS s"
} > "$OUT/v36.log" 2>&1
