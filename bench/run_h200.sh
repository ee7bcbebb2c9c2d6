#!/usr/bin/env bash
# Everything measured on the lent H200 in one call: devices, the test suite on NVIDIA's OpenCL, gemm_tiled variants
# (VARIANTS=1), SGEMM against cuBLAS, the host cost of a lenet step, and every zoo model against PyTorch + cuDNN (each
# bench autotunes its shapes first). Run through the device tool with .whl carried. At most 8 files come back from
# $OUT, so text goes to one log and JSON to one file per model plus one each for SGEMM and its variants.
set -u
source bench/h200_env.sh
LOG="$OUT/h200.log"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
  python3 -m clnet.cli devices
} 2>&1 | tee "$LOG"
if [ "${RUN_TESTS:-1}" = 1 ]; then
  # PYTEST_K selects tests by id, e.g. "not 1-cpu": tests run on every device, and the device's index and name are in
  # the id (the lent machine's PoCL device is "cpu-skylake-...", not "pthread-..." as on the CI machine)
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -x -p no:cacheprovider ${TESTS:-tests} ${PYTEST_K:+-k "$PYTEST_K"} \
    2>&1 | tail -30 | tee -a "$LOG"
fi
if [ "${VARIANTS:-0}" = 1 ]; then
  # no binary cache: the build logs (registers, spills) come only from builds from source
  PYOPENCL_NO_CACHE=1 timeout 300 python3 bench/sgemm_variants.py --device gpu --n 4096 \
    --json "$OUT/sgemm-variants-h200.json" 2>&1 | tee -a "$LOG"
fi
timeout 200 python3 bench/sgemm.py --device gpu --sizes ${SGEMM_SIZES:-1024 4096 8192} ${SWEEP:+--sweep} \
  --json "$OUT/sgemm-h200.json" \
  2>&1 | tee -a "$LOG"
if [ "${PROFILE:-1}" = 1 ]; then
  timeout 100 python3 bench/host_profile.py --device gpu --model lenet --batch 64 2>&1 | head -30 | tee -a "$LOG"
fi
for m in ${MODELS:-lenet lenet-wide alexnet overfeat vgg-a}; do
  timeout 200 python3 -m clnet.cli bench "$m" --device gpu --compare cuda --iterations ${ITERS:-10} --warmup 3 \
    --json "$OUT/bench-$m-h200.json" 2>/tmp/bench-stderr.txt | tee -a "$LOG"
  # progress bars stay out of the log; the tuning summary and any disagreement go in
  grep -E "^(tuning:|ERROR)" /tmp/bench-stderr.txt | tee -a "$LOG"
done
