#!/usr/bin/env bash
# torchvision's networks through ONNX at b64 (bench/depthwise.py --networks), each of SIDES in turn, ROUNDS times:
# clnet eager (the queue finished at the step's end) and replayed, PyTorch eager and its CUDA graph, in one process a
# side. A side other than "." is a snapshot of a base:
#   mkdir .bench-snap-base && git archive BASE clnet cl_kernels bench | tar -x -C .bench-snap-base &&
#   cp bench/depthwise.py .bench-snap-base/bench/ && echo BASE > .bench-snap-base/.rev
#   SIDES=".bench-snap-base ." NETS=squeezenet1_1,alexnet ROUNDS=2 bash bench/run_h200_networks.sh
# (carry .whl and the snapshot; results in $OUT/networks.log). Session 22's calls (bench/NOTES.md v45) ran it as
# bench/run_h200_v45.sh, writing $OUT/v45.log.
set -u
source bench/h200_env.sh
SIDES=${SIDES:-.bench-snap-base .}
NETS=${NETS:-squeezenet1_1,alexnet}
networks() {
  timeout ${NET_LIMIT:-200} python3 bench/depthwise.py --device gpu --torch cuda --no-layers --batch 64 --networks $NETS \
    --iterations 10 2>&1 | grep --line-buffered -v -i warn
}
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
on_sides ${ROUNDS:-2} networks
echo "done at $SECONDS s"
} > "$OUT/networks.log" 2>&1
