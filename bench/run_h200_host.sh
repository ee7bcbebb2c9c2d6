#!/usr/bin/env bash
# Issues 16 and 17's H200 figures, on a fresh machine. JOBS picks the parts, run in the order given (default: first
# tune bench train tests):
#   first  first runs with empty caches (`clnet bench lenet` and `clnet bench alexnet`, each then run again)
#   tune   the small zoo models tuned;  bench  their iterations against PyTorch eager and as CUDA graphs (lenet and
#          lenet-wide at batch 64 and 1, alexnet);  train  lenet-wide's batch-1 Fashion-MNIST epoch
#   tests  the graph, memory, large-tensor, training, layer, gemv and zero_grad tests on NVIDIA's OpenCL
#   cost   bench/replay_cost.py (LONG_LOOP: also that many replays back to back), the GPU's clocks sampled
#   faults bench/out_of_memory.py, `clnet bench` at a batch that does not fit, bench/large_tensors.py
#   large  bench/large_tensors.py alone (a crash prints its Python stack)
#   bigbuf bench/big_buffer_check.py (device copies, sub-buffers and fills at offsets past 8 GiB)
#   fitcost bench/fit_cost.py: fit's step at batch 1 against the loader alone and the bare replay
#   table  alexnet tuned further, the table rebuilt from the cache here, and alexnet's first run on empty caches again
#   zoo    each of MODELS tuned (TUNE_S seconds) and benchmarked against PyTorch
# Carries .whl and .data. Files in $OUT: h200-host.log, bench-h200.json (every bench record by name), tuning-v2.json
# (the tuning cache, for bench/ship_tuning.py), train-lenet-wide-b1.json, replay-flush.json. Steps stop being started
# after DEADLINE_S seconds (default 540).
set -u
source bench/h200_env.sh
LOG=$OUT/h200-host.log
DEADLINE_S=${DEADLINE_S:-540}
timed() { local t0; t0=$(date +%s.%N); "$@"; local rc=$?
  echo "wall $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}") s (exit $rc): $*"; }
late() { [ "$SECONDS" -ge "$DEADLINE_S" ] && echo "skipped after ${SECONDS} s: $*"; }
fresh_caches() { rm -rf ~/.cache/pyopencl ~/.cache/clnet ~/.nv/ComputeCache "${XDG_CACHE_HOME:-/nonexistent}/clnet"; }
keep_cache() { cp ~/.cache/clnet/tuning-v*.json "$OUT/" 2>/dev/null; }
JSON_DIR=$(mktemp -d)
bench_json() {  # MODEL NAME ARGS...: `clnet bench` with --compare cuda, its record merged into bench-h200.json
  local m=$1 name=$2; shift 2
  timed timeout 150 python3 -m clnet.cli bench "$m" --device gpu --compare cuda --json "$JSON_DIR/$name.json" "$@" \
    2>/tmp/bench-stderr.txt
  grep -E "^(tuning:|ERROR|Error|Traceback|[A-Za-z]*Error)" /tmp/bench-stderr.txt
  python3 - "$JSON_DIR" "$OUT/bench-h200.json" <<'PY'
import glob, json, os, sys
merged = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.json")))}
json.dump(merged, open(sys.argv[2], "w"), indent=1)
PY
}
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
for job in ${JOBS:-first tune bench train tests}; do
  late "$job" && continue
  echo "== $job at ${SECONDS} s"
  case $job in
    first)  # a new user's first command, empty caches; the second run of each shows what caching leaves
      fresh_caches
      timed python3 -m clnet.cli bench lenet --device gpu 2>&1 | grep -E "first iteration|tuning:|wall|images/s"
      timed python3 -m clnet.cli bench lenet --device gpu 2>&1 | grep -E "first iteration|tuning:|wall|images/s"
      fresh_caches
      timed python3 -m clnet.cli bench alexnet --device gpu 2>&1 | grep -E "first iteration|tuning:|wall|images/s"
      timed python3 -m clnet.cli bench alexnet --device gpu 2>&1 | grep -E "first iteration|tuning:|wall|images/s"
      keep_cache ;;
    tune)
      for spec in "lenet" "lenet --batch 1" "lenet-wide --batch 1" "lenet-wide" "alexnet"; do
        late "tune $spec" && continue
        timed timeout 120 python3 -m clnet.cli tune $spec --device gpu --budget 90 2>&1 | tail -1
        keep_cache
      done ;;
    bench)
      for spec in ${BENCHES:-lenet:64 lenet-wide:1 lenet:1 lenet-wide:64 alexnet:128}; do
        late "bench $spec" || bench_json "${spec%:*}" "${spec%:*}-b${spec#*:}" --batch "${spec#*:}" --iterations 50
      done
      keep_cache ;;
    train)  # the seed's workload: a whole epoch at batch 1, with the README's batch-1 learning rate
      timed timeout 240 python3 -m clnet.cli train lenet-wide --batch 1 --epochs 1 --lr ${B1_LR:-0.001} --momentum 0.9 \
        --dataset fashion-mnist --data-dir .data --device gpu --log "$OUT/train-lenet-wide-b1.json" 2>&1 \
        | grep -v "^\s*$" | tail -8 ;;
    cost)
      nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv -lms 250 \
        >"$OUT/clocks-cost.csv" & smi_pid=$!
      timed timeout 150 python3 bench/replay_cost.py --device gpu --model lenet:64 --model lenet-wide:1 \
        --long-loop ${LONG_LOOP:-0} --json "$OUT/replay-cost.json"
      kill $smi_pid ;;
    large)
      timed timeout 150 python3 -X faulthandler bench/large_tensors.py --device gpu ;;
    bigbuf)
      timed timeout 120 python3 bench/big_buffer_check.py --device gpu ;;
    fitcost)
      for spec in ${FITS:-lenet-wide:1 lenet:64}; do
        timed timeout 150 python3 bench/fit_cost.py --device gpu --model "${spec%:*}" --batch "${spec#*:}" \
          --steps 3000 --json "$OUT/fit-cost-${spec%:*}-b${spec#*:}.json"
      done ;;
    table)
      timed timeout 200 python3 -m clnet.cli tune alexnet --device gpu --budget ${TUNE_S:-120} 2>&1 | tail -1
      keep_cache
      python3 bench/ship_tuning.py ~/.cache/clnet/tuning-v*.json
      fresh_caches
      timed python3 -m clnet.cli bench alexnet --device gpu 2>&1 | grep -E "first iteration|tuning:|wall|images/s" ;;
    faults)
      timed timeout 120 python3 bench/out_of_memory.py --device gpu --model resnet50 --batch 2048 --then 64
      timed timeout 120 python3 -m clnet.cli bench resnet50 --batch 2048 --device gpu --no-tune 2>&1 | tail -3
      timed timeout 150 python3 -X faulthandler bench/large_tensors.py --device gpu ;;
    zoo)
      for m in ${MODELS:-googlenet resnet18 resnet50 vgg-a overfeat}; do
        late "zoo $m" && continue
        timed timeout 200 python3 -m clnet.cli tune "$m" --device gpu --budget ${TUNE_S:-60} 2>&1 | tail -1
        keep_cache
        late "bench $m" || bench_json "$m" "$m" --iterations 10
      done ;;
    tests)  # bit-identical replays, transfers, memory on NVIDIA's OpenCL
      CLNET_TEST_DEVICES=nvidia timed timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_graph.py \
        tests/test_memory.py tests/test_large_tensors.py tests/test_train.py 2>&1 | tail -6
      CLNET_TEST_DEVICES=nvidia timed timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_layers.py \
        -k "fuses or conv2d or linear or pool" 2>&1 | tail -4
      CLNET_TEST_DEVICES=nvidia timed timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_device.py \
        tests/test_autograd.py -k "one_row or gemm_layouts or zero_grad" 2>&1 | tail -4 ;;
  esac
done
} 2>&1 | tee "$LOG"
