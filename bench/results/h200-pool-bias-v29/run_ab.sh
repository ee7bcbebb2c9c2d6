set -u
source bench/h200_env.sh
NEW=$PWD; OLD=$PWD/../.bench-snap1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; lscpu | grep "Model name"; date -u
R="bench/graph_replay.py --device gpu --model lenet-wide --batch 1 --model lenet --batch 1 --model lenet --batch 64 --steps 200 --repeats 7"
for round in 1 2; do
  for side in old new; do
    dir=$NEW; [ $side = old ] && dir=$OLD
    echo "== replay $side $round"
    (cd $dir && CLNET_CACHE_DIR=$OUT/cache-$side PYTHONPATH=/tmp/site:$dir timeout 150 python3 $R --json $OUT/replay-$side-$round.json 2>&1 | grep -v warn | cut -c1-250)
  done
done
for side in new old; do
  dir=$NEW; [ $side = old ] && dir=$OLD
  echo "== train $side"
  (cd $dir && CLNET_CACHE_DIR=$OUT/cache-$side PYTHONPATH=/tmp/site:$dir timeout 120 python3 -m clnet.cli train lenet-wide --batch 1 --epochs 1 --lr 0.001 --dataset fashion-mnist --data-dir $NEW/.data --device gpu 2>&1 | grep -v warn | tail -3)
done
echo "== fit_cost new"
CLNET_CACHE_DIR=$OUT/cache-new timeout 120 python3 bench/fit_cost.py --device gpu --model lenet-wide --batch 1 --steps 3000 --repeats 3 --profile 2>&1 | grep -v warn | head -45
date -u
