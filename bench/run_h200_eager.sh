#!/usr/bin/env bash
# Issue 26's eager steps on the H200: for each of SIDES (checkouts, default this one; alternated ROUNDS times) the
# eager add's cost (bench/eager_cost.py), then each of NETS (torchvision models through ONNX, batch BATCH) timed
# eager and replayed against PyTorch eager and its CUDA graph (bench/depthwise.py --networks), and each net's host
# time a step (bench/host_profile.py, its cProfile statistics kept as $OUT/NET-SIDE.prof). STRIP=1 also writes
# $OUT/NET-b1.onnx, each network exported at batch 1 with its weights left out (bench/onnx_strip.py fills them
# again with random values), for profiling clnet's Python where torchvision is missing.
set -u
source bench/h200_env.sh
ROOT=$PWD
LOG=$OUT/eager.log
NETS=${NETS:-squeezenet1_1 googlenet densenet121}
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
for round in $(seq ${ROUNDS:-1}); do
  for side in ${SIDES:-.}; do
    cd "$ROOT/$side"
    export PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=/tmp/cache-$(basename "$side")
    rev=$(cat .rev 2>/dev/null || git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)  # a snapshot names its own
    echo "== round $round, side $side ($rev) at ${SECONDS} s"
    timeout 120 python3 bench/eager_cost.py --device gpu ${TORCH_ADD:-}
    timeout 400 python3 bench/depthwise.py --device gpu --torch ${TORCH:-cuda} --no-layers --batch ${BATCH:-64} \
      --networks "$(echo $NETS | tr ' ' ,)" --iterations ${ITERATIONS:-10} 2>&1 | grep -v Warning
    for net in $NETS; do
      timeout 120 python3 bench/host_profile.py --device gpu --onnx $net --batch ${BATCH:-64} --steps 10 \
        --sort cumulative --top 30 --dump "$OUT/$net-$(basename "$side").prof" 2>&1 | grep -v Warning | head -60
    done
  done
done
if [ "${STRIP:-0}" = 1 ]; then
  for net in $NETS; do python3 bench/onnx_strip.py export $net "$OUT/$net-b1.onnx"; done
fi
} 2>&1 | tee "$LOG"
