#!/usr/bin/env bash
# bench/NOTES.md v63's second call (carry .whl and .data): what v62b's call on the H200 measured but could not bring
# back (a call returns 8 files; its seed and SGEMM logs were the 9th and 10th), then resnet50's forward-only pass at b64,
# 0.95x there with the shipped table: retuned on the H200 (`clnet tune resnet50 --batch 64 --retune`, 220 s budget,
# the largest shapes first), the cache saved for bench/ship_tuning.py, and timed again at b64 and b1.
set -u
source bench/h200_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/progress.log"
STAGE=seed bash bench/run_h200_v55.sh > /dev/null
echo "seed done at $SECONDS s" >> "$OUT/progress.log"
timeout 60 python3 bench/sgemm.py --device gpu --sizes 4096 2>&1 | grep -v -i warn > "$OUT/sgemm.log"
echo "sgemm done at $SECONDS s" >> "$OUT/progress.log"
export CLNET_CACHE_DIR=/tmp/cache-r50
timeout 300 python3 -m clnet.cli tune resnet50 --batch 64 --retune --budget 220 --device gpu 2>&1 | grep -v -i warn \
  | tail -40 > "$OUT/r50-tune.log"
cp /tmp/cache-r50/tuning-v*.json "$OUT/"
echo "tune done at $SECONDS s" >> "$OUT/progress.log"
for b in 64 1; do
  timeout 100 python3 -m clnet.cli bench resnet50 --batch $b --forward-only --device gpu --compare cuda --no-tune 2>&1 \
    | grep -E "clnet on|replayed|^cuDNN:|ratio"
done > "$OUT/r50-fwd-tuned.log"
echo "all done at $SECONDS s" >> "$OUT/progress.log"
