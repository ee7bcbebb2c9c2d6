#!/usr/bin/env bash
# Session 25's GPU calls (bench/NOTES.md v57; carry .whl and the two snapshots). Written for the next session, to
# measure branch gemm-stage-v58 (C_STAGE, the looping im2col_pointwise, WARP_8X4: unmeasured; session 26 put them
# on top of main as that branch) against main:
#   for s in main gemm-stage-v58; do mkdir .bench-snap-$s && git archive $s clnet cl_kernels bench |
#     tar -x -C .bench-snap-$s && rm -rf .bench-snap-$s/bench/results && echo $s > .bench-snap-$s/.rev; done
#   NETS=squeezenet1_1,googlenet,resnet50 ROUNDS=2 bash bench/run_h200_v57.sh
# It runs the GEMM tests of split operands on the card at the branch, SGEMM 4096 by tile there (--tiles occupancy,
# WARP_8X4 among them), NETS at main against the branch, and squeezenet1_1's kernels by size at each.
set -u
export OUT
source bench/h200_env.sh
ROOT=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd .bench-snap-gemm-stage-v58
cp -r "$ROOT/tests" .
CLNET_TEST_DEVICES=nvidia PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/test_device.py -k "split or gemm_layouts" 2>&1 | tail -2
PYTHONPATH=/tmp/site:$PWD timeout 100 python3 bench/sgemm_variants.py --device gpu --n 4096 --tiles occupancy \
  --quick 2>&1 | grep -E "cuBLAS|tiled"
cd "$ROOT"
SIDES=".bench-snap-main .bench-snap-gemm-stage-v58" NETS=${NETS:-squeezenet1_1} ROUNDS=${ROUNDS:-2} \
  bash bench/run_h200_networks.sh
grep -E "==|clnet:|torch:" $OUT/networks.log
for s in main gemm-stage-v58; do
  (cd .bench-snap-$s && PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=/tmp/cache-.bench-snap-$s timeout 150 python3 \
    bench/net_kernels.py --device gpu --networks squeezenet1_1 --batch 64 2>&1 | grep -v -i warn \
    > $OUT/squeezenet-kernels-$s.log)
done
