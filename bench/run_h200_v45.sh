#!/usr/bin/env bash
# Session 22: a convolution's fused ReLU taken with its bias gradient (bench/NOTES.md v45). NETS at b64 through ONNX
# (bench/depthwise.py --networks), SIDES one after the other, ROUNDS times: eager and replayed, against PyTorch eager
# and its CUDA graph. The base a snapshot:
#   mkdir .bench-snap-base && git archive BASE clnet cl_kernels bench | tar -x -C .bench-snap-base &&
#   echo BASE > .bench-snap-base/.rev
#   bash bench/run_h200_v45.sh   (carry .whl and .bench-snap-base; results in $OUT/v45.log)
set -u
source bench/h200_env.sh
ROOT=$PWD
SIDES=${SIDES:-.bench-snap-base .}
NETS=${NETS:-squeezenet1_1,alexnet}
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for round in $(seq ${ROUNDS:-2}); do
  for side in $SIDES; do
    cd "$ROOT/$side"
    echo "== round $round, side $side ($(cat .rev 2>/dev/null || git -C "$ROOT" rev-parse --short HEAD)) at $SECONDS s"
    PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=/tmp/cache-$(basename "$PWD") timeout 200 python3 bench/depthwise.py \
      --device gpu --torch cuda --no-layers --batch 64 --networks $NETS --iterations 10 2>&1 | grep -v -i warn
    cd "$ROOT"
  done
done
echo "done at $SECONDS s"
} > "$OUT/v45.log" 2>&1
