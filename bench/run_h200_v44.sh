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
SIDES=${SIDES:-.bench-snap-base .}
NETS=${NETS:-googlenet,densenet121,resnet50,resnet18}
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== bn_merge at $SECONDS s"
timeout 120 python3 bench/bn_merge.py --device gpu 2>&1 | grep -v -i warn
} > "$OUT/v44.log" 2>&1
SIDES="$SIDES" NETS=$NETS ROUNDS=${ROUNDS:-1} bash bench/run_h200_networks.sh
cat "$OUT/networks.log" >> "$OUT/v44.log"
