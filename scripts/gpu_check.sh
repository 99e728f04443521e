#!/usr/bin/env bash
# Everything a session with a lent GPU runs, in stages that each fit one device `run` (10 min):
#
#   bash ../shared/gpu/pack.sh                        # on the development machine, once: .gpu/
#   run (carry [".gpu"]):  bash scripts/gpu_check.sh tests
#   run (carry [".gpu"]):  bash scripts/gpu_check.sh sanitize
#   run (carry [".gpu"]):  bash scripts/gpu_check.sh bench
#   run (carry [".gpu"]):  bash scripts/gpu_check.sh torch
#   run (carry [".gpu"]):  bash scripts/gpu_check.sh tune     # the longest: tune_bench with --measure gpu
#
# Each stage installs tcstage from the working tree (../shared/gpu/README.md: the GPU machine has
# no package registry; .gpu/unpack.sh brings halide, islpy, pycuda, optuna), then writes logs and
# reports under $OUT (the device tool brings them back; default ./gpu-out). Commit the reports
# under benchmarks/results/ with the GPU named (nvidia-smi.txt names it).
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:?usage: scripts/gpu_check.sh tests|sanitize|bench|torch|tune}
out=${OUT:-gpu-out}
mkdir -p "$out"
status=0
step() { echo "=== $* ($(date +%H:%M:%S))"; }
record() {  # record NAME CMD...: runs CMD, its output in $out/NAME.log, a failure remembered
    local name=$1; shift
    step "$name: $*"
    "$@" > "$out/$name.log" 2>&1
    local rc=$?
    tail -n 15 "$out/$name.log"
    echo "--- $name exit $rc"
    [ $rc -eq 0 ] || status=1
}

step "setup"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 && head -n 12 "$out/nvidia-smi.txt"
# shellcheck disable=SC1091
source .gpu/unpack.sh > "$out/unpack.log" 2>&1 || { tail "$out/unpack.log"; exit 1; }
pip install -q --no-deps --no-build-isolation -e . > "$out/install.log" 2>&1 \
    || { tail "$out/install.log"; exit 1; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | tr ' ' '-' | tr -cd 'A-Za-z0-9-')
day=$(date +%Y-%m-%d)

case "$stage" in
tests)
    record pytest-gpu python3 -m pytest -q -m gpu -p no:cacheprovider tests
    record gpu-examples python3 scripts/gpu_examples.py ;;
sanitize)
    record memcheck compute-sanitizer --tool memcheck --error-exitcode 1 python3 scripts/gpu_examples.py
    record racecheck compute-sanitizer --tool racecheck --error-exitcode 1 python3 scripts/gpu_examples.py ;;
bench)
    record gpu-bench python3 benchmarks/gpu_bench.py --out "$out/gpu-$gpu-$day.md"
    record launch-bench python3 benchmarks/launch_bench.py --out "$out/launch-$gpu-$day.md"
    record halide-bench python3 benchmarks/halide_bench.py --gpu --no-write ;;
torch)
    record train-mlp python3 examples/train_mlp.py --device cuda --epochs 5
    record torch-bench python3 benchmarks/torch_bench.py --device cuda --no-write ;;
tune)
    record tune-bench python3 benchmarks/tune_bench.py --measure gpu --budget 40 --out "tune-gpu-$gpu"
    cp benchmarks/results/tune-gpu-"$gpu"* "$out"/ 2>/dev/null ;;  # (it writes in the tree)
*)
    echo "unknown stage '$stage': tests, sanitize, bench, torch or tune"; exit 2 ;;
esac
exit $status
