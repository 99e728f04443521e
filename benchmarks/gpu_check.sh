#!/usr/bin/env bash
# tcstage on a real GPU in one command, with a results file named after the GPU.
#
#   bash benchmarks/gpu_check.sh pack          # development machine, once: .gpu/ (see below)
#   run (carry [".gpu"]):  bash benchmarks/gpu_check.sh
#
# On a GPU machine prepared as ../shared/gpu/README.md says (.gpu/ carried along), in one device
# `run` (10 minutes; each step has a time budget, `timeout`, and the whole run GPU_CHECK_BUDGET
# seconds, default 540):
#   setup        .gpu/unpack.sh (halide, islpy, and pycuda: the wheel `pack` built where it
#                could, else built there, about 100 s), the test tools packed by `pack`, then
#                `pip install --no-deps --no-build-isolation -e .`, checked to link libstdc++
#                dynamically (setup.py says why)
#   gpu-tests    pytest -m gpu (tests/test_gpu.py: mapped kernels through pycuda, torch tensors)
#   gpu-bench    benchmarks/gpu_bench.py: the paper's kernels and issue 15's (sums, softmax,
#                layernorm, half/bf16 tmm with and without tensor cores) against PyTorch, and
#                Halide's apps against their own GPU schedules
#   real-gpu     pytest --real-gpu on the GPU-kernel tests (GPU_TESTS below): every emulated
#                launch also runs on the GPU and is compared (tests/real_gpu.py)
#   memcheck, racecheck   compute-sanitizer on scripts/gpu_examples.py (every example kernel)
# The last three run side by side, after the benchmark has had the GPU to itself.
#
# Where there is no GPU (no nvidia-smi, no device, or GPU_CHECK_CPU=1) the same command runs its
# CPU-side parts, so that it is exercised everywhere:
#   build        a wheel from the tracked files, installed into a scratch directory and imported
#   emulated-tests   the GPU-kernel tests (GPU_TESTS) under the CPU emulator
#   examples-emulated, examples-nvcc   scripts/gpu_examples.py emulated, and compiled by nvcc
#   bench-compile    benchmarks/gpu_bench.py --compile-only (launch shapes, registers, shared
#                memory from ptxas; a case that does not compile is a failed row)
# and its results file says that the GPU part is unmeasured.
#
# Other stages, each one device run of its own, GPU only:
#   torch    examples/train_mlp.py and benchmarks/torch_bench.py on CUDA
#   tune     benchmarks/tune_bench.py measuring on the GPU (the longest)
#   suite    the whole test suite with --real-gpu
#   extras   benchmarks/launch_bench.py and benchmarks/halide_bench.py --gpu
#   halide   benchmarks/gpu_bench.py --halide-long: bilateral_grid, local_laplacian and
#            interpolate against their own GPU schedules (minutes to compile each)
#
# Everything goes under $OUT (the device tool brings it back; default ./gpu-out): one log per
# step and gpu-check-<GPU>-<date>[-<stage>].md with each step's result, the benchmark tables and
# the tail of each failed step's log. Commit that file under benchmarks/results/.
# GPU_CHECK_QUICK=1 runs a tiny subset of every step (tests/test_gpu_scripts.py uses it).
# The exit status is 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:-check}
out=${OUT:-gpu-out}
quick=${GPU_CHECK_QUICK:-0}
[ "$quick" = 0 ] || quick=1
start=$SECONDS
day=$(date +%Y-%m-%d)
steps=()   # step names in the order they are reported

# The tests that run GPU kernels (emulated here, also on the GPU with --real-gpu); files that
# do not exist yet are left out.
GPU_TESTS=(tests/test_emulation*.py tests/test_cuda_*.py tests/test_paper_kernels.py
           tests/test_promotion.py tests/test_scatter.py tests/test_*reduction*.py
           tests/test_narrow_types.py tests/test_mma*.py tests/test_tensor_cores*.py
           tests/test_kernel_sequences.py tests/test_overlapped_tiles.py)
gpu_tests() {
    local f
    for f in "${GPU_TESTS[@]}"; do
        [ -f "$f" ] && [[ "$f" != tests/test_cpu_* ]] && echo "$f"
    done
}

# -- steps -----------------------------------------------------------------------------------

left() { echo $(( budget - (SECONDS - start) )); }

# record NAME SECONDS CMD...: runs CMD with a time limit of SECONDS (less if the run's budget is
# nearly spent), its output in $out/NAME.log; its result in $out/steps/NAME.
record() {
    local name=$1 limit=$2; shift 2
    local remaining; remaining=$(( $(left) - 15 ))
    (( limit > remaining )) && limit=$remaining
    if (( limit < 5 )); then
        printf 'skipped\t0\tno time left in the budget\n' > "$out/steps/$name"
        echo "=== $name: skipped, no time left"
        return 0
    fi
    echo "=== $name ($(date +%H:%M:%S), at most ${limit} s): $*"
    local t0=$SECONDS
    # (through bash, so that CMD may be one of the functions below, exported)
    timeout --kill-after=10 "$limit" bash -c '"$@"' "$name" "$@" > "$out/$name.log" 2>&1
    local rc=$? result=pass note=""
    if (( rc == 124 || rc == 137 )); then
        result=timeout note="stopped after its ${limit} s"
    elif (( rc != 0 )); then
        result=fail note="exit status $rc"
    fi
    printf '%s\t%s\t%s\n' "$result" $(( SECONDS - t0 )) "$note" > "$out/steps/$name"
    tail -n 12 "$out/$name.log"
    echo "--- $name: $result $note"
}

# Python steps that must not die on a missing GPU library are run by `python3 -c` snippets.
install_check() {  # imports what every later step needs, from wherever it is installed
    python3 - "$@" <<'EOF'
import importlib, sys
names = ["tcstage", "tcstage.halide._native", "halide", "islpy", "numpy"] + sys.argv[1:]
bad = []
for n in names:
    try:
        m = importlib.import_module(n)
        print(f"{n}: {getattr(m, '__version__', '')} {getattr(m, '__file__', '')}")
    except Exception as e:  # noqa: BLE001
        bad.append(f"{n}: {type(e).__name__}: {e}")
try:  # the extension must share libHalide's C++ runtime (tcstage/halide/elf.py says why)
    from tcstage.halide import _native, elf
    needed = elf.needed_libraries(_native.__file__)
    print("tcstage.halide._native needs:", " ".join(needed))
    if not any(n.startswith("libstdc++.so") for n in needed):
        bad.append("tcstage.halide._native carries a static libstdc++: it will crash")
except Exception as e:  # noqa: BLE001
    bad.append(f"reading tcstage.halide._native: {type(e).__name__}: {e}")
print("\n".join(bad))
sys.exit(1 if bad else 0)
EOF
}

build_wheel() {  # the tracked files, as in the tree, built into a wheel, installed and imported
    local scratch; scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' RETURN
    git ls-files -z | tar --null -T - -cf - | tar -C "$scratch" -xf - || return 1
    (cd "$scratch" && python3 -m pip wheel -q --no-deps --no-build-isolation -w dist .) || return 1
    python3 -m pip install -q --no-deps --target "$scratch/site" "$scratch"/dist/tcstage-*.whl \
        || return 1
    (cd "$scratch" && rm -rf tcstage && PYTHONPATH="$scratch/site" python3 -c '
import importlib.resources, tcstage, tcstage.halide._native
assert tcstage.__file__.startswith("'"$scratch/site"'"), tcstage.__file__
assert (importlib.resources.files("tcstage.cuda") / "emu_runtime.h").is_file()
print("built and imported", tcstage.__version__, "from", tcstage.__file__)')
}

pytest_args() {  # pytest_args MAX DIVISOR: -n <cores / DIVISOR, at most MAX> where pytest-xdist
    local cores; cores=$(( $(nproc 2>/dev/null || echo 1) / ${2:-1} ))   # is installed
    local workers=$(( cores > $1 ? $1 : cores ))
    if (( workers > 1 )) && python3 -c "import xdist" 2>/dev/null; then
        echo "-n $workers"
    fi
}

gpu_pytest() {  # pytest, failing where it ran nothing on a GPU (each test skipped for want of one)
    local log; log=$(mktemp)
    python3 -m pytest -q -rs -p no:cacheprovider "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    if grep -qE -- '--real-gpu: every test skipped|GPU tests need a GPU' "$log"; then
        echo "gpu_check: these tests ran nothing on a GPU (skipped, reason above): a failure here"
        rc=1
    fi
    rm -f "$log"
    return "$rc"
}

sanitizer() {
    command -v compute-sanitizer 2>/dev/null && return
    local nvcc; nvcc=$(command -v nvcc) || return 1
    local near; near=$(dirname "$nvcc")/compute-sanitizer
    [ -x "$near" ] && echo "$near" && return
    near=$(dirname "$(dirname "$nvcc")")/compute-sanitizer/compute-sanitizer
    [ -x "$near" ] && echo "$near"
}

setup_gpu_machine() {  # .gpu/ unpacked, the test tools it carries, tcstage installed editable
    if [ ! -f .gpu/unpack.sh ]; then
        echo ".gpu/ is missing: run 'bash benchmarks/gpu_check.sh pack' on the development" \
             "machine and carry .gpu with the tree" >&2
        return 1
    fi
    # unpack.sh builds pycuda the first time: under a time limit in a shell of its own first,
    # then sourced here (quickly) for its PYTHONPATH
    timeout 300 bash -c 'source .gpu/unpack.sh' || echo "unpack.sh exit status $?" >&2
    # shellcheck disable=SC1091
    source .gpu/unpack.sh
    if [ -d .gpu/extra ]; then  # the test tools the image may lack: only those it lacks
        local missing=() pair
        for pair in pytest:pytest xdist:pytest_xdist hypothesis:hypothesis attrs:attrs \
                    pybind11:pybind11 ml_dtypes:ml_dtypes pluggy:pluggy iniconfig:iniconfig \
                    packaging:packaging execnet:execnet sortedcontainers:sortedcontainers; do
            python3 -c "import ${pair%%:*}" 2>/dev/null && continue
            missing+=($(ls .gpu/extra/"${pair#*:}"-*.whl 2>/dev/null))
        done
        if (( ${#missing[@]} )); then
            python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
                "${missing[@]}" || return 1
        fi
    fi
    env | grep -E '^(LDFLAGS|CFLAGS|CXXFLAGS|CPPFLAGS|LDSHARED|CC|CXX)=' || true  # (the build's)
    echo "the C++ compiler's shared libstdc++: $("${CXX:-g++}" -print-file-name=libstdc++.so 2>&1)"
    python3 -m pip install -q --no-deps --no-build-isolation -e . \
        || python3 -m pip install -q --no-deps --no-build-isolation --break-system-packages -e . \
        || return 1
    install_check pycuda.driver
}

export -f install_check build_wheel setup_gpu_machine gpu_pytest

# -- the results file ---------------------------------------------------------------------------

revision() {
    local rev
    rev=$(git rev-parse --short HEAD 2>/dev/null) || { echo "(not a git checkout)"; return; }
    git diff --quiet HEAD 2>/dev/null && echo "$rev" || echo "$rev with local changes"
}

summary() {  # summary FILE TITLE MODE-LINE
    local file=$1 title=$2 mode=$3 name result seconds note log all=pass
    {
        echo "# $title"
        echo
        echo "$mode"
        echo
        local subset=""
        ((quick)) && subset=" (GPU_CHECK_QUICK=1: a tiny subset)"
        echo "Command: \`bash benchmarks/gpu_check.sh${stage_arg}\`$subset," \
             "$(date '+%Y-%m-%d %H:%M'), $(( SECONDS - start )) s in all; tcstage" \
             "$(revision)," \
             "Python $(python3 -c 'import platform; print(platform.python_version())')."
        echo
        echo "| step | result | seconds | note | log |"
        echo "|---|---|---:|---|---|"
        for name in "${steps[@]}"; do
            if [ -f "$out/steps/$name" ]; then
                IFS=$'\t' read -r result seconds note < "$out/steps/$name"
            else
                result=skipped seconds=0 note="not run"
            fi
            [ "$result" = pass ] || all=fail
            log=-
            [ -f "$out/$name.log" ] && log="$name.log"
            echo "| $name | $result | $seconds | $note | $log |"
        done
        echo
        echo "Overall: $all."
        for name in gpu-tests real-gpu emulated-tests suite; do
            [ -f "$out/$name.log" ] || continue
            echo
            echo "## pytest ($name)"
            echo
            echo '```'
            grep -E -- '^(--real-gpu|SKIPPED|FAILED|ERROR)' "$out/$name.log" | head -n 30
            grep -E '(passed|failed|skipped|error|no tests ran)' "$out/$name.log" | tail -n 1
            echo '```'
        done
        for f in "$out"/gpu-bench.md "$out"/bench-compile.md; do
            [ -f "$f" ] || continue
            echo
            sed -e 's/^# /## /' -e 's/^## \(The\|Reductions\|What\)/### \1/' "$f"
        done
        for name in "${steps[@]}"; do
            [ -f "$out/steps/$name" ] || continue
            IFS=$'\t' read -r result seconds note < "$out/steps/$name"
            [ "$result" = pass ] && continue
            [ -f "$out/$name.log" ] || continue
            echo
            echo "## $name: $result (last lines of $name.log)"
            echo
            echo '```'
            tail -n 25 "$out/$name.log"
            echo '```'
        done
    } > "$file"
    echo "=== results: $file"
    [ "$all" = pass ]
}

# -- stages -----------------------------------------------------------------------------------

has_gpu() {
    [ "${GPU_CHECK_CPU:-0}" = 0 ] || return 1
    command -v nvidia-smi >/dev/null 2>&1 || return 1
    nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

stage_arg=$([ "$stage" = check ] && echo "" || echo " $stage")

if [ "$stage" = pack ]; then
    # On the development machine: ../shared/gpu/pack.sh's .gpu/, plus what else the GPU image
    # lacks for building (pybind11), for bfloat16 arrays (ml_dtypes) and for the tests, as
    # Python 3.12 wheels in .gpu/extra: about 4 MB, chosen small (ml_dtypes 0.4, pytest before
    # 8.4 which needs pygments, hypothesis's pure wheel), since everything sent to the GPU
    # machine must stay under 64 MiB and pack.sh's part takes 56.
    # (pack.sh notes .gpu/ in .git/info/exclude, which a trimmed clone may lack the folder of)
    mkdir -p "$(git rev-parse --git-path info)"
    [ -f .gpu/halide.tar.xz ] || bash ../shared/gpu/pack.sh || exit 1
    # pycuda as a wheel built here (where a Python 3.12 and nvcc are): saves the GPU machine
    # about 100 s of compiling in every check
    bash scripts/build_pycuda_wheel.sh || exit 1
    rm -rf .gpu/extra && mkdir -p .gpu/extra
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/extra \
        "pytest<8.4" pytest-xdist attrs pybind11 "ml_dtypes>=0.4,<0.5" || exit 1
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation py --abi none --platform any -d .gpu/extra \
        hypothesis sortedcontainers || exit 1
    rm -f .gpu/extra/numpy-*.whl   # (the image has its own, which PyTorch was built against)
    du -sh .gpu .gpu/extra
    sent=$(( $(du -sb .gpu | cut -f1) + $(git ls-files -z | xargs -0 cat 2>/dev/null | wc -c) ))
    echo "with the tracked files: $(( sent / 1048576 )) MiB of the 64 MiB a device run may carry"
    (( sent < 64 * 1048576 ))
    exit $?
fi

mkdir -p "$out/steps" && out=$(cd "$out" && pwd)
if has_gpu; then
    budget=${GPU_CHECK_BUDGET:-540}
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
    tag=$(echo "$gpu" | tr ' ' '-' | tr -cd 'A-Za-z0-9-')
    nvidia-smi > "$out/nvidia-smi.txt" 2>&1
    results="$out/gpu-check-$tag-$day$([ "$stage" = check ] || echo "-$stage").md"
    mode="GPU: $gpu (nvidia-smi.txt has the driver and CUDA versions)."
    steps+=(setup)
    record setup 330 setup_gpu_machine
    # (unpack.sh's PYTHONPATH, for the steps below: record ran setup in a subshell)
    [ -f .gpu/unpack.sh ] && source .gpu/unpack.sh > /dev/null 2>&1
    workers=$(pytest_args 12 1)
    case "$stage" in
    check)
        steps+=(gpu-tests gpu-bench real-gpu memcheck racecheck)
        if ((quick)); then
            record gpu-tests 120 gpu_pytest -m gpu tests/test_gpu.py -k "tmm-0"
            record gpu-bench 120 python3 benchmarks/gpu_bench.py --only tmm-small,row_sum \
                --runs 20 --out "$out/gpu-bench.md"
            tests=(tests/test_emulation.py -k "matmul and not race")
            examples=(--only tmm,row_sum)
        else
            record gpu-tests 120 gpu_pytest -m gpu tests
            record gpu-bench 260 python3 benchmarks/gpu_bench.py --out "$out/gpu-bench.md"
            mapfile -t tests < <(gpu_tests)
            examples=()
        fi
        san=$(sanitizer) || san=compute-sanitizer
        for tool in memcheck racecheck; do
            record "$tool" 240 "$san" --tool "$tool" --error-exitcode 1 \
                python3 -W ignore scripts/gpu_examples.py "${examples[@]}" &
        done
        # shellcheck disable=SC2086
        record real-gpu 400 gpu_pytest --real-gpu $workers "${tests[@]}" &
        wait ;;
    torch)
        steps+=(train-mlp torch-bench)
        record train-mlp 200 python3 examples/train_mlp.py --device cuda --epochs 5
        record torch-bench 300 python3 benchmarks/torch_bench.py --device cuda --no-write ;;
    tune)
        steps+=(tune-bench)
        record tune-bench 520 python3 benchmarks/tune_bench.py --measure gpu --budget 40 \
            --out "tune-gpu-$tag"
        cp benchmarks/results/tune-gpu-"$tag"* "$out"/ 2>/dev/null ;;  # (it writes in the tree)
    suite)
        steps+=(suite)
        # shellcheck disable=SC2086
        record suite 520 gpu_pytest --real-gpu $workers tests ;;
    extras)
        steps+=(launch-bench halide-bench)
        record launch-bench 150 python3 benchmarks/launch_bench.py --out "$out/launch-$tag-$day.md"
        record halide-bench 300 python3 benchmarks/halide_bench.py --gpu --no-write ;;
    halide)
        steps+=(halide-long)
        record halide-long 520 python3 benchmarks/gpu_bench.py --halide-long \
            --out "$out/gpu-bench-halide-$tag-$day.md" ;;
    *)
        echo "unknown stage '$stage': (none), pack, torch, tune, suite, extras or halide"
        exit 2 ;;
    esac
    summary "$results" "tcstage on $gpu, $day" "$mode"
    exit $?
fi

# -- no GPU here: the CPU-side parts ------------------------------------------------------------
budget=${GPU_CHECK_BUDGET:-1800}
why="no nvidia-smi"
if [ "${GPU_CHECK_CPU:-0}" != 0 ]; then
    why="GPU_CHECK_CPU=1"
elif command -v nvidia-smi >/dev/null 2>&1; then
    why="nvidia-smi lists no GPU"
fi
results="$out/gpu-check-no-GPU-$day$([ "$stage" = check ] || echo "-$stage").md"
mode="No GPU here ($why): only the CPU-side parts ran. **The GPU part is unmeasured**: no kernel
ran on a GPU, no GPU test, no compute-sanitizer, no timing; the benchmark goals are not judged."
if [ "$stage" != check ]; then
    steps+=("$stage")
    printf 'skipped\t0\tneeds a GPU\n' > "$out/steps/$stage"
    summary "$results" "gpu_check $stage without a GPU, $day" "$mode"
    exit 1
fi
steps+=(build emulated-tests examples-emulated examples-nvcc bench-compile)
pytest=(python3 -m pytest -q -rs -p no:cacheprovider)
examples=(python3 -W ignore scripts/gpu_examples.py)
bench=(python3 benchmarks/gpu_bench.py --compile-only --out "$out/bench-compile.md")
if ((quick)); then
    record build 60 install_check
    record emulated-tests 120 "${pytest[@]}" tests/test_emulation.py -k "matmul and not race"
    record examples-emulated 120 "${examples[@]}" --target cuda-emulated --only tmm
    record examples-nvcc 120 "${examples[@]}" --compile-only --only tmm
    record bench-compile 120 "${bench[@]}" --only tmm-small,row_sum
else
    record build 300 build_wheel
    mapfile -t tests < <(gpu_tests)
    # shellcheck disable=SC2046
    record emulated-tests 900 "${pytest[@]}" $(pytest_args 8 2) "${tests[@]}"
    record examples-emulated 300 "${examples[@]}" --target cuda-emulated
    record examples-nvcc 300 "${examples[@]}" --compile-only
    record bench-compile 600 "${bench[@]}"
fi
summary "$results" "gpu_check without a GPU ($(hostname), $day)" "$mode"
