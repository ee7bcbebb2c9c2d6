# one H200 run: 81235fe (../.bench-snap1, before the launch-aware tuning) against this tree, alternating
set -u
source bench/h200_env.sh
NEW=$PWD; OLD=$PWD/../.bench-snap1
R="bench/graph_replay.py --device gpu --model lenet --batch 1 --model lenet-wide --batch 1 --model lenet --batch 64 --steps 200 --repeats 7"
for round in 1 2; do
  for side in old new; do
    dir=$NEW; [ $side = old ] && dir=$OLD
    (cd $dir && CLNET_CACHE_DIR=$OUT/cache-$side PYTHONPATH=/tmp/site:$dir python3 $R --json $OUT/replay-$side-$round.json 2>&1 | grep -v warn | cut -c1-200)
  done
done
for side in old new; do
  dir=$NEW; [ $side = old ] && dir=$OLD
  (cd $dir && CLNET_CACHE_DIR=$OUT/cache-$side PYTHONPATH=/tmp/site:$dir timeout 200 python3 -m clnet.cli train lenet-wide --batch 1 --epochs 1 --lr 0.001 --dataset fashion-mnist --data-dir $NEW/.data --device gpu 2>&1 | grep -v warn | tail -2 | sed "s/^/$side: /")
done
