#!/usr/bin/env bash
# Branch offset-args against main (bench/NOTES.md v48): where its replayed steps' 1-2% and eager steps' up to 10%
# go on NVIDIA. For each side: googlenet's and squeezenet's kernel time summed over one step (bench/net_kernels.py:
# kernels slower, or only the gaps between them?) and googlenet's host time a step (bench/host_profile.py).
#   SIDES=".bench-snap-base ." bash bench/run_h200_offsets_cost.sh   (carry .whl and .bench-snap-base)
set -u
source bench/h200_env.sh
ROOT=$PWD
{
for side in ${SIDES:-.bench-snap-base .}; do
  cd "$ROOT/$side"
  export PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=/tmp/cache-$(basename "$side")
  echo "== side $side ($(cat .rev 2>/dev/null || echo this tree)) at ${SECONDS} s"
  timeout 200 python3 bench/net_kernels.py --device gpu --networks ${NETS:-googlenet,squeezenet1_1} --batch 64 \
    --top 12 2>&1 | grep -v Warning
  timeout 120 python3 bench/host_profile.py --device gpu --model googlenet --batch 64 --steps 30 --top 14 2>&1 \
    | grep -v Warning | head -24
done
} 2>&1 | tee "$OUT/offsets-cost.log"
