#!/usr/bin/env bash
# Session 25's calls (bench/NOTES.md v57; carry .whl and .bench-snap-head, a snapshot of 8e4a4a0 made as
# run_h200_networks.sh says): the GEMM tests on the card, SGEMM 4096 by tile (bench/sgemm_variants.py --tiles
# occupancy), NETS at 8e4a4a0 against the tree (ROUNDS rounds), squeezenet1_1's kernels by size.
set -u
export OUT
source bench/h200_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
CLNET_TEST_DEVICES=nvidia timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_device.py -k "split or gemm_layouts" 2>&1 | tail -3
SIDES=".bench-snap-head ." NETS=${NETS:-squeezenet1_1} ROUNDS=${ROUNDS:-2} bash bench/run_h200_networks.sh
grep -E "==|clnet:|torch:" $OUT/networks.log
PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=/tmp/cache-main timeout 150 python3 bench/net_kernels.py --device gpu \
  --networks squeezenet1_1 --batch 64 2>&1 | grep -v -i warn > $OUT/squeezenet-kernels.log
head -12 $OUT/squeezenet-kernels.log
timeout 60 python3 bench/sgemm_variants.py --device gpu --n 4096 --tiles occupancy --quick 2>&1 | grep -E "cuBLAS|tiled"
