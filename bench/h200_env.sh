# Sourced by the bench/run_h200*.sh scripts: installs the carried wheels (.whl: pyopencl and what it needs) into
# /tmp/site, puts them and this checkout on PYTHONPATH, and makes $OUT (the device tool's result folder).
# PoCL's wheel (pocl_binary_distribution, which puts libpocl and its ICD file beside pyopencl's own ICD loader) goes
# in only with POCL=1, then with the others into /tmp/site-pocl, so that a GPU run sees the GPU alone, as before.
# NO_WHEELS=1: a dry run on a machine whose own pyopencl is installed (the wheels are for the H200's Python 3.12)
SITE=/tmp/site
if [ "${POCL:-0}" = 1 ]; then SITE=/tmp/site-pocl; fi
if [ "${NO_WHEELS:-0}" != 1 ]; then
  wheels=$(ls .whl/*.whl | grep -v pocl_binary_distribution)
  if [ "${POCL:-0}" = 1 ]; then wheels=$(ls .whl/*.whl); fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE $wheels \
    || exit 1
fi
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"

# on_sides ROUNDS COMMAND...: COMMAND (a function of the calling script, say) in each of $SIDES in turn (folders of
# this checkout: a base's snapshot with its .rev, or . for this tree), ROUNDS times over, a heading before each; each
# side runs itself (on PYTHONPATH) with its own kernel and tuning cache.
on_sides() {
  local rounds=$1 root=$PWD round side
  shift
  for round in $(seq "$rounds"); do
    for side in $SIDES; do
      echo "== round $round, side $side ($(cat "$root/$side/.rev" 2>/dev/null || echo "this tree")) at $SECONDS s"
      (cd "$root/$side" && export PYTHONPATH=$SITE:$PWD CLNET_CACHE_DIR=/tmp/cache-$(basename "$PWD") && "$@")
    done
  done
}
