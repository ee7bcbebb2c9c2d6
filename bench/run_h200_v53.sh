#!/usr/bin/env bash
# Session 24's call (bench/NOTES.md v53): the cross-entropy's lanes, float4 concatenation copies and the global
# average pool's backward, against the snapshot of eb79adc (.bench-snap-base; carry it and .whl):
#   bash bench/run_h200_v53.sh
# 1. squeezenet1_1 and googlenet, both sides alternating, two rounds (bench/run_h200_networks.sh -> networks.log).
# 2. bench/cat_cost.py and the squeezenet step's kernels with its bias gradients by size (this tree -> v53.log).
set -u
source bench/h200_env.sh
SIDES=".bench-snap-base ." NETS=${NETS:-squeezenet1_1,googlenet} ROUNDS=2 bash bench/run_h200_networks.sh
export PYTHONPATH=/tmp/site:$PWD
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd bench && timeout 100 python3 cat_cost.py --device gpu 2>&1 | grep -v -i warn)
timeout 200 python3 bench/net_kernels.py --networks squeezenet1_1 --top 40 2>&1 | grep -v -i warn
} > "$OUT/v53.log" 2>&1
