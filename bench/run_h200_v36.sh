#!/usr/bin/env bash
# The next device call after session 21 (bench/NOTES.md v36): what the CPU could not show.
#  1. v36's concatenation backward (copy2d_add) against v35: densenet121 b64 through ONNX, eager and replayed, SIDES
#     alternated twice (bench/depthwise.py --networks; the base a snapshot of 1a10409:
#       mkdir .bench-snap-base && git archive 1a10409 clnet cl_kernels bench | tar -x -C .bench-snap-base &&
#       echo 1a10409 > .bench-snap-base/.rev ).
#  2. This tree with clnet.autotune first (--tune, as PyTorch runs with cudnn.benchmark): squeezenet1_1, densenet121,
#     googlenet, against PyTorch's eager step and CUDA graph.
#  3. The eager add (bench/eager_cost.py), each side, and PyTorch's.
#   bash bench/run_h200_v36.sh   (carry .whl and .bench-snap-base; results in $OUT/v36.log)
set -u
source bench/h200_env.sh
ROOT=$PWD
SIDES=${SIDES:-.bench-snap-base .}
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for round in 1 2; do
  for side in $SIDES; do
    cd "$ROOT/$side"
    echo "== densenet121, round $round, side $side ($(cat .rev 2>/dev/null || git -C "$ROOT" rev-parse --short HEAD)) at $SECONDS s"
    PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=/tmp/cache-$(basename "$PWD") timeout 150 python3 bench/depthwise.py \
      --device gpu --torch cuda --no-layers --batch 64 --networks densenet121 --iterations 10 2>&1 | grep -v -i warn
    echo "== eager add, side $side"
    PYTHONPATH=/tmp/site:$PWD timeout 60 python3 bench/eager_cost.py --device gpu 2>&1 | grep -v -i warn
    cd "$ROOT"
  done
done
echo "== this tree tuned (--tune ${TUNE:-60}) at $SECONDS s"
CLNET_CACHE_DIR=/tmp/cache-tuned timeout 400 python3 bench/depthwise.py --device gpu --torch cuda --no-layers --batch 64 \
  --networks squeezenet1_1,densenet121,googlenet --iterations 10 --tune ${TUNE:-60} 2>&1 | grep -v -i warn
timeout 60 python3 bench/eager_cost.py --device gpu --torch 2>&1 | grep -v -i warn
echo "done at $SECONDS s"
} > "$OUT/v36.log" 2>&1
