#!/usr/bin/env bash
# bench/NOTES.md v61's open question, run in v62 (bench/results/h100-v62/): why lenet b1's replay went 0.206 ->
# 0.249 ms on the untuned H100 with v60's im2col default. lenet b1's kernels one by one at this tree
# (bench/step_kernels.py: which of its 18 launches holds the time); then lenet b1 untuned (--no-tune: the defaults) at
# this tree and at copies of it with a lower tuning.SPLIT_K_MIN_DEPTH (the conv 20->50 forward's product, 50 x 64 x
# 500, is one work-group of 32 serial slices: split-K starts at K >= 512). Make the copies with
#   for d in 128 64; do mkdir .bench-snap-sk$d && git archive HEAD clnet cl_kernels bench | tar -x -C .bench-snap-sk$d &&
#     sed -i "s/^SPLIT_K_MIN_DEPTH = 256/SPLIT_K_MIN_DEPTH = $d/" .bench-snap-sk$d/clnet/tuning.py &&
#     echo "HEAD + SPLIT_K_MIN_DEPTH $d" > .bench-snap-sk$d/.rev; done
# and carry .whl and the two snapshots (about 150 s). Then lenet b1 at this tree tuned (--tune, a fresh cache): the
# tuner's choice for the shapes the shipped table lacks (on the H200 the table holds lenet's, so --no-tune is tuned).
# Then, while the call's 600 s last, resnet50's forward-only pass at b64 (issue 26: 0.93x PyTorch's CUDA graph on the
# untuned H100, v59) at the defaults, after `clnet tune resnet50` (its cache kept in $OUT/cache for
# bench/ship_tuning.py), and again: whether tuned choices reach 1.0x.
set -u
source bench/h200_env.sh
kern() { PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 40 python3 bench/step_kernels.py --device gpu --model lenet --batch 1 2>&1 | grep -v -i warn; }
one() { timeout 50 python3 -m clnet.cli bench "$1" --batch 1 --device gpu --compare cuda --iterations 200 --no-tune 2>&1 | grep -v -i warn; }
SIDES="." on_sides 1 kern > "$OUT/lenet-b1-kernels.log" 2>&1
{
SIDES=". .bench-snap-sk128 .bench-snap-sk64" on_sides 1 one lenet
echo "== this tree, tuned first (a fresh cache: what the tuner picks where no table entry exists)"
CLNET_CACHE_DIR=$OUT/cache-lenet timeout 90 python3 -m clnet.cli bench lenet --batch 1 --device gpu --compare cuda \
  --iterations 200 --tune 2>&1 | grep -v -i warn
echo "done at $SECONDS s"
} > "$OUT/lenet-b1-splits.log" 2>&1
r50() { timeout 100 python3 -m clnet.cli bench resnet50 --batch 64 --forward-only --device gpu --compare cuda "$@" 2>&1 | grep -v -i warn; }
export CLNET_CACHE_DIR=$OUT/cache
r50 --no-tune > "$OUT/r50-fwd-defaults.log"
left=$((560 - SECONDS - 80))
if [ $left -gt 60 ]; then
  timeout $((left + 30)) python3 -m clnet.cli tune resnet50 --batch 64 --device gpu --budget $left 2>&1 | grep -v -i warn | tail -4 > "$OUT/r50-tune.log"
  r50 > "$OUT/r50-fwd-tuned.log"
fi
echo "all done at $SECONDS s" >> "$OUT/lenet-b1-splits.log"
