#!/usr/bin/env bash
# Issue 26's small steps, each of SIDES (a snapshot of a base, as bench/run_h200_networks.sh makes, and this tree)
# in turn, ROUNDS times: `clnet bench lenet|lenet-wide --compare cuda` (batch 1 and 64, replayed against PyTorch's
# CUDA graph), then once a side the seed's workload (`clnet train lenet-wide --batch 1 --epochs 1 --lr 0.001`;
# carry .data, the four Fashion-MNIST .gz files, and .whl). Each side keeps its own cache. Results in
# $OUT/small-steps.log.
set -u
source bench/h200_env.sh
DATA=$PWD/.data
SIDES=${SIDES:-.bench-snap-head .}
small_steps() {
  for spec in lenet:1 lenet:64 lenet-wide:1; do
    timeout 90 python3 -m clnet.cli bench "${spec%:*}" --batch "${spec#*:}" --device gpu --compare cuda \
      --iterations 200 2>&1 | grep -E "^tuning|launches per iteration|replayed as|ratio"
  done
}
seed_epoch() {
  timeout 100 python3 -m clnet.cli train lenet-wide --batch 1 --epochs 1 --lr 0.001 --dataset fashion-mnist \
    --data-dir "$DATA" --device gpu 2>&1 | grep -v -i warn | tail -2
}
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
on_sides ${ROUNDS:-2} small_steps
echo "== the seed's epoch at each side"
on_sides 1 seed_epoch
} > "$OUT/small-steps.log" 2>&1
