#!/usr/bin/env bash
# What session 23 left unmeasured on a GPU (bench/NOTES.md v50, v51), in one call (carry .whl):
#   bash bench/run_h200_v51.sh
# 1. bench/direct_backward.py: the direct gradients of lenet's and lenet-wide's layers against im2col's backward.
# 2. `clnet bench lenet-wide --batch 1` and `lenet --batch 1` with --compare cuda, after a first run's tuning (which
#    may now pick the direct gradients): launches a replayed step and its time against PyTorch's CUDA graph.
# 3. squeezenet1_1 tuned on this card (bench/run_h200_tune_networks.sh), its cache in $OUT/cache for
#    bench/ship_tuning.py (the H200's family has no squeezenet entries yet).
set -u
source bench/h200_env.sh
export PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=$OUT/cache
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 python3 bench/direct_backward.py --device gpu 2>&1 | grep -v -i warn
for m in lenet-wide lenet; do
  timeout 120 python3 -m clnet.cli tune "$m" --batch 1 --device gpu --budget 30 2>&1 | tail -1
  timeout 120 python3 -m clnet.cli bench "$m" --batch 1 --device gpu --compare cuda --iterations 200 2>&1 \
    | grep -E "clnet on|replayed|ratio|kernel launches"
done
timeout 280 python3 bench/depthwise.py --device gpu --torch cuda --no-layers --batch 64 --networks squeezenet1_1 \
  --iterations 10 --tune 150 2>&1 | grep -v -i warn
} 2>&1 | tee "$OUT/v51.log"
