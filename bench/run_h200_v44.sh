#!/usr/bin/env bash
# Session 22: a training batch norm's finishing launches merged into the passes that use them (bench/NOTES.md v44).
#  1. bench/bn_merge.py: the two paths' device time, launches and host view on the networks' shapes.
#  2. NETS at b64 through ONNX (bench/depthwise.py --networks), SIDES one after the other: eager (the queue finished
#     at the step's end) and replayed, against PyTorch eager and its CUDA graph. The base a snapshot:
#       mkdir .bench-snap-base && git archive BASE clnet cl_kernels bench | tar -x -C .bench-snap-base &&
#       cp bench/depthwise.py .bench-snap-base/bench/ && echo BASE > .bench-snap-base/.rev
#   bash bench/run_h200_v44.sh   (carry .whl and .bench-snap-base; results in $OUT/v44.log)
set -u
source bench/h200_env.sh
ROOT=$PWD
SIDES=${SIDES:-.bench-snap-base .}
NETS=${NETS:-googlenet,densenet121,resnet50,resnet18}
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== bn_merge at $SECONDS s"
timeout 120 python3 bench/bn_merge.py --device gpu 2>&1 | grep -v -i warn
for round in $(seq ${ROUNDS:-1}); do
  for side in $SIDES; do
    cd "$ROOT/$side"
    echo "== round $round, side $side ($(cat .rev 2>/dev/null || git -C "$ROOT" rev-parse --short HEAD)) at $SECONDS s"
    PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=/tmp/cache-$(basename "$PWD") timeout 240 python3 bench/depthwise.py \
      --device gpu --torch cuda --no-layers --batch 64 --networks $NETS --iterations 10 2>&1 | grep -v -i warn
    cd "$ROOT"
  done
done
echo "done at $SECONDS s"
} > "$OUT/v44.log" 2>&1
