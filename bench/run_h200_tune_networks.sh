#!/usr/bin/env bash
# torchvision's networks through ONNX, each tuned first (bench/depthwise.py --tune: clnet.autotune, as cudnn.benchmark
# times PyTorch's) and then timed against PyTorch, with the tuning cache kept in $OUT/cache for
# `python3 bench/ship_tuning.py $OUT/cache/tuning-v2.json` (the shipped table, keyed by the card's family).
#   NETS="squeezenet1_1:150 vgg11_bn:100" bash bench/run_h200_tune_networks.sh   (carry .whl; NOTES v50)
set -u
source bench/h200_env.sh
export PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=$OUT/cache
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for spec in ${NETS:-squeezenet1_1:150}; do
  timeout 280 python3 bench/depthwise.py --device gpu --torch cuda --no-layers --batch 64 --networks "${spec%:*}" \
    --iterations 10 --tune "${spec#*:}" 2>&1 | grep -v -i warn
done
} 2>&1 | tee "$OUT/tuned.log"
