#!/usr/bin/env bash
# Branch offset-args (bench/NOTES.md v47): kernels take (buffer, byte offset) pairs, and GPUs take large tensors as
# blocks of the arena with no sub-buffer. What the CPU could not show, in two device calls, base = main's snapshot:
#   mkdir .bench-snap-base && git archive main clnet cl_kernels bench | tar -x -C .bench-snap-base &&
#   cp bench/depthwise.py .bench-snap-base/bench/ && git rev-parse --short main > .bench-snap-base/.rev
#   PART=memory bash bench/run_h200_offsets.sh    # resnet50 b128 twice each way, mobilenet_v2 b64 once: peak memory
#                                                  # beside PyTorch's, and the step times (issue 26's memory target)
#   PART=networks bash bench/run_h200_offsets.sh  # the eight torchvision networks' steps, each side (no slower?)
# (carry .whl and .bench-snap-base; results in $OUT/memory.log and $OUT/networks.log)
set -u
SIDES=${SIDES:-.bench-snap-base .}
if [ "${PART:-memory}" = memory ]; then
  SIDES="$SIDES" MODELS="resnet50:128" ROUNDS=2 bash bench/run_h200_memory.sh > /dev/null 2>&1
  SIDES="$SIDES" MODELS="mobilenet_v2:64" bash bench/run_h200_memory.sh > /dev/null 2>&1
else
  SIDES="$SIDES" ROUNDS=1 NETS=${NETS:-squeezenet1_1,densenet121,googlenet,resnet50,resnet18,vgg11_bn,mobilenet_v2,mnasnet1_0} \
    bash bench/run_h200_networks.sh
fi
