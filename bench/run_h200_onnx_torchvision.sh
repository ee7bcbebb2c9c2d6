#!/usr/bin/env bash
# Issue 25's torchvision table on the lent H200: bench/onnx_torchvision.py with clnet on NVIDIA's OpenCL and PyTorch
# on CUDA. Run through the device tool from a snapshot of a commit (git archive into .bench-snap, .whl copied inside,
# .bench-snap carried; see bench/NOTES.md "ONNX torchvision table"), as `cd .bench-snap && bash bench/run_h200_onnx_torchvision.sh`.
# The Python script gets at most TIMEOUT seconds and starts no model after DEADLINE seconds, so the call ends inside
# the tool's limit; extra arguments go to the script (e.g. --phases ts-eval --models resnet18).
# Files in $OUT: onnx-torchvision.log (all text), onnx-torchvision.jsonl (one record a model and phase, appended as
# each ends) and table.md (rewritten after each record), so a call cut short keeps what it finished.
# POCL=1: PoCL on the machine's CPUs (its wheel installed too, `clnet devices` listed first), e.g.
#   POCL=1 OUT=$OUT/pocl bash bench/run_h200_onnx_torchvision.sh --device cpu --torch-device cpu --iterations 0 \
#     --no-step
# On the CPU (a dry run without torchvision): NO_WHEELS=1 OUT=/tmp/tv bash bench/run_h200_onnx_torchvision.sh \
#   --family zoo --models resnet8 --batch 2 --device 0 --torch-device cpu --workers 1 --threads 1
# Issue 25's ReLU flips (run 4): TIMEOUT=330 bash bench/run_h200_onnx_torchvision.sh \
#   --shared-relu resnet18,alexnet,resnet50 --threads 16
set -u
source bench/h200_env.sh
LOG="$OUT/onnx-torchvision.log"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
  echo "commit $(cat COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null)"
  grep -m1 "model name" /proc/cpuinfo; nproc
  if [ "${POCL:-0}" = 1 ]; then timeout 120 python3 -m clnet.cli devices; fi
} 2>&1 | tee "$LOG"
timeout ${TIMEOUT:-385} python3 bench/onnx_torchvision.py --out "$OUT" --deadline ${DEADLINE:-345} "$@" 2>&1 \
  | grep -v -E "^(1 warning generated|\[torch.onnx\])" | tee -a "$LOG"
echo "exit ${PIPESTATUS[0]} after $SECONDS s" | tee -a "$LOG"
