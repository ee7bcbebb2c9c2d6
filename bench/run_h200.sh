#!/usr/bin/env bash
# Everything measured on the lent H200 in one call: devices, the test suite on NVIDIA's OpenCL, SGEMM against cuBLAS,
# and every zoo model against PyTorch + cuDNN. Run through the device tool with .whl carried; results land in $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
python3 -m clnet.cli devices | tee -a "$OUT/gpu.txt"
if [ "${RUN_TESTS:-1}" = 1 ]; then
  (cd tests && timeout 300 python3 -m pytest -q -x -p no:cacheprovider . 2>&1 | tail -15) | tee "$OUT/tests-h200.txt"
fi
timeout 120 python3 bench/sgemm.py --device gpu --sizes ${SGEMM_SIZES:-1024 4096 8192} --json "$OUT/sgemm-h200.json"
for m in ${MODELS:-lenet lenet-wide alexnet overfeat vgg-a}; do
  timeout 200 python3 -m clnet.cli bench "$m" --device gpu --compare cuda --iterations ${ITERS:-10} --warmup 3 \
    --json "$OUT/bench-$m-h200.json" 2>/dev/null | tee "$OUT/bench-$m-h200.txt"
done
