#!/usr/bin/env bash
# Depthwise convolutions on the lent H200 in one call (issue 26): the depthwise tests on NVIDIA's OpenCL, then
# bench/depthwise.py's layers (clnet's kernels in both shapes and im2col, against cuDNN with TF32 off) and whole
# training steps of NETWORKS (clnet eager and replayed, before and after, against PyTorch eager and its CUDA graph).
# Run through the device tool with .whl carried (pyopencl and its needs, as for bench/run_h200.sh). Files in $OUT:
# depthwise-h200.log, depthwise-h200.json (and with CPU=1 depthwise-h200-pocl.json: the host's PoCL against PyTorch
# CPU).
set -u
source bench/h200_env.sh
LOG="$OUT/depthwise-h200.log"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -m clnet.cli devices
} 2>&1 | tee "$LOG"
if [ "${RUN_TESTS:-1}" = 1 ]; then
  CLNET_TEST_DEVICES=nvidia timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_depthwise.py 2>&1 \
    | tail -8 | tee -a "$LOG"
fi
timeout ${BENCH_TIMEOUT:-360} python3 bench/depthwise.py --device gpu --torch cuda --batch ${BATCH:-64} \
  ${BENCH_ARGS:---before --other-shape} --networks "${NETWORKS:-mobilenet_v2}" --json "$OUT/depthwise-h200.json" \
  2>&1 | grep -v Warning | tee -a "$LOG"
if [ "${CPU:-0}" = 1 ]; then
  # the host's PoCL against PyTorch CPU, side by side (the CPU target of issue 26 is mobilenet_v2 at batch 16)
  timeout ${CPU_TIMEOUT:-200} python3 bench/depthwise.py --device portable --torch cpu --batch ${CPU_BATCH:-16} \
    --mobilenet-only --repeats 3 --inner 3 --networks mobilenet_v2 --iterations 3 --warmup 1 \
    --json "$OUT/depthwise-h200-pocl.json" 2>&1 | grep -v Warning | tee -a "$LOG"
fi
