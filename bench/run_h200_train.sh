#!/usr/bin/env bash
# Training on the lent H200: lenet on Fashion-MNIST to the 0.90 target, and lenet-wide epoch times at batch 64 and 1.
# Carries .whl (pyopencl and its needs) and .data (the four Fashion-MNIST .gz files, as Debian's package installs them).
set -u
source bench/h200_env.sh
timed() { local t=$SECONDS; "$@"; echo "wall $((SECONDS - t)) s: $*"; }
{
  timed python3 -m clnet.cli train lenet --dataset fashion-mnist --data-dir .data --device gpu \
    --epochs 10 --log "$OUT/train-lenet-h200.json"
  timed python3 -m clnet.cli train lenet-wide --dataset fashion-mnist --data-dir .data \
    --device gpu --epochs 1 --batch 64 --log "$OUT/train-lenet-wide-b64-h200.json"
  timed python3 -m clnet.cli train lenet-wide --dataset fashion-mnist --data-dir .data \
    --device gpu --epochs 1 --batch 1 --subset 6000 --log "$OUT/train-lenet-wide-b1-h200.json"
} 2>&1 | grep -v "^\s*$" | tail -40 | tee "$OUT/train-h200.log"
