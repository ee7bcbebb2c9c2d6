#!/usr/bin/env bash
# Issue 26's targets at this tree in one call (carry .whl and .data), the most wanted first so that a call cut short
# keeps them: the torchvision table (bench/run_h200_networks.sh: one side, one round; replayed and eager against
# PyTorch's CUDA graph and eager, b64), a 30 s probe (bench/build_threads.py: whether the driver builds programs in
# parallel), the eager add (bench/eager_cost.py), resnet50's forward-only pass at b64 and b1, the seed's epoch and the
# small steps (bench/run_h200_v55.sh's seed stage), SGEMM 4096 against cuBLAS, and the peak memory of resnet50's b128
# step (bench/run_h200_memory.sh). Logs in $OUT; each part says when it ended. On an H100 (its table measured in v59)
# the probe comes first and the table is resnet50, vgg11_bn and squeezenet1_1 only (what this session's changes touch).
set -u
source bench/h200_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/progress.log"
probe() {
  PYOPENCL_NO_CACHE=1 CUDA_CACHE_DISABLE=1 timeout 60 python3 bench/build_threads.py --device gpu 2>&1 \
    | grep -v -i warn > "$OUT/build-threads.log"
}
ALL=squeezenet1_1,googlenet,densenet121,resnet18,resnet50,vgg11_bn,mobilenet_v2,mnasnet1_0
# An H100 (whose table v59 measured) probes first, then times the networks this session's changes touch
if grep -q H100 "$OUT/progress.log"; then probe; ALL=resnet50,vgg11_bn,squeezenet1_1; fi
SIDES=. ROUNDS=1 NET_LIMIT=${NET_LIMIT:-300} NETS=${NETS:-$ALL} bash bench/run_h200_networks.sh
echo "networks done at $SECONDS s" >> "$OUT/progress.log"
[ -s "$OUT/build-threads.log" ] || probe
CLNET_CACHE_DIR=/tmp/cache timeout 60 python3 bench/eager_cost.py --device gpu 2>&1 | grep -v -i warn > "$OUT/eager-add.log"
for b in 64 1; do
  CLNET_CACHE_DIR=/tmp/cache timeout 100 python3 -m clnet.cli bench resnet50 --batch $b --forward-only --device gpu \
    --compare cuda 2>&1 | grep -E "clnet on|replayed|^cuDNN:|ratio"
done > "$OUT/forward-only.log"
echo "forward-only done at $SECONDS s" >> "$OUT/progress.log"
STAGE=seed bash bench/run_h200_v55.sh > /dev/null
echo "seed done at $SECONDS s" >> "$OUT/progress.log"
timeout 60 python3 bench/sgemm.py --device gpu --sizes 4096 2>&1 | grep -v -i warn > "$OUT/sgemm.log"
echo "sgemm done at $SECONDS s" >> "$OUT/progress.log"
ROOT=$PWD LIMIT=120 bash bench/run_h200_memory.sh > /dev/null
echo "all done at $SECONDS s" >> "$OUT/progress.log"
