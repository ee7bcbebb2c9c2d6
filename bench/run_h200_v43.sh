#!/usr/bin/env bash
# Session 22 (bench/NOTES.md v43-): where the eager steps' time goes and what squeezenet1_1's replay spends.
#  1. NETS at b64 through ONNX (bench/depthwise.py --networks): eager as a user's loop runs it (the queue finished at
#     the step's end, as PyTorch's is timed) beside the phases finished apart, replayed, PyTorch eager and its graph.
#  2. host_profile.py of PROFILED (b64, no syncs inside 20 steps): host enqueue time a step against the whole step,
#     and cProfile's top functions on the GPU's own launch path.
#  3. net_kernels.py of squeezenet1_1 (kernel time by kernel and by product, both engines).
#   bash bench/run_h200_v43.sh   (carry .whl; results in $OUT/v43.log)
set -u
source bench/h200_env.sh
NETS=${NETS:-squeezenet1_1,googlenet,densenet121}
PROFILED=${PROFILED:-googlenet squeezenet1_1}
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== networks ($(git rev-parse --short HEAD 2>/dev/null)) at $SECONDS s"
CLNET_CACHE_DIR=/tmp/cache-main timeout 300 python3 bench/depthwise.py --device gpu --torch cuda --no-layers \
  --batch 64 --networks $NETS --iterations 10 2>&1 | grep -v -i warn
for net in $PROFILED; do
  echo "== host profile of $net at $SECONDS s"
  CLNET_CACHE_DIR=/tmp/cache-main timeout 120 python3 bench/host_profile.py --device gpu --onnx $net --batch 64 \
    --steps 20 --top ${TOP:-25} 2>&1 | grep -v -i warn
done
if [ "${KERNELS:-1}" = 1 ]; then
  echo "== kernels of squeezenet1_1 at $SECONDS s"
  CLNET_CACHE_DIR=/tmp/cache-main timeout 120 python3 bench/net_kernels.py --device gpu --networks squeezenet1_1 \
    --batch 64 --top 40 2>&1 | grep -v -i warn
fi
echo "done at $SECONDS s"
} > "$OUT/v43.log" 2>&1
