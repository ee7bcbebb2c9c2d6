#!/usr/bin/env bash
# bench/NOTES.md v61's call (session 28; `bench/results/h100-v61/1-*.log`), run from a checkout of branch
# maxpool-tiles-v60 (a6950c2, since merged) with .whl, .data and .bench-snap-head carried, a snapshot of 6bf982b:
#   mkdir .bench-snap-head && git archive 6bf982b clnet cl_kernels bench | tar -x -C .bench-snap-head &&
#   rm -rf .bench-snap-head/bench/results && echo 6bf982b > .bench-snap-head/.rev
# In order of need, each log written as it goes: the enqueue probe (bench/enqueue_local.py); the small steps at
# both sides, one round (bench/run_h200_small_steps.sh); vgg11_bn's replay at both sides (bench/run_h200_networks.sh);
# vgg11_bn's kernels at this side (v59 has the base's).
set -u
source bench/h200_env.sh
python3 bench/enqueue_local.py --device gpu --launches 3000 --repeats 5 > "$OUT/enqueue-local.log" 2>&1
echo "probe done at $SECONDS s" >> "$OUT/times.log"
ROUNDS=1 bash bench/run_h200_small_steps.sh
echo "small steps done at $SECONDS s" >> "$OUT/times.log"
SIDES=".bench-snap-head ." NETS=vgg11_bn ROUNDS=1 bash bench/run_h200_networks.sh
echo "networks done at $SECONDS s" >> "$OUT/times.log"
CLNET_CACHE_DIR=/tmp/cache-k timeout 100 python3 bench/net_kernels.py --device gpu --networks vgg11_bn --batch 64 2>&1 \
  | grep -v -i warn | head -24 > "$OUT/vgg-kernels-tiles.log"
echo "all done at $SECONDS s" >> "$OUT/times.log"
