#!/usr/bin/env bash
# Builds pycuda's source distribution in .gpu/wheels into a Python 3.12 wheel here, on the
# development machine, so that the GPU machine installs it in a second instead of compiling it
# for about 100 s of every GPU check (`bash benchmarks/gpu_check.sh pack` calls this).
#
#   bash scripts/build_pycuda_wheel.sh [PYTHON3.12]
#
# This machine has nvcc and CUDA's headers but no driver (no libcuda.so): the extension links
# against an empty stand-in named libcuda.so.1, kept as a needed library (--no-as-needed), and
# finds the real driver on the GPU machine. curand is left out (tcstage does not use it). Where
# no Python 3.12 is found the source distribution stays, and the GPU machine builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
sdist=$(ls .gpu/wheels/pycuda-*.tar.gz 2>/dev/null | head -n 1) || true
[ -n "$sdist" ] || { echo "no pycuda source distribution in .gpu/wheels: nothing to build"; exit 0; }
py=${1:-}
if [ -z "$py" ]; then  # the first candidate that runs (a pyenv shim may exist and refuse)
    for candidate in $(command -v python3.12) "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
        if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            py=$candidate
            break
        fi
    done
fi
cuda=""  # CUDA's root: the first of these with cuda.h (nvcc may be a wrapper script elsewhere)
nvcc=$(command -v nvcc || true)
for root in "${CUDA_HOME:-}" "${CUDA_PATH:-}" "$(dirname "$(dirname "$(readlink -f "${nvcc:-/}")")")" \
            /usr/local/cuda; do
    if [ -n "$root" ] && [ -f "$root/include/cuda.h" ]; then
        cuda=$root
        break
    fi
done
if [ -z "$py" ] || [ -z "$cuda" ]; then
    echo "no Python 3.12 or no CUDA toolkit here: pycuda stays a source distribution (the GPU machine" \
         "builds it, about 100 s)"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "building $(basename "$sdist") with $py"
"$py" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q numpy setuptools wheel 2>&1 | grep -v "^WARNING: Location" || true
mkdir "$work/stub" "$work/src"
echo 'void tcstage_stand_in_for_the_cuda_driver(void) {}' > "$work/stub/stub.c"
gcc -shared -fPIC -o "$work/stub/libcuda.so" -Wl,-soname,libcuda.so.1 "$work/stub/stub.c"
tar -xzf "$sdist" -C "$work/src" --strip-components=1
(
    cd "$work/src"
    "$work/venv/bin/python" configure.py --cuda-root="$cuda" \
        --cudadrv-lib-dir="$work/stub" --no-cuda-enable-curand > /dev/null
    LDFLAGS="-Wl,--no-as-needed" MAKEFLAGS="-j$(nproc)" "$work/venv/bin/python" -m pip wheel \
        --no-deps --no-build-isolation -w "$work/dist" . > "$work/build.log" 2>&1 \
        || { tail -n 30 "$work/build.log" >&2; exit 1; }
)
# without its debug information (the interpreter's -g), the wheel is 8 times smaller
"$work/venv/bin/python" -m wheel unpack -d "$work/check" "$work"/dist/pycuda-*.whl > /dev/null
strip --strip-debug "$work"/check/pycuda-*/pycuda/*.so
mkdir "$work/packed"
"$work/venv/bin/python" -m wheel pack -d "$work/packed" "$work"/check/pycuda-* > /dev/null
wheel=$(ls "$work"/packed/pycuda-*.whl)
needed=$("$work/venv/bin/python" -c '
import glob, importlib.util, sys
spec = importlib.util.spec_from_file_location("elf", "tcstage/halide/elf.py")
elf = importlib.util.module_from_spec(spec); spec.loader.exec_module(elf)
print(" ".join(elf.needed_libraries(glob.glob(sys.argv[1] + "/*/pycuda/_driver*.so")[0])))
' "$work/check")
case " $needed " in
    *" libcuda.so.1 "*) ;;
    *) echo "the built pycuda does not name libcuda.so.1 as needed ($needed)" >&2; exit 1 ;;
esac
mv "$wheel" .gpu/wheels/ && rm -f "$sdist"
echo "pycuda wheel: $(ls -s --block-size=K .gpu/wheels/pycuda-*.whl)"
