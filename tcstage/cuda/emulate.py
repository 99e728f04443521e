"""Run CUDA C kernels on the CPU with CUDA's block, thread, barrier and shared-memory semantics.

CI has no GPU, so the CUDA source tcstage generates is compiled by the host C++ compiler against
`emu_runtime.h`, which spells CUDA's extensions for a CPU: every thread of a block is a
cooperative fiber, `__syncthreads()` hands control back to the block's scheduler, `__shared__`
variables exist once per block being run, and blocks run one after another. A barrier that not
all of a block's threads reach, or reach at different `__syncthreads()` calls, is an error, as are
`__trap()`, a failed `assert`, and faults (wild pointers, integer division by zero, stack
overflow), which end the launch instead of the process; so does running past a time limit
(`TIME_LIMIT`, or `time_limit=`): the emulator runs a GPU's threads one at a time, and a kernel
that loops forever must not hold the process.

Warps: a warp is 32 consecutive linear thread ids of the block (x fastest; the last one may be
partial), and the warp collectives `__shfl_sync`, `__shfl_up_sync`, `__shfl_down_sync`,
`__shfl_xor_sync` (with CUDA's `width`; any type of up to 8 bytes), `__syncwarp`,
`__ballot_sync`, `__any_sync`, `__all_sync`, `__activemask`, the `__reduce_*_sync` of sm_80 and
the tensor core step of `device_lib.MMA_LIB` have CUDA's semantics. A lane that reaches one
stops, and the scheduler runs the rest of its warp, alone, until every lane named in the mask has
arrived, then resolves it. Every lane the mask names must reach the same collective (same call
site, kind and mask; `__syncwarp` may differ in call site, as on sm_70+), else the launch ends
with "divergent warp collective"; a mask naming a lane past the block's threads, a lane that has
returned, or not the calling lane, and a `width` that is not a power of 2 up to 32, are errors too
(CUDA leaves these undefined). A shuffle reading a lane the mask leaves out (undefined in CUDA: real
code must not use it) returns 0 where that lane is past the block's threads, as an H200 did, and
else the reader's own value. `__activemask()` returns the lanes that
reach that call site together.

Race detection: `emulate` runs the kernel on private copies of the arrays under two schedules,
forward (blocks and, within every barrier phase, threads in increasing linear index) and reverse
(both decreasing), and compares every array afterwards. A difference means the result depends on
thread scheduling, i.e. a data race or a missing `__syncthreads()` or `__syncwarp()`, and raises
`EmulationRaceError`; otherwise the result is copied into the caller's arrays. Within a barrier
phase a fiber runs until it returns, reaches the barrier or reaches a warp collective; in the last
case its whole warp runs on to the end of the phase before the order moves on, its lanes taking
turns between collectives in the order's own sequence. So a phase is a serialisation of the
block's warps (of its threads, if it has no collectives), which forward and reverse reverse:
a race between two warps, or between two lanes between collectives, is seen as in a kernel
without collectives. A collective orders the memory accesses of the lanes it names, as
`__syncwarp` does (CUDA promises this only for `__syncwarp`). This finds the races that change
results under those schedules, not all races: a non-atomic `x += 1` by all threads never loses an
update here, since fibers switch only at barriers and collectives; races whose racing writes
store equal values are invisible as well. Add "shuffle" to `schedules` for a third,
pseudo-random order. The private copies sit between red zones, so writes just out of bounds are
reported too. Floating-point atomics (atomicAdd on float, double, half, bfloat16, and any
atomicCAS, which is how CUDA code builds the others) legitimately round differently in each
order, so after them floating-point results are compared with a tolerance.

`half` arrays are numpy float16; `__nv_bfloat16` arrays are ml_dtypes' bfloat16 (`bfloat16()`),
and the runtime's `__nv_bfloat16` has the conversions and operators of CUDA's, so the mixed
expressions nvcc finds ambiguous (`bf16 + float`) fail here too.

Compiled kernels are cached in `cache_dir()` ($TCSTAGE_CACHE_DIR/emu, else
$XDG_CACHE_HOME/tcstage/emu or ~/.cache/tcstage/emu), keyed by the source, the runtime header,
the compiler and its flags, each written atomically with the digest of its bytes beside it and
loaded only where they match (tcstage.diskcache); an unwritable cache is left alone, with a
warning. Linux only (x86-64 uses a hand-written context switch, other architectures ucontext).

    emulate(source, "vadd", grid=(4, 1, 1), block=(128, 1, 1), args=[c, a, b, n])
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import math
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence

import attrs
import numpy as np

from tcstage import diskcache
from tcstage.cuda.tool import run_tool
from tcstage.errors import TCError

__all__ = [
    "EmulationError", "EmulationRaceError", "EmulatedKernel", "KernelSignature", "Param",
    "SCHEDULES", "bfloat16", "cache_dir", "compile_kernels", "emulate", "parse_kernels",
]

_HERE = os.path.dirname(os.path.abspath(__file__))
_HEADER = os.path.join(_HERE, "emu_runtime.h")
# -fno-delete-null-pointer-checks: GCC 12.2 reads an ivopts address based on a negated pointer as
# a NULL dereference, stops scanning the block there and so misses the kernel's stores: its late
# pure/modref summaries call the kernel pure and the launcher's call is deleted (a launch that
# silently does nothing; tests/test_emulation.py has the reduced kernel). The flag turns off
# that inference; a kernel never relies on it.
CXX_FLAGS = ("-std=c++17", "-O1", "-shared", "-fPIC", "-pthread", "-fvisibility=hidden",
             "-fno-gnu-unique", "-fno-strict-aliasing", "-fno-delete-null-pointer-checks")
if platform.machine().lower() in ("x86_64", "amd64"):
    # The runtime's fiber switch returns into fresh stacks, which CET shadow stacks forbid; an
    # unmarked library is never run with them.
    CXX_FLAGS += ("-fcf-protection=none",)
DEFAULT_STACK_SIZE = 64 * 1024
# Seconds one launch may run before it ends with an EmulationError (`time_limit` overrides it;
# inf: no limit).
TIME_LIMIT = 120.0
# Seconds the C++ compiler may take on one translation unit (then it and its children are killed)
COMPILE_TIME_LIMIT = 600.0
# Blocks one launch may have: the runtime keeps an order of them (8 bytes each) and runs them
# one after another; CUDA's 2^31 - 1 would need 16 GiB before the first block ran.
MAX_BLOCKS = 1 << 24
# Block and thread orders the runtime knows (tcemu::Order), by schedule name.
SCHEDULES = {"forward": 0, "reverse": 1, "shuffle": 2}


class EmulationError(TCError):
    """A kernel failed while running under emulation (divergent barrier, trap, failed assert)."""


class EmulationRaceError(EmulationError):
    """A kernel's result depends on the order in which its threads run."""


# --- kernel signatures --------------------------------------------------------------------------

# C type (qualifiers removed, words single-spaced) -> numpy dtype, for the LP64 ABI of the hosts
# tcstage supports (Linux, macOS); the generated launcher static_asserts the sizes.
_C_TYPES = {
    "float": "float32", "double": "float64", "half": "float16", "__half": "float16",
    "__nv_bfloat16": "bfloat16", "nv_bfloat16": "bfloat16",
    "bool": "bool", "char": "int8", "signed char": "int8", "int8_t": "int8",
    "unsigned char": "uint8", "uint8_t": "uint8",
    "short": "int16", "short int": "int16", "signed short": "int16", "int16_t": "int16",
    "unsigned short": "uint16", "unsigned short int": "uint16", "uint16_t": "uint16",
    "int": "int32", "signed": "int32", "signed int": "int32", "int32_t": "int32",
    "unsigned": "uint32", "unsigned int": "uint32", "uint32_t": "uint32",
    "long": "int64", "long int": "int64", "long long": "int64", "long long int": "int64",
    "int64_t": "int64", "ptrdiff_t": "int64",
    "unsigned long": "uint64", "unsigned long int": "uint64", "unsigned long long": "uint64",
    "unsigned long long int": "uint64", "uint64_t": "uint64", "size_t": "uint64",
}
_C_SPELLING = {"signed": "int", "signed int": "int", "unsigned": "unsigned int"}
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict"}


@attrs.frozen
class Param:
    """One kernel parameter: `decl` as written, `ctype` the (pointee) type without qualifiers."""

    name: str
    decl: str
    ctype: str
    pointer: bool
    const: bool  # a pointer to const data: the kernel cannot write the array

    @property
    def dtype(self) -> np.dtype | None:
        d = _C_TYPES.get(self.ctype)
        return _numpy_dtype(d) if d else None


def _numpy_dtype(name: str) -> np.dtype:
    """numpy's dtype of that name; bfloat16 is ml_dtypes' (numpy has none)."""
    if name == "bfloat16":
        return bfloat16()
    return np.dtype(name)


def bfloat16() -> np.dtype:
    """numpy's dtype for CUDA's __nv_bfloat16 arrays: ml_dtypes.bfloat16, imported on first use."""
    try:
        import ml_dtypes
    except ImportError as e:
        raise TCError("bfloat16 arrays need the ml_dtypes package (pip install ml_dtypes), which "
                      "gives numpy a bfloat16 dtype") from e
    return np.dtype(ml_dtypes.bfloat16)


def _is_floating(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype.name == "bfloat16"


@attrs.frozen
class KernelSignature:
    name: str
    params: tuple[Param, ...]
    unsupported: str | None = None  # why the emulator cannot call it, if it cannot


_TOKEN = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)


def _strip_comments(source: str) -> str:
    """Blanks out comments (keeping newlines and string literals) so declarations parse."""
    def blank(m: re.Match) -> str:
        t = m.group(0)
        return t if t[0] in "\"'" else re.sub(r"[^\n]", " ", t)
    return _TOKEN.sub(blank, source)


def _balanced(text: str, open_at: int) -> int:
    """Index just past the parenthesis closing the one at `open_at`, or -1."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def _split_params(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "(<[":
            depth += 1
        elif c in ")>]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _parse_param(kernel: str, text: str) -> Param | str:
    """A `Param`, or a string saying why the parameter is not supported."""
    decl = " ".join(text.split())
    if "=" in decl or "&" in decl or "(" in decl:
        return f"parameter '{decl}' of kernel '{kernel}' is not supported by the emulator"
    m = re.fullmatch(r"(.*?)([A-Za-z_]\w*)\s*(\[\s*\])?", decl)
    if not m:
        return f"cannot read parameter '{decl}' of kernel '{kernel}'"
    type_text, name = m.group(1), m.group(2)
    stars = type_text.count("*") + (1 if m.group(3) else 0)
    before_star = type_text.split("*")[0]
    words = re.findall(r"[A-Za-z_]\w*", type_text)
    const = stars > 0 and "const" in re.findall(r"[A-Za-z_]\w*", before_star)
    base = " ".join(w for w in words if w not in _QUALIFIERS)
    base = base.replace("std::", "")
    if stars > 1:
        return f"parameter '{name}' of kernel '{kernel}' is a pointer to a pointer ({decl}), " \
               "which the emulator does not support"
    if base not in _C_TYPES:
        return f"parameter '{name}' of kernel '{kernel}' has type '{base}', which the emulator " \
               f"does not support (supported: {', '.join(sorted(_C_TYPES))})"
    return Param(name=name, decl=decl, ctype=_C_SPELLING.get(base, base), pointer=stars == 1,
                 const=const)


def parse_kernels(source: str) -> dict[str, KernelSignature]:
    """The `__global__` functions of a CUDA source, by name, with their parameters."""
    text = _strip_comments(source)
    kernels: dict[str, KernelSignature] = {}
    for m in re.finditer(r"\b__global__\b", text):
        pos, name = m.end(), None
        # Words (and __launch_bounds__(...)) up to the parameter list; the last word is the name.
        while True:
            w = re.compile(r"\s*([A-Za-z_]\w*|\()").match(text, pos)
            if not w:
                break
            if w.group(1) == "(":
                if name is None:
                    break
                close = _balanced(text, w.start(1))
                if close < 0:
                    break
                inner = text[w.end(1):close - 1].strip()
                raw = [] if inner in ("", "void") else _split_params(inner)
                params, problem = [], None
                for p in raw:
                    r = _parse_param(name, p)
                    if isinstance(r, str):
                        problem = problem or r
                    else:
                        params.append(r)
                kernels[name] = KernelSignature(name, tuple(params), problem)
                break
            if w.group(1) == "__launch_bounds__":
                paren = text.find("(", w.end())
                close = _balanced(text, paren) if paren >= 0 else -1
                if close < 0:
                    break
                pos = close
                continue
            name, pos = w.group(1), w.end()
    return kernels


# --- compiling ----------------------------------------------------------------------------------

# CUDA headers whose contents the runtime provides; a host compiler has none of them. The
# assert headers go too, since the runtime's assert ends the launch instead of the process.
_PROVIDED_HEADERS = re.compile(
    r'^[ \t]*#[ \t]*include[ \t]*[<"](cuda_runtime\.h|cuda_runtime_api\.h|cuda\.h|cuda_fp16\.h|'
    r'cuda_bf16\.h|device_launch_parameters\.h|math_constants\.h|assert\.h|cassert)[>"][^\n]*$',
    re.M)


def cache_dir() -> str:
    """Where compiled kernels live: $TCSTAGE_CACHE_DIR/emu (beside the tuning cache), else
    $XDG_CACHE_HOME/tcstage/emu, else ~/.cache/tcstage/emu (tcstage.diskcache)."""
    return os.path.join(diskcache.root(), "emu")


def _compiler() -> str:
    cxx = os.environ.get("TCSTAGE_CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise TCError("the CUDA emulator needs a C++17 compiler: none of $TCSTAGE_CXX, g++ or c++ "
                      "was found")
    return cxx


_versions: dict[str, str] = {}


def _compiler_version(cxx: str) -> str:
    if cxx not in _versions:
        try:
            out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
            _versions[cxx] = out.stdout
        except (OSError, subprocess.SubprocessError) as e:
            raise TCError(f"cannot run the C++ compiler '{cxx}': {e}") from e
    return _versions[cxx]


def _launcher_symbol(kernel: str) -> str:
    return f"tcemu_launch_{kernel}"


def _translation_unit(source: str, kernels: dict[str, KernelSignature]) -> str:
    body = _PROVIDED_HEADERS.sub(lambda m: "// (provided by the emulator) " + m.group(0).strip(),
                                 source)
    if re.search(r"\bextern\s+__shared__\b", _strip_comments(body)):
        raise TCError("dynamic shared memory (extern __shared__) is not supported by the CUDA "
                      "emulator; declare __shared__ arrays with constant sizes")
    out = ['#include "emu_runtime.h"', '#line 1 "kernel.cu"', body, "", '#line 1 "<launcher>"']
    sizes = {}
    for k in kernels.values():
        if k.unsupported:
            continue
        args = []
        for i, p in enumerate(k.params):
            sizes[p.ctype] = p.dtype.itemsize
            args.append(f"static_cast<{p.ctype}*>(a[{i}])" if p.pointer
                        else f"*static_cast<{p.ctype}*>(a[{i}])")
        out += [
            f"static void tcemu_invoke_{k.name}(void** a) {{",
            f"  (void)a; {k.name}({', '.join(args)});",
            "}",
            f'extern "C" __attribute__((visibility("default"))) int {_launcher_symbol(k.name)}('
            "void** a, const long long* grid, const long long* block, const long long* only, "
            "long long selected, int block_order, int thread_order, unsigned long long seed, "
            "long long stack_size, double time_limit, char* message, long long message_len, "
            "int* flags) {",
            f"  return ::tcemu::launch(tcemu_invoke_{k.name}, a, grid, block, only, selected, "
            "block_order, thread_order, seed, stack_size, time_limit, message, message_len, "
            "flags);",
            "}",
        ]
    # numpy's dtype and the C type must agree on size for the pointer casts above to be right.
    out += [f'static_assert(sizeof({t}) == {n}, "{t} is not {n} bytes on this host");'
            for t, n in sizes.items()]
    return "\n".join(out) + "\n"


_lock = threading.Lock()
_libraries: dict[str, tuple[ctypes.CDLL, int]] = {}
# Room on a fiber's stack beyond the compiler's frame sizes, for libc and libm calls (printf).
_STACK_MARGIN = 32 * 1024


def _stack_estimate(directory: str) -> int:
    """Bytes of stack a CUDA thread may need: every frame GCC reported (-fstack-usage) at once.

    Summing all frames bounds any non-recursive call chain, and kernels cannot be deep; it keeps
    large per-thread arrays from running into a fiber's guard page.
    """
    total = 0
    for name in os.listdir(directory):
        if name.endswith(".su"):
            with open(os.path.join(directory, name)) as f:
                for line in f:
                    fields = line.rstrip("\n").split("\t")
                    if len(fields) >= 2 and fields[-2].isdigit():
                        total += int(fields[-2])
    # Whole multiples of 64 KiB, so kernels rarely make the runtime remap its fiber stacks.
    return -(-(total + _STACK_MARGIN) // (64 * 1024)) * (64 * 1024)


def _compile(tu: str, defines: Sequence[str]) -> tuple[ctypes.CDLL, int]:
    """The compiled translation unit, loaded, and the stack size its threads need."""
    cxx = _compiler()
    flags = [*CXX_FLAGS, *(f"-D{d}" for d in defines)]
    if "clang" in _compiler_version(cxx):
        flags.remove("-fno-gnu-unique")  # GCC only; clang emits no STB_GNU_UNIQUE symbols
    with open(_HEADER, "rb") as f:
        header = f.read()
    key = hashlib.sha256(b"\0".join([
        tu.encode(), header, " ".join([cxx, *flags]).encode(), _compiler_version(cxx).encode(),
        b"digest-checked",  # (libraries of earlier versions, without digests, are not looked up)
    ])).hexdigest()[:32]
    with _lock:
        if key in _libraries:
            return _libraries[key]
        directory = _kernel_directory()
        path = os.path.join(directory, f"{key}.so")
        stack_path = os.path.join(directory, f"{key}.stack")
        digest_path = os.path.join(directory, f"{key}.sha256")
        if not diskcache.verified(path, digest_path, "the CUDA emulator's cached kernel"):
            # Build under temporary names and rename: concurrent processes never load half a file.
            with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as tmp:
                src = os.path.join(tmp, "kernel.cpp")
                with open(src, "w") as f:
                    f.write(tu)
                out = os.path.join(tmp, "kernel.so")
                pch = _precompiled_header(cxx, flags, header)
                cmd = [cxx, *flags, "-fstack-usage", "-I", _HERE, "-x", "c++", src, "-o", out]
                r = _run_compiler(cmd[:1] + ["-I", pch] + cmd[1:] if pch else cmd, tmp)
                if r.returncode != 0 and pch:  # (a damaged .gch fails the compile: do without)
                    with contextlib.suppress(OSError):
                        os.remove(os.path.join(pch, "emu_runtime.h.gch"))
                    _pch_ready.pop(pch, None)
                    r = _run_compiler(cmd, tmp)
                if r.returncode != 0:
                    raise TCError("the CUDA emulator could not compile the kernel source:\n"
                                  + (r.stderr or r.stdout).replace(src, "<emulator>").strip())
                with open(os.path.join(tmp, "stack"), "w") as f:
                    f.write(str(_stack_estimate(tmp)))
                # The .stack and the digest go first, so that every cached .so has them.
                os.replace(os.path.join(tmp, "stack"), stack_path)
                diskcache.publish(out, path, digest_path)
        try:
            with open(stack_path) as f:
                stack = int(f.read())
        except (OSError, ValueError):
            stack = DEFAULT_STACK_SIZE
        _libraries[key] = (ctypes.CDLL(path), stack)
        return _libraries[key]


_CACHE = diskcache.LibraryCache("emu", "the CUDA emulator")


def _kernel_directory() -> str:
    """cache_dir(), created, where kernels can be written there; else, with a warning, a
    directory of this process's own."""
    return _CACHE.directory(cache_dir())


def _run_compiler(cmd: list[str], cwd: str):
    try:
        return run_tool(cmd, timeout=COMPILE_TIME_LIMIT, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        raise TCError(f"the C++ compiler for the CUDA emulator took longer than "
                      f"{COMPILE_TIME_LIMIT} s on the kernel source") from e
    except OSError as e:
        raise TCError(f"cannot run the C++ compiler for the CUDA emulator: {e}") from e


def _precompiled_header(cxx: str, flags: list[str], header: bytes) -> str | None:
    """A directory holding the runtime header and GCC's precompiled form of it for these
    flags, made once per header, compiler and flags (under `cache_dir()`), or None (clang, or
    GCC could not make one). Parsing the header is most of a kernel's compile (0.22 of 0.5 s
    here, and a cold test suite compiles about 800 kernels); GCC takes `<dir>/emu_runtime.h.gch`
    in place of the header when its flags match, and reads the copy beside it when not."""
    if "clang" in _compiler_version(cxx):
        return None
    flags = [f for f in flags if f != "-shared"]
    key = hashlib.sha256(b"\0".join([header, " ".join([cxx, *flags]).encode(),
                                     _compiler_version(cxx).encode()])).hexdigest()[:32]
    directory = os.path.join(cache_dir(), f"pch-{key}")
    gch = os.path.join(directory, "emu_runtime.h.gch")
    if _pch_ready.get(directory) or os.path.exists(gch):
        _pch_ready[directory] = True
        return directory
    if directory in _pch_ready:  # (it failed before: this process does without)
        return None
    _pch_ready[directory] = False
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as tmp:
            copy = os.path.join(tmp, "emu_runtime.h")
            with open(copy, "wb") as f:
                f.write(header)
            r = run_tool([cxx, *flags, "-x", "c++-header", copy, "-o", copy + ".gch"],
                         timeout=COMPILE_TIME_LIMIT, cwd=tmp)
            if r.returncode != 0:
                return None
            # The header first, then the .gch: a directory with a .gch is always complete.
            os.replace(copy, os.path.join(directory, "emu_runtime.h"))
            os.replace(copy + ".gch", gch)
    except (OSError, subprocess.SubprocessError):
        return None
    _pch_ready[directory] = True
    return directory


_pch_ready: dict[str, bool] = {}


# --- running ------------------------------------------------------------------------------------


def _dim(value, what: str) -> tuple[int, int, int]:
    t = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(t) <= 3 or not all(isinstance(v, (int, np.integer)) for v in t):
        raise TCError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}")
    t = tuple(int(v) for v in t) + (1,) * (3 - len(t))
    if min(t) < 1:
        raise TCError(f"{what} {t} has a dimension below 1")
    return t


@attrs.frozen
class _Bound:
    """Arguments checked against the signature: arrays by parameter index, scalars as 0-d arrays."""

    arrays: tuple[tuple[int, np.ndarray], ...]
    scalars: tuple[tuple[int, np.ndarray], ...]


@attrs.frozen(eq=False)
class EmulatedKernel:
    """One `__global__` function compiled for the emulator."""

    signature: KernelSignature
    library: ctypes.CDLL = attrs.field(repr=False)
    stack_size: int = DEFAULT_STACK_SIZE  # what the compiler's frame sizes say a thread needs

    @property
    def name(self) -> str:
        return self.signature.name

    def _bind(self, args: Sequence) -> _Bound:
        params = self.signature.params
        if len(args) != len(params):
            raise TCError(f"kernel '{self.name}' takes {len(params)} arguments "
                          f"({', '.join(p.name for p in params)}), got {len(args)}")
        arrays, scalars = [], []
        for i, (p, a) in enumerate(zip(params, args)):
            where = f"parameter '{p.name}' ({p.decl}) of kernel '{self.name}'"
            if p.pointer:
                if not isinstance(a, np.ndarray):
                    raise TCError(f"{where} needs a numpy array of {p.dtype}, "
                                  f"got {type(a).__name__}")
                if a.dtype != p.dtype:
                    raise TCError(f"{where} needs a numpy array of {p.dtype}, got one of {a.dtype}")
                if not a.flags.c_contiguous:
                    raise TCError(f"{where} needs a C-contiguous array")
                if not p.const and not a.flags.writeable:
                    raise TCError(f"{where} may be written, but its array is read-only")
                arrays.append((i, a))
                continue
            if isinstance(a, np.ndarray):
                raise TCError(f"{where} is a scalar, got an array")
            if _is_floating(p.dtype):
                ok = (isinstance(a, (float, int, np.floating, np.integer))
                      and not isinstance(a, (bool, np.bool_)))
            elif p.dtype.kind == "b":
                ok = isinstance(a, (bool, np.bool_))
            else:
                ok = isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_))
                if ok and not np.iinfo(p.dtype).min <= int(a) <= np.iinfo(p.dtype).max:
                    raise TCError(f"{where} cannot hold {int(a)}")
            if not ok:
                raise TCError(f"{where} needs a {p.dtype} scalar, got {type(a).__name__} {a!r}")
            scalars.append((i, np.array(a, dtype=p.dtype)))
        # Private copies must alias where the arguments alias, so only exact aliases are allowed.
        for n, (i, a) in enumerate(arrays):
            for j, b in arrays[:n]:
                if np.may_share_memory(a, b) and not _same_buffer(a, b):
                    raise TCError(f"arguments '{params[j].name}' and '{params[i].name}' of kernel "
                                  f"'{self.name}' overlap in memory without being the same array")
        return _Bound(tuple(arrays), tuple(scalars))

    def _launch(self, grid, block, bound: _Bound, arrays: dict[int, np.ndarray], schedule: str,
                seed: int, stack_size: int, time_limit: float, only: np.ndarray | None) -> bool:
        """One run; True when it used floating-point atomics."""
        n = len(self.signature.params)
        ptrs = (ctypes.c_void_p * max(n, 1))()
        for i, a in arrays.items():
            ptrs[i] = a.ctypes.data
        for i, s in bound.scalars:
            ptrs[i] = s.ctypes.data
        fn = getattr(self.library, _launcher_symbol(self.name))
        fn.restype = ctypes.c_int
        g = (ctypes.c_longlong * 3)(*grid)
        b = (ctypes.c_longlong * 3)(*block)
        message = ctypes.create_string_buffer(2048)
        flags = ctypes.c_int(0)
        order = SCHEDULES[schedule]
        selected = np.zeros(1, np.int64) if only is None else only
        status = fn(ptrs, g, b, selected.ctypes.data_as(ctypes.POINTER(ctypes.c_longlong)),
                    ctypes.c_longlong(0 if only is None else len(only)),
                    ctypes.c_int(order), ctypes.c_int(order), ctypes.c_ulonglong(seed),
                    ctypes.c_longlong(stack_size), ctypes.c_double(time_limit), message,
                    ctypes.c_longlong(len(message)), ctypes.byref(flags))
        if status != 0:
            text = message.value.decode(errors="replace")
            if status == 5:  # tcemu::TIMED_OUT
                text += " (emulate's time_limit, or tcstage.cuda.emulate.TIME_LIMIT, allows more)"
            error = EmulationError if status in (1, 2, 4, 5) else TCError  # tcemu::Status
            raise error(f"kernel '{self.name}': {text}")
        return bool(flags.value & 1)

    def __call__(self, grid, block, args: Sequence, *, check_races: bool = True,
                 schedules: Sequence[str] = ("forward", "reverse"), seed: int = 0,
                 stack_size: int | None = None, time_limit: float | None = None,
                 blocks: Sequence | None = None) -> None:
        """Runs the kernel; see `emulate`."""
        stack_size = max(stack_size or 0, self.stack_size)
        time_limit = _seconds(TIME_LIMIT if time_limit is None else time_limit)
        grid, block = _dim(grid, "grid"), _dim(block, "block")
        _check_launch(grid, block)
        only = None if blocks is None else _block_indices(blocks, grid, self.name)
        if only is None and math.prod(grid) > MAX_BLOCKS:
            raise EmulationError(f"kernel '{self.name}': grid {grid} has {math.prod(grid)} blocks; "
                                 f"the emulator runs at most {MAX_BLOCKS} (MAX_BLOCKS)")
        bound = self._bind(args)
        for s in schedules:
            if s not in SCHEDULES:
                raise TCError(f"unknown schedule '{s}'; choose from {', '.join(SCHEDULES)}")
        if not schedules:
            raise TCError("emulate needs at least one schedule")
        if not check_races:
            self._launch(grid, block, bound, dict(bound.arrays), schedules[0], seed, stack_size,
                         time_limit, only)
            return
        runs, atomics = [], False
        for s in schedules:
            copies: dict[int, _Guarded] = {}
            for i, a in bound.arrays:
                alias = next((j for j, b in bound.arrays if j < i and _same_buffer(a, b)), None)
                copies[i] = copies[alias] if alias is not None else _Guarded.of(a, len(copies))
            atomics |= self._launch(grid, block, bound, {i: g.array for i, g in copies.items()},
                                    s, seed, stack_size, time_limit, only)
            for i, g in copies.items():
                g.check(self.name, self.signature.params[i].name)
            runs.append({i: g.array for i, g in copies.items()})
        params = self.signature.params
        for k in range(1, len(runs)):
            for i, _ in bound.arrays:
                diff = _first_difference(runs[0][i], runs[k][i], atomics)
                if diff is None:
                    continue
                idx, count = diff
                a, b = runs[0][i], runs[k][i]
                where = "" if a.ndim <= 1 else \
                    f" (index {tuple(int(x) for x in np.unravel_index(idx, a.shape))})"
                raise EmulationRaceError(
                    f"the result of kernel '{self.name}' depends on thread scheduling: argument "
                    f"'{params[i].name}' differs at flat index {idx}{where}, which is "
                    f"{a.reshape(-1)[idx].item()!r} with the {schedules[0]} schedule and "
                    f"{b.reshape(-1)[idx].item()!r} with the {schedules[k]} schedule "
                    f"({count} of {a.size} elements differ); the kernel has a data race or is "
                    "missing a __syncthreads() (or reads shared memory no thread wrote)")
        for i, a in bound.arrays:
            if not params[i].const:
                np.copyto(a, runs[0][i])


def _block_indices(blocks: Sequence, grid: tuple[int, int, int], kernel: str) -> np.ndarray:
    """The linear indices (x fastest) of `blocks`, each a linear index or an (x, y, z) tuple
    (missing coordinates are 0); each block once, in the order given."""
    out = []
    for b in blocks:
        if isinstance(b, (int, np.integer)):
            linear = int(b)
        else:
            xyz = tuple(int(c) for c in b) + (0,) * (3 - len(b))
            if len(xyz) != 3 or not all(0 <= c < g for c, g in zip(xyz, grid)):
                raise TCError(f"kernel '{kernel}': block {tuple(b)} is outside the grid {grid}")
            linear = xyz[0] + grid[0] * (xyz[1] + grid[1] * xyz[2])
        if not 0 <= linear < math.prod(grid):
            raise TCError(f"kernel '{kernel}': block {b} is outside the grid {grid}")
        out.append(linear)
    if not out:
        raise TCError(f"kernel '{kernel}': blocks= names no block")
    return np.array(list(dict.fromkeys(out)), dtype=np.int64)


class _Guarded:
    """A private copy of an array between two red zones of one repeated byte.

    A kernel writing a little out of bounds changes a red zone instead of other memory, and
    `check` reports it. Each array gets its own byte (0xFE, 0xFD, ...), so copying out of bounds
    from one array to another is caught too; as floats these read as huge negative numbers
    (about -1e38 .. -1e29, as ints about -2e7), so out-of-bounds reads tend to show in results.
    Writes that happen to store the red zone's own bytes go unnoticed.
    """

    def __init__(self, raw: np.ndarray, start: int, array: np.ndarray, fill: int):
        self.raw, self.start, self.array, self.fill = raw, start, array, fill

    @classmethod
    def of(cls, a: np.ndarray, index: int) -> "_Guarded":
        fill = 0xFE - index % 16
        # Multiples of 64 bytes keep the copy as aligned as numpy's own allocations.
        pad = min(max(4096, a.nbytes // 4), 4 << 20) // 64 * 64
        raw = np.full(a.nbytes + 2 * pad + 64, fill, np.uint8)
        start = pad + (-raw.ctypes.data - pad) % 64
        array = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
        np.copyto(array, a)
        return cls(raw, start, array, fill)

    def check(self, kernel: str, name: str) -> None:
        nbytes, size = self.array.nbytes, self.array.dtype.itemsize
        end = self.start + nbytes
        outside = np.concatenate([np.flatnonzero(self.raw[:self.start] != self.fill),
                                  np.flatnonzero(self.raw[end:] != self.fill) + end])
        if outside.size:
            lo, hi = ((int(x) - self.start) // size for x in (outside[0], outside[-1]))
            raise EmulationError(
                f"kernel '{kernel}' wrote out of bounds of argument '{name}' "
                f"({self.array.size} elements): at flat indices {lo} to {hi}")


def _seconds(limit) -> float:
    """A launch's time limit for the runtime: seconds, or 0 for none (None, inf)."""
    if limit is None or limit == float("inf"):
        return 0.0
    if not isinstance(limit, (int, float)) or isinstance(limit, bool) or not limit > 0:
        raise TCError(f"time_limit must be a positive number of seconds (or None), got {limit!r}")
    return float(limit)


def _same_buffer(a: np.ndarray, b: np.ndarray) -> bool:
    return (a.ctypes.data == b.ctypes.data and a.nbytes == b.nbytes and a.dtype == b.dtype)


def _check_launch(grid: tuple[int, int, int], block: tuple[int, int, int]) -> None:
    # The limits of every CUDA device since compute capability 3.0: a GPU rejects bigger launches.
    if block[0] * block[1] * block[2] > 1024:
        raise TCError(f"block {block} has {block[0] * block[1] * block[2]} threads; CUDA allows "
                      "at most 1024")
    if block[2] > 64:
        raise TCError(f"block {block}: CUDA allows at most 64 threads in z")
    if grid[0] > 2**31 - 1 or grid[1] > 65535 or grid[2] > 65535:
        raise TCError(f"grid {grid} exceeds CUDA's limits (2^31-1, 65535, 65535)")


def _first_difference(a: np.ndarray, b: np.ndarray, tolerant: bool) -> tuple[int, int] | None:
    """(first differing flat index, number of differing elements), or None if equal.

    Floats compare by value with NaN equal to NaN; other types exactly. After floating-point
    atomics (`tolerant`) the summation order legitimately differs, so rounding noise is accepted.
    """
    fa, fb = a.reshape(-1), b.reshape(-1)
    if _is_floating(fa.dtype):
        # float16 and bfloat16 compare as float32, with their own precision's tolerance
        eps = 2.0**-7 if fa.dtype.name == "bfloat16" else float(np.finfo(fa.dtype).eps)
        if fa.dtype.itemsize < 4:
            fa, fb = fa.astype(np.float32), fb.astype(np.float32)
        eq = (fa == fb) | (np.isnan(fa) & np.isnan(fb))
        if tolerant and not eq.all():
            finite = np.abs(np.where(np.isfinite(fa), fa, 0))
            scale = float(finite.max()) if finite.size else 0.0
            eq |= np.abs(fa - fb) <= 64 * eps * max(scale, 1e-30)
    else:
        eq = fa == fb
    if eq.all():
        return None
    bad = np.flatnonzero(~eq)
    return int(bad[0]), int(bad.size)


def compile_kernels(source: str, *, defines: Sequence[str] = ()) -> dict[str, EmulatedKernel]:
    """Compiles every `__global__` function of `source` for the emulator (cached on disk)."""
    kernels = parse_kernels(source)
    lib, stack = _compile(_translation_unit(source, kernels), defines)
    return {name: EmulatedKernel(sig, lib, max(stack, DEFAULT_STACK_SIZE))
            for name, sig in kernels.items()}


def emulate(source: str, kernel: str, grid, block, args: Sequence, *, check_races: bool = True,
            schedules: Sequence[str] = ("forward", "reverse"), seed: int = 0,
            stack_size: int | None = None, time_limit: float | None = None,
            blocks: Sequence | None = None) -> None:
    """Runs `kernel` from CUDA `source` on the CPU as `kernel<<<grid, block>>>(*args)` would.

    `args` follow the kernel's parameters: C-contiguous numpy arrays of the pointee type for
    pointers (written in place), Python or numpy scalars for the rest. With `check_races`, the
    kernel runs once per schedule ("forward", "reverse", "shuffle") on private copies and
    `EmulationRaceError` reports a result that depends on the schedule; without it, it runs once
    on the arrays themselves. Each CUDA thread gets a stack of at least `stack_size` bytes, at
    least 64 KiB, and at least what the compiler's frame sizes say the kernel needs. Each
    launch ends with an EmulationError after `time_limit` seconds (default TIME_LIMIT).
    `blocks` (block indices, (x, y, z) tuples or linear ones): run only these blocks of the
    grid, in that order (a sample of a launch too large to emulate whole; what the other
    blocks would write stays as it was).
    """
    kernels = parse_kernels(source)
    if kernel not in kernels:
        known = ", ".join(sorted(kernels)) or "none"
        raise TCError(f"no __global__ function '{kernel}' in the CUDA source (found: {known})")
    sig = kernels[kernel]
    if sig.unsupported:
        raise TCError(sig.unsupported)
    compiled = compile_kernels(source)[kernel]
    compiled(grid, block, args, check_races=check_races, schedules=schedules, seed=seed,
             stack_size=stack_size, time_limit=time_limit, blocks=blocks)
