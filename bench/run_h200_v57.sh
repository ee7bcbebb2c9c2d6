#!/usr/bin/env bash
# Session 25's calls (bench/NOTES.md v57): squeezenet1_1 at 8e4a4a0 (.bench-snap-head) against the tree, its kernels
# by size, and the GEMM tests on the card (carry .whl and .bench-snap-head). NETS= and ROUNDS= as run_h200_networks.sh.
set -u
export OUT
source bench/h200_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SIDES=".bench-snap-head ." NETS=${NETS:-squeezenet1_1} ROUNDS=${ROUNDS:-2} bash bench/run_h200_networks.sh
grep -E "==|clnet:|torch:" $OUT/networks.log
PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=/tmp/cache-main timeout 150 python3 bench/net_kernels.py --device gpu \
  --networks squeezenet1_1 --batch 64 2>&1 | grep -v -i warn > $OUT/squeezenet-kernels.log
head -12 $OUT/squeezenet-kernels.log
CLNET_TEST_DEVICES=nvidia timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_device.py -k gemm 2>&1 | tail -4
