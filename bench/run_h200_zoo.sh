#!/usr/bin/env bash
# The zoo's networks on the lent H200, one `clnet bench MODEL --batch B --device gpu --compare cuda` each (issues 24
# and 26): clnet eager and replayed against PyTorch eager and its CUDA graph (TF32 off), peak device memory of both,
# per-module times. Run through the device tool from a snapshot of the commit (git archive, .whl inside; see
# bench/NOTES.md v19) with .whl carried as for bench/run_h200.sh. MODELS lists MODEL:BATCH; each run gets at most
# BENCH_TIMEOUT seconds and none starts after DEADLINE seconds, so the call ends inside the tool's 10 minutes.
# Files in $OUT: zoo-h200.log (all text) and bench-zoo-h200.json (each model's --json record with its exit status,
# wall time and command; rewritten after each model, so a call cut short keeps the models done). TUNE="m1 m2" runs
# `clnet tune` (at most TUNE_BUDGET seconds) on those models before their bench.
# On the CPU (a dry run): NO_WHEELS=1 DEVICE=0 COMPARE=torch-cpu MODELS="shufflenet_v2_x1_0:2" bash bench/run_h200_zoo.sh
set -u
source bench/h200_env.sh
LOG="$OUT/zoo-h200.log"
MERGED="$OUT/bench-zoo-h200.json"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"
  echo "commit $(cat COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null)"
  python3 -m clnet.cli devices
} 2>&1 | tee "$LOG"
TMP=$(mktemp -d)
for spec in ${MODELS:-mobilenet_v2:64 efficientnet_b0:64 shufflenet_v2_x1_0:64 convnext_tiny:64 vit_b_16:64 resnet18:128}; do
  m=${spec%%:*} b=${spec##*:}
  left=$((${DEADLINE:-540} - SECONDS)) limit=${BENCH_TIMEOUT:-150}
  [ $left -lt $limit ] && limit=$left
  if [ $limit -lt 30 ]; then echo "== $m: not run, $left s left before the deadline" | tee -a "$LOG"; continue; fi
  if [[ " ${TUNE:-} " == *" $m "* ]]; then  # TUNE lists models to tune fully first (`clnet tune`, TUNE_BUDGET s)
    t0=$SECONDS
    echo "== clnet tune $m --batch $b --device ${DEVICE:-gpu} --budget ${TUNE_BUDGET:-100}" | tee -a "$LOG"
    timeout $((${TUNE_BUDGET:-100} + 60)) python3 -m clnet.cli tune "$m" --batch "$b" --device ${DEVICE:-gpu} \
      --budget ${TUNE_BUDGET:-100} 2>&1 | tr '\r' '\n' | grep -v "^\s*$" | tail -40 >>"$LOG"
    echo "== $m: tuned in $((SECONDS - t0)) s" | tee -a "$LOG"
    left=$((${DEADLINE:-540} - SECONDS))
    [ $left -lt $limit ] && limit=$left
  fi
  cmd="clnet bench $m --batch $b --device ${DEVICE:-gpu} --compare ${COMPARE:-cuda} --iterations ${ITERS:-10} --warmup ${WARMUP:-5}"
  echo "== $cmd (at most $limit s)" | tee -a "$LOG"
  t0=$SECONDS
  rm -f "$TMP/record.json"
  timeout $limit python3 -m clnet.cli ${cmd#clnet } --json "$TMP/record.json" >"$TMP/stdout.txt" 2>"$TMP/stderr.txt"
  rc=$?
  cat "$TMP/stdout.txt" >>"$LOG"
  tr '\r' '\n' <"$TMP/stderr.txt" | grep -E "^(tuning:|ERROR|Traceback|  File|[A-Za-z.]*(Error|Exception|OutOfMemory))" \
    | tail -30 >>"$LOG"
  [ $rc -ne 0 ] && [ $rc -ne 1 ] && tr '\r' '\n' <"$TMP/stderr.txt" | grep -v "^\s*$" | tail -25 >>"$LOG"
  echo "== $m: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
  python3 bench/zoo_summary.py add "$MERGED" "$m" $rc $((SECONDS - t0)) "$cmd" "$TMP/record.json" "$TMP/stderr.txt"
  grep -E "^(clnet / |whole iteration|peak device|agreement)" "$TMP/stdout.txt"
done
python3 bench/zoo_summary.py table "$MERGED" | tee -a "$LOG"
