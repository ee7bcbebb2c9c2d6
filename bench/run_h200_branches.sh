#!/usr/bin/env bash
# Branches measured against main on the card, in one call (bench/NOTES.md v57, v58). First a snapshot of each side:
#   for s in main $BRANCHES; do mkdir .bench-snap-$s && git archive $s clnet cl_kernels bench tests |
#     tar -x -C .bench-snap-$s && rm -rf .bench-snap-$s/bench/results && echo $s > .bench-snap-$s/.rev; done
#   NETS=squeezenet1_1,googlenet,resnet50 bash bench/run_h200_branches.sh
# (carry .whl and the snapshots). The GEMM and 1x1 tests of each of TESTED (a branch's own tests, on the card); then
# NETS at main and each branch, ROUNDS times alternating (bench/run_h200_networks.sh; each side's own cache, the
# shipped table, untuned); then squeezenet1_1's kernels by size at each side. TUNE=SECONDS: each side tunes each
# network that long first (bench/depthwise.py --tune), its cache kept for the rounds (a branch whose products have
# new layout keys finds no shipped entries for them). SGEMM=1: also SGEMM 4096 by tile at each branch.
set -u
export OUT
source bench/h200_env.sh
ROOT=$PWD
BRANCHES=${BRANCHES:-gemm-stage-v58 pointwise-rows-v58 maxpool-grid-v58 v58-all}
TESTED=${TESTED:-v58-all}
NETS=${NETS:-squeezenet1_1}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for s in $TESTED; do
  echo "== tests at $s"
  (cd .bench-snap-$s && CLNET_TEST_DEVICES=nvidia PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m pytest -q \
    -p no:cacheprovider tests/test_device.py tests/test_conv1x1.py tests/test_layers.py tests/test_large_tensors.py \
    -k "split or gemm_layouts or reads_x or pool" 2>&1 |
    tail -2)
done
for s in $BRANCHES; do
  if [ "${SGEMM:-0}" = 1 ]; then
    (cd .bench-snap-$s && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 bench/sgemm_variants.py --device gpu \
      --n 4096 --tiles occupancy --quick 2>&1 | grep -E "cuBLAS|tiled")
  fi
done
SIDES=""
for s in main $BRANCHES; do SIDES="$SIDES .bench-snap-$s"; done
if [ -n "${TUNE:-}" ]; then
  for side in $SIDES; do
    echo "== tuning $NETS at $side for ${TUNE} s each"
    (cd $side && PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=/tmp/cache-$side timeout 280 python3 bench/depthwise.py \
      --device gpu --torch cuda --no-layers --batch 64 --networks $NETS --iterations 3 --tune $TUNE 2>&1 |
      grep -v -i warn | tail -3)
  done
fi
SIDES="$SIDES" NETS=$NETS ROUNDS=${ROUNDS:-2} bash bench/run_h200_networks.sh
grep -E "==|clnet:|torch:" $OUT/networks.log
for side in $SIDES; do
  (cd $side && PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=/tmp/cache-$side timeout 150 python3 \
    bench/net_kernels.py --device gpu --networks squeezenet1_1 --batch 64 2>&1 | grep -v -i warn \
    > $OUT/squeezenet-kernels-${side#.bench-snap-}.log)
done
head -25 $OUT/squeezenet-kernels-*.log
