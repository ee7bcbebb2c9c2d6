#!/usr/bin/env bash
# bench/NOTES.md v64's open measurements (carry .whl): this tree's ONNX imports after v64's rewrites (the batch fold,
# torch's Linear over (N, H, W, C), GELU and SiLU as one op) on the networks they change, convnext_tiny (0.46x
# PyTorch's CUDA graph before, on an H100), efficientnet_b0 and vit_b_16, at b64 against PyTorch in one process; then
# the eager add in two rounds, on an H200 if one comes (its 12 us target is an H200 figure). About 250 s.
set -u
source bench/h200_env.sh
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 360 python3 bench/depthwise.py --device gpu --torch cuda --no-layers --batch 64 \
  --networks convnext_tiny,efficientnet_b0,vit_b_16 --iterations 10 2>&1 | grep -v -i warn
echo "networks done at $SECONDS s"
for round in 1 2; do timeout 60 python3 bench/eager_cost.py --device gpu 2>&1 | grep -E " us | calls "; done
echo "all done at $SECONDS s"
} > "$OUT/v65.log" 2>&1
