#!/usr/bin/env bash
# bench/NOTES.md v63's third call (carry .whl and .bench-snap-head): lenet b1 replayed at 0.224 ms on the H200 in the
# second call (0.65x the CUDA graph's 0.146; the H100 0.149-0.151 in v62): lenet b1 three times at this tree and the
# 6bf982b snapshot side by side, its kernels one by one (bench/step_kernels.py), then densenet121's eager step twice
# (0.80x PyTorch eager in the first call: 95.3 against 75.8 ms) and the eager add twice, for their spread.
set -u
source bench/h200_env.sh
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)"
one() { timeout 60 python3 -m clnet.cli bench lenet --batch 1 --device gpu --compare cuda --iterations 500 2>&1 \
  | grep -E "clnet on|replayed"; }
SIDES=". .bench-snap-head" on_sides 3 one
CLNET_CACHE_DIR=/tmp/cache-main timeout 60 python3 bench/step_kernels.py --device gpu --model lenet --batch 1 2>&1 \
  | grep -v -i warn
echo "lenet done at $SECONDS s"
} > "$OUT/lenet-b1.log" 2>&1
SIDES=. ROUNDS=2 NET_LIMIT=120 NETS=densenet121 bash bench/run_h200_networks.sh
for i in 1 2; do
  CLNET_CACHE_DIR=/tmp/cache-main timeout 60 python3 bench/eager_cost.py --device gpu 2>&1 | grep -v -i warn
done > "$OUT/eager-add.log"
echo "all done at $SECONDS s" >> "$OUT/lenet-b1.log"
