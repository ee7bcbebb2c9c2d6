#!/usr/bin/env bash
# Session 21: the few-row GEMM tiles' A/B (bench/NOTES.md v35). torchvision networks through ONNX at batch 64
# (bench/depthwise.py --networks: clnet eager and replayed, PyTorch eager and its CUDA graph), SIDES alternated ROUNDS
# times (the base a `git archive` snapshot with this depthwise.py copied in): NETS in the first round, NETS2 in the
# later ones; with KERNELS=1, this tree's kernel-by-kernel profile of squeezenet1_1 after the first (net_kernels.py).
set -u
source bench/h200_env.sh
ROOT=$PWD
SIDES=${SIDES:-.bench-snap-base .}
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for round in $(seq ${ROUNDS:-2}); do
  for side in $SIDES; do
    [ $round = 1 ] || [ $SECONDS -lt ${BUDGET:-330} ] || break 2
    nets=${NETS:-squeezenet1_1,densenet121}
    [ $round = 1 ] || nets=${NETS2:-squeezenet1_1}
    cd "$ROOT/$side"
    echo "== round $round, side $side ($(cat .rev 2>/dev/null || git -C "$ROOT" rev-parse --short HEAD)) at $SECONDS s"
    PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=/tmp/cache-$(basename "$PWD") timeout 240 python3 bench/depthwise.py \
      --device gpu --torch cuda --no-layers --batch 64 --networks $nets --iterations 10 2>&1 | grep -v -i warn
    cd "$ROOT"
  done
  if [ $round = 1 ] && [ "${KERNELS:-1}" = 1 ]; then
    echo "== kernels of this tree at $SECONDS s"
    CLNET_CACHE_DIR=/tmp/cache-main timeout 120 python3 bench/net_kernels.py --device gpu --networks squeezenet1_1 \
      --batch 64 --top 40 2>&1 | grep -v -i warn
  fi
done
echo "done at $SECONDS s"
} > "$OUT/v35.log" 2>&1
