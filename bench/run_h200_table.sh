#!/usr/bin/env bash
# Issue 26's table at this tree, one call on the card (carry .whl): the eager add's cost (bench/eager_cost.py), the
# torchvision networks replayed and eager against PyTorch eager and its CUDA graph (bench/run_h200_networks.sh, one
# side, one round; NETS= to pick), and resnet50's forward-only pass at batch 64 and 1 (`clnet bench --compare cuda`).
# Results in $OUT: eager-add.log, networks.log, forward-only.log.
set -u
source bench/h200_env.sh
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.log"
CLNET_CACHE_DIR=/tmp/cache timeout 60 python3 bench/eager_cost.py --device gpu 2>&1 | grep -v -i warn \
  > "$OUT/eager-add.log"
for b in 64 1; do
  CLNET_CACHE_DIR=/tmp/cache timeout 120 python3 -m clnet.cli bench resnet50 --batch $b --forward-only --device gpu \
    --compare cuda 2>&1 | grep -v -i warn
done > "$OUT/forward-only.log"
SIDES=. ROUNDS=1 NETS=${NETS:-squeezenet1_1,googlenet,densenet121,resnet18,resnet50,vgg11_bn,mobilenet_v2,mnasnet1_0} \
  bash bench/run_h200_networks.sh
