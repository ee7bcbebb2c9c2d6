#!/usr/bin/env bash
# Everything measured on the lent H200 in one call: devices, the test suite on NVIDIA's OpenCL, gemm_tiled variants
# (VARIANTS=1), SGEMM against cuBLAS (SGEMM=0 skips it), the host cost of a lenet step, and every zoo model against
# PyTorch + cuDNN (each bench autotunes its shapes first). Run through the device tool with .whl carried.
#
# Files: at most 8 come back from $OUT, so there are at most four, whatever MODELS holds: h200.log (all text),
# bench-h200.json (every model's `clnet bench --json` record, merged into one object keyed by model name and
# rewritten after each model, so a call cut short keeps the models done), sgemm-h200.json and sgemm-variants-h200.json.
# One device call runs at most 10 minutes: the eight default models do not fit in one (googlenet, resnet18 and
# resnet50 tune for up to 2 minutes each on a fresh machine), so run them in groups, e.g.
#   RUN_TESTS=0 PROFILE=0 SGEMM=0 MODELS="googlenet resnet18" bash bench/run_h200.sh
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
if [ "${SGEMM:-1}" = 1 ]; then
  timeout 200 python3 bench/sgemm.py --device gpu --sizes ${SGEMM_SIZES:-1024 4096 8192} ${SWEEP:+--sweep} \
    --json "$OUT/sgemm-h200.json" \
    2>&1 | tee -a "$LOG"
fi
if [ "${PROFILE:-1}" = 1 ]; then
  timeout 100 python3 bench/host_profile.py --device gpu --model lenet --batch 64 2>&1 | head -30 | tee -a "$LOG"
fi
JSON_DIR=$(mktemp -d)
for m in ${MODELS:-lenet lenet-wide alexnet overfeat vgg-a googlenet resnet18 resnet50}; do
  timeout ${BENCH_TIMEOUT:-300} python3 -m clnet.cli bench "$m" --device gpu --compare cuda --iterations ${ITERS:-10} \
    --warmup 5 --json "$JSON_DIR/$m.json" 2>/tmp/bench-stderr.txt | tee -a "$LOG"
  # progress bars stay out of the log; the tuning summary and any disagreement or failure go in
  grep -E "^(tuning:|ERROR|Error|Traceback|[A-Za-z]*Error)" /tmp/bench-stderr.txt | tee -a "$LOG"
  python3 - "$JSON_DIR" "$OUT/bench-h200.json" <<'EOF'
import glob, json, os, sys
merged = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.json")))}
with open(sys.argv[2], "w") as f:
    json.dump(merged, f, indent=1)
EOF
done
