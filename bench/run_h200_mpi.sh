#!/usr/bin/env bash
# Data-parallel runs on a lent H200 (issue 14; bench/mpi_prediction.md predicts them). RANKS ranks (default 2): on
# nvidia-h200 they share the one GPU (correctness on NVIDIA's OpenCL and the cost of the host round trip), on
# nvidia-h200-x2 and larger each takes its own GPU (scaling). Carries .whl: pyopencl and its needs as for
# bench/run_h200.sh, plus the mpich and mpi4py wheels (`pip download mpich mpi4py -d .whl`), and .data (the four
# Fashion-MNIST .gz files) for the training run. JOBS picks the parts (default: tests bench train). `clnet bench` and
# `clnet train` under mpiexec need the cli.py/bench.py wiring of issue 14's integration patch.
set -u
source bench/h200_env.sh
export PATH=/tmp/site/bin:$PATH  # pip --target puts mpich's mpiexec there
RANKS=${RANKS:-2}
command -v mpiexec >/dev/null || { echo "no mpiexec: carry the mpich wheel in .whl"; exit 1; }
python3 -c "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])" || exit 1
# An mpiexec of one MPI and an mpi4py loading another make every rank rank 0 of 1: clnet.distributed.init() refuses
# that (MPIMismatch, naming the launcher's variable); stop here rather than in each job. A likely cure on an image
# with a system Open MPI, not tried here: put the mpich wheel's libraries first (LD_LIBRARY_PATH=/tmp/site/lib).
mpiexec -n 2 python3 -c "import clnet.distributed as d; print(d.init())" || exit 1
nvidia-smi -L
timed() { local t=$SECONDS; "$@"; echo "wall $((SECONDS - t)) s: $*"; }
for job in ${JOBS:-tests bench train}; do
  case $job in
    tests)  # two ranks against one process, resume across world sizes, failing and hanging ranks: on the GPU
      CLNET_MPI_TEST_DEVICE=nvidia timed python3 -m pytest -q -rs tests/test_distributed.py 2>&1 | tail -6 ;;
    bench)  # per-rank and aggregate images/s, efficiency, where the all-reduce's time goes
      for m in ${MODELS:-lenet resnet18 googlenet resnet50 alexnet vgg-a}; do
        timed timeout 300 mpiexec -n "$RANKS" python3 -m clnet.cli bench "$m" --device gpu \
          --json "$OUT/mpi-bench-$m-n$RANKS.json"
      done ;;
    train)  # the same global batch on one rank and on RANKS ranks: the curves should match (lenet has no BN)
      timed timeout 300 python3 -m clnet.cli train lenet --epochs 2 --batch 128 --dataset fashion-mnist \
        --data-dir .data --device gpu --log "$OUT/mpi-train-lenet-n1.json"
      timed timeout 300 mpiexec -n "$RANKS" python3 -m clnet.cli train lenet --epochs 2 --batch 128 \
        --dataset fashion-mnist --data-dir .data --device gpu --log "$OUT/mpi-train-lenet-n$RANKS.json" ;;
  esac
done 2>&1 | grep -v "^\s*$" | tail -80 | tee "$OUT/mpi-h200.log"
