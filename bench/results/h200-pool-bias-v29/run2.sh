set -u
source bench/h200_env.sh
NEW=$PWD; OLD=$PWD/../.bench-snap1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; lscpu | grep "Model name"; date -u
echo "== copy cost"
CLNET_CACHE_DIR=$OUT/cache-new timeout 100 python3 bench/copy_cost.py --device gpu 2>&1 | grep -v warn
R="bench/graph_replay.py --device gpu --model lenet --batch 1 --model lenet-wide --batch 1 --steps 200 --repeats 7"
for round in 1 2; do
  for side in old new; do
    dir=$NEW; [ $side = old ] && dir=$OLD
    echo "== replay $side $round"
    (cd $dir && CLNET_CACHE_DIR=$OUT/cache-$side PYTHONPATH=/tmp/site:$dir timeout 150 python3 $R --json $OUT/replay2-$side-$round.json 2>&1 | grep -v warn | cut -c1-200)
  done
done
for side in old new; do
  dir=$NEW; [ $side = old ] && dir=$OLD
  echo "== train $side"
  (cd $dir && CLNET_CACHE_DIR=$OUT/cache-$side PYTHONPATH=/tmp/site:$dir timeout 120 python3 -m clnet.cli train lenet-wide --batch 1 --epochs 1 --lr 0.001 --dataset fashion-mnist --data-dir $NEW/.data --device gpu 2>&1 | grep -v warn | tail -2)
done
date -u
