#!/usr/bin/env bash
# The next session's device calls (bench/NOTES.md v53, v54 were measured on H100s only): on the H200 the issue
# measures on, each STAGE one call (carry .whl, and .data for "seed", .bench-snap-base for "networks"):
#   STAGE=networks bash bench/run_h200_v55.sh   the eight networks, eb79adc (.bench-snap-base) against this tree,
#                                               one round (about 8 minutes; NETS= to pick)
#   STAGE=seed bash bench/run_h200_v55.sh       the seed's workload, `clnet train lenet-wide --batch 1 --epochs 1
#                                               --lr 0.001` (.data: the four Fashion-MNIST .gz files), whose test
#                                               figures are right since bc3de18; lenet b1 and b64 with --compare cuda
#   STAGE=tune bash bench/run_h200_v55.sh       squeezenet1_1 tuned on the card (cache in $OUT/cache for
#                                               bench/ship_tuning.py: the H200's family has no squeezenet entries)
set -u
source bench/h200_env.sh
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.log"
case ${STAGE:-networks} in
  networks)
    SIDES=".bench-snap-base ." ROUNDS=1 NETS=${NETS:-squeezenet1_1,googlenet,densenet121,resnet18,resnet50,vgg11_bn,mobilenet_v2,mnasnet1_0} \
      bash bench/run_h200_networks.sh ;;
  seed)
    {
      t=$SECONDS
      CLNET_CACHE_DIR=/tmp/cache timeout 150 python3 -m clnet.cli train lenet-wide --batch 1 --epochs 1 --lr 0.001 \
        --dataset fashion-mnist --data-dir .data --device gpu 2>&1 | grep -v -i warn | tail -4
      echo "wall $((SECONDS - t)) s: clnet train lenet-wide --batch 1 --epochs 1 --lr 0.001"
      for spec in lenet:1 lenet:64 lenet-wide:1; do
        CLNET_CACHE_DIR=/tmp/cache timeout 120 python3 -m clnet.cli bench "${spec%:*}" --batch "${spec#*:}" \
          --device gpu --compare cuda --iterations 200 2>&1 | grep -E "clnet on|replayed|ratio|eager"
      done
    } 2>&1 | tee "$OUT/seed.log" ;;
  tune)
    NETS="squeezenet1_1:150" bash bench/run_h200_tune_networks.sh ;;
esac
