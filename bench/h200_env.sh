# Sourced by the bench/run_h200*.sh scripts: installs the carried wheels (.whl: pyopencl and what it needs) into
# /tmp/site, puts them and this checkout on PYTHONPATH, and makes $OUT (the device tool's result folder).
# NO_WHEELS=1: a dry run on a machine whose own pyopencl is installed (the wheels are for the H200's Python 3.12)
if [ "${NO_WHEELS:-0}" != 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
