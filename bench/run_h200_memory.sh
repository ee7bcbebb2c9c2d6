#!/usr/bin/env bash
# Issue 26's memory target on the H200: `clnet bench MODEL --batch B --compare cuda` (peak device memory of the eager
# step beside PyTorch's caching allocator, and both engines' times) for each of SIDES (checkouts: a snapshot of the
# base made with `git archive`, and this one), alternated ROUNDS times, in one call. --no-tune: both sides run the
# shipped tuning table, so a first run's tuning budget does not differ between them.
#   SIDES=".bench-snap-base ." MODELS="resnet50:128 mobilenet_v2:64" bash bench/run_h200_memory.sh
set -u
source bench/h200_env.sh
ROOT=$PWD
LOG=$OUT/memory.log
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
for round in $(seq ${ROUNDS:-1}); do
  for m in ${MODELS:-resnet50:128}; do
    for side in ${SIDES:-.}; do
      cd "$ROOT/$side"
      export PYTHONPATH=/tmp/site:$PWD CLNET_CACHE_DIR=/tmp/cache-$(basename "$side")
      rev=$(cat .rev 2>/dev/null || git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)
      tag=$(basename "$PWD")
      echo "== round $round, ${m%%:*} batch ${m##*:}, side $side ($rev) at ${SECONDS} s"
      timeout ${LIMIT:-240} python3 -X faulthandler -m clnet.cli bench ${m%%:*} --batch ${m##*:} --device gpu \
        --compare cuda --no-tune --iterations ${ITERATIONS:-10} --warmup ${WARMUP:-3} \
        --json "$OUT/${m%%:*}-b${m##*:}-$tag-r$round.json" 2>&1 | grep -v Warning | tail -${TAIL:-24}
    done
  done
done
} 2>&1 | tee -a "$LOG"
