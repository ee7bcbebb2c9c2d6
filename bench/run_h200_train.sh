#!/usr/bin/env bash
# Training on the lent H200. TRAIN picks the runs (default all): lenet (Fashion-MNIST to the 0.90 target), resnet8
# (to the 0.91 target), lenet-wide-b64 and lenet-wide-b1 (epoch times). Carries .whl (pyopencl and its needs) and
# .data (the four Fashion-MNIST .gz files, as Debian's package installs them).
set -u
source bench/h200_env.sh
timed() { local t=$SECONDS; "$@"; echo "wall $((SECONDS - t)) s: $*"; }
train() { timed timeout ${TRAIN_TIMEOUT:-300} python3 -m clnet.cli train "$@" --dataset fashion-mnist --data-dir .data \
  --device gpu; }
for job in ${TRAIN:-lenet resnet8 lenet-wide-b64 lenet-wide-b1}; do
  case $job in
    lenet) train lenet --epochs 10 --log "$OUT/train-lenet-h200.json" ;;
    resnet8) train resnet8 --epochs ${RESNET8_EPOCHS:-8} --lr 0.05 --log "$OUT/train-resnet8-h200.json" ;;
    lenet-wide-b64) train lenet-wide --epochs 1 --batch 64 --log "$OUT/train-lenet-wide-b64-h200.json" ;;
    lenet-wide-b1) train lenet-wide --epochs 1 --batch 1 --subset 6000 --log "$OUT/train-lenet-wide-b1-h200.json" ;;
  esac
done 2>&1 | grep -v "^\s*$" | tail -40 | tee "$OUT/train-h200.log"
