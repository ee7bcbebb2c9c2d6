set -u
source bench/h200_env.sh
NEW=$PWD; OLD=$PWD/../.bench-snap1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep "Model name"; date -u
R="bench/graph_replay.py --device gpu --model lenet --batch 1 --model lenet-wide --batch 1 --steps 500 --repeats 9 --no-torch"
for round in 1 2 3 4 5; do
  for side in old new; do
    dir=$NEW; [ $side = old ] && dir=$OLD
    (cd $dir && CLNET_CACHE_DIR=$OUT/cache-$side PYTHONPATH=/tmp/site:$dir timeout 100 python3 $R --json $OUT/replay3-$side-$round.json 2>&1 | grep -v warn | python3 -c "
import sys, json
for line in sys.stdin:
    if line.startswith('{'):
        r = json.loads(line); print('$side $round', r['model'], r['batch'], r['launches'], round(r['replay_ms'], 4))")
  done
done
date -u
