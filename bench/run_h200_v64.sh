#!/usr/bin/env bash
# bench/NOTES.md v64 (carry .whl and .bench-snap-base, a snapshot of f48f9fc): this tree's cheaper eager launch (v63:
# argument sets keyed by buffer ids, locks by acquire/release) and its H200 table with resnet50 retuned, against
# f48f9fc side by side: the eager add in two rounds and resnet50's forward-only pass at b64 from a fresh cache (the
# table alone); this tree alone on the depthwise target's later networks, efficientnet_b0 and convnext_tiny, and
# shufflenet_v2_x1_0, at b64 against PyTorch (last measured at v17); then densenet121's eager and replayed training
# steps at b64 on both sides. Most important first: the log comes back as far as it got.
set -u
source bench/h200_env.sh
add() { timeout 60 python3 bench/eager_cost.py --device gpu 2>&1 | grep -E " us | calls "; }
fwd() { timeout 90 python3 -m clnet.cli bench resnet50 --batch 64 --forward-only --device gpu --compare cuda --no-tune \
  2>&1 | grep -E "clnet on|replayed|^cuDNN:|ratio"; }
nets() { timeout ${NET_TIMEOUT:-60} python3 bench/depthwise.py --device gpu --torch cuda --no-layers --batch 64 \
  --networks ${NETS:-densenet121} --iterations 10 2>&1 | grep -v -i warn; }
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SIDES=".bench-snap-base ." on_sides 2 add
echo "adds done at $SECONDS s"
SIDES=".bench-snap-base ." on_sides 1 fwd
echo "forward-only done at $SECONDS s"
NETS=efficientnet_b0,convnext_tiny,shufflenet_v2_x1_0 NET_TIMEOUT=240 SIDES="." on_sides 1 nets
echo "efficientnet_b0, convnext_tiny and shufflenet done at $SECONDS s"
SIDES=".bench-snap-base ." on_sides 1 nets
echo "all done at $SECONDS s"
} > "$OUT/v64.log" 2>&1
