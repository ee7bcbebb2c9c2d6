#!/usr/bin/env bash
# bench/NOTES.md v62's call: v61 timed lenet b1 replayed at 0.249 ms after v60 (im2col below 210 MFLOP) where v61b's
# call timed this tree at 0.169 ms: the small steps again, this tree against the snapshot of 6bf982b (before v60;
# .bench-snap-head), side by side in two rounds, untuned (--no-tune: the defaults, since the shipped table holds no
# lenet shapes for the H100). Then resnet50's forward-only pass at b64 with the H100's table as shipped from v61b's
# tuning (a fresh cache, --no-tune): whether the table alone gives the tuned 1.02x. Carry .whl and .bench-snap-head.
set -u
source bench/h200_env.sh
one() { timeout 60 python3 -m clnet.cli bench "$1" --batch "$2" --device gpu --compare cuda --iterations 200 --no-tune 2>&1 \
  | grep -E "^clnet bench|, clnet on|replayed|^cuDNN:|ratio"; }
small() { one lenet 1; one lenet-wide 1; one lenet 64; }
SIDES=". .bench-snap-head" on_sides 2 small > "$OUT/small-steps.log" 2>&1
echo "done at $SECONDS s" >> "$OUT/small-steps.log"
CLNET_CACHE_DIR=/tmp/cache-r50 timeout 120 python3 -m clnet.cli bench resnet50 --batch 64 --forward-only --device gpu \
  --compare cuda --no-tune 2>&1 | grep -v -i warn > "$OUT/r50-fwd-shipped.log"
echo "all done at $SECONDS s" >> "$OUT/small-steps.log"
