"""CPU pipelines compiled ahead of time into shared libraries kept on disk, so that a second
process, a test run or a training restart pays no compile.

Halide's JIT (`Pipeline.compile_to_callable`) compiles again in every process: 2 to 3 s of
LLVM per kernel on the 2-core development machine, most of a convolution layer's first call. Here
the scheduled pipeline is compiled once into an object file (`Pipeline.compile_to`, called
through `_native.compile_object`, which releases the GIL while Halide compiles), linked into
a shared library with the C compiler, and kept in `$TCSTAGE_CACHE_DIR/cpu` (tcstage.diskcache:
written atomically, loaded after a digest check). The libraries are keyed by what determines
the pipeline (the caller's key: the checked function, its schedule and the sizes that planned
it), the target, the Halide version and a digest of tcstage's own code, so that any change to
the compiler compiles afresh.

Every library links against one Halide runtime library of the same cache and target (built with
`compile_standalone_runtime`), loaded once: one error handler, which turns a failed check into a
`RuntimeError` with Halide's message, as the JIT's `HalideError` carries it, and one thread pool,
pool.c's (its workers spin a while between parallel loops where Halide's sleep at once). A
pipeline is called through its `<name>_argv` entry point (`AotPipeline.run`), with the
arguments a JIT Callable takes, as numpy arrays and numbers.

TCSTAGE_CPU_CACHE=0 turns the disk cache off (the JIT compiles in-process, as before).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.metadata
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading

import halide as hl
import ml_dtypes
import numpy as np

from tcstage.diskcache import LibraryCache, code_digest, publish, verified
from tcstage.errors import TCError, warn
from tcstage.halide import _native

_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

FORMAT = "aot-1"  # (bumped when the libraries' layout or calling convention changes)
ENTRY = "tcstage_pipeline"
CACHE = LibraryCache("cpu", "the CPU kernel cache")
_lock = threading.Lock()  # (held briefly: never while a library compiles)
_runtime_lock = threading.Lock()  # (held while the runtime library is built and loaded)
_loaded: dict[str, "AotPipeline"] = {}
_building: dict[str, threading.Event] = {}  # digest -> set when the thread building it is done
builds = 0  # libraries this process compiled (the runtime's included), for tests and reports


def enabled() -> bool:
    """Whether pipelines go through the disk cache: unless TCSTAGE_CPU_CACHE=0, and where a C
    compiler can link them (without one, a warning, once, and the JIT as before)."""
    return os.environ.get("TCSTAGE_CPU_CACHE", "1") != "0" and _linker() is not None


@functools.cache
def _linker() -> str | None:
    cc = os.environ.get("TCSTAGE_CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        warn("the CPU kernel cache links compiled pipelines with a C compiler, and none was "
             "found ($TCSTAGE_CC, cc, gcc): kernels are compiled in each process instead")
    return cc


def _aot_target(target: hl.Target) -> hl.Target:
    """The JIT target as an ahead-of-time one: no JIT, no user context argument, and no
    runtime in each pipeline's object (the shared runtime library has it)."""
    t = target.without_feature(hl.TargetFeature.JIT)
    t = t.without_feature(hl.TargetFeature.UserContext)
    return t.with_feature(hl.TargetFeature.NoRuntime)


def _link(objects: list[str], out: str, extra: list[str], cwd: str) -> None:
    cmd = [_linker(), "-shared", "-o", out, *objects, *extra, "-lpthread", "-ldl", "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=600)
    if r.returncode != 0:
        raise TCError("linking a compiled CPU pipeline failed:\n" + (r.stderr or r.stdout),
                      notes=("TCSTAGE_CPU_CACHE=0 compiles in-process instead",))


def _build(directory: str, key: str, make_object, extra: list[str], before_link=None) -> str:
    """The library `key`.so of `directory`, built (make_object(path) writes its object, or
    returns the files to link in its place, then before_link() runs) unless a verified one is
    there."""
    path = os.path.join(directory, f"{key}.so")
    digest_path = os.path.join(directory, f"{key}.sha256")
    if not verified(path, digest_path, "the CPU kernel cache's library"):
        global builds
        with _lock:
            builds += 1
        with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as tmp:
            obj = os.path.join(tmp, "pipeline.o")
            objects = make_object(obj) or [obj]
            if before_link is not None:
                before_link()
            built = os.path.join(tmp, "pipeline.so")
            _link(objects, built, extra, tmp)
            publish(built, path, digest_path)
    return path


# -- the shared runtime ---------------------------------------------------------------------------

_ERROR_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)
_messages = threading.local()


@_ERROR_HANDLER
def _record_error(_user_context, message) -> None:
    previous = getattr(_messages, "text", "")
    _messages.text = previous + (message.decode("utf-8", "replace") if message else "")


_runtimes: dict[str, tuple[ctypes.CDLL, str]] = {}
POOL_SOURCE = pathlib.Path(__file__).with_name("pool.c")
DEFAULT_SPIN_US = 1000


def pool_threads() -> int:
    """The threads a parallel loop runs on: $HL_NUM_THREADS, as for Halide's own pool, else
    the cores this process may use."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    return max(1, _whole_number("HL_NUM_THREADS", cores, "a whole number: using every core"))


def pool_spin_us() -> int:
    """How long an idle worker spins before it sleeps (microseconds): $TCSTAGE_SPIN_US, else
    DEFAULT_SPIN_US (pool.c says why it spins)."""
    return max(0, _whole_number("TCSTAGE_SPIN_US", DEFAULT_SPIN_US,
                                f"a whole number of microseconds: using {DEFAULT_SPIN_US}"))


def _whole_number(variable: str, default: int, otherwise: str) -> int:
    """$variable as an int; `default` where it is unset, and with a warning ending
    "is not <otherwise>" where it is not a whole number."""
    value = os.environ.get(variable, "")
    try:
        return int(value)
    except ValueError:
        if value:
            warn(f"{variable}={value!r} is not {otherwise}")
        return default


POOL_FLAGS = ("-O2", "-fPIC")


def _runtime_name(target: hl.Target) -> str:
    """The runtime library's name: a digest of what it is built from (Halide's runtime for the
    target, of this Halide version, and pool.c), not of the rest of tcstage, so that the
    runtime is compiled once per machine (and Halide version), not again after every change
    to tcstage's Python."""
    return _runtime_name_for(str(target))


@functools.lru_cache(maxsize=None)
def _runtime_name_for(target: str) -> str:
    key = hashlib.sha256("\0".join(
        [FORMAT, target, importlib.metadata.version("halide"), *POOL_FLAGS,
         hashlib.sha256(POOL_SOURCE.read_bytes()).hexdigest()]).encode()).hexdigest()[:24]
    return f"runtime-{key}"


# The runtime's object takes 0.7 s of LLVM on the development machine, as long as a small
# pipeline's: where a cache has no runtime yet, a thread compiles it (without the GIL:
# _native.compile_runtime) while the first pipeline is scheduled and compiled. Started by
# _start_runtime, taken by _runtime.
_runtime_objects: dict[str, tuple[threading.Thread, str, list]] = {}  # directory -> (thread,
#                                                                       object, its error)


def _start_runtime(directory: str, target: hl.Target) -> None:
    """Starts compiling the runtime's object on a thread of its own, unless the runtime library
    is loaded, on disk, or on its way. (Under _lock.)"""
    directory = os.path.realpath(directory)
    if directory in _runtimes or directory in _runtime_objects or \
            os.path.exists(os.path.join(directory, f"{_runtime_name(target)}.so")):
        return
    scratch = tempfile.mkdtemp(dir=directory, prefix=".build-runtime-")
    obj, failed = os.path.join(scratch, "runtime.o"), []

    def compile_runtime() -> None:
        try:
            _native.compile_runtime(obj, target)
        except BaseException as e:  # (the thread that links it compiles it again, and says why)
            failed.append(e)
    # (not a daemon: see TCFunction.compile_ahead)
    thread = threading.Thread(target=compile_runtime, name="tcstage-runtime")
    thread.start()
    _runtime_objects[directory] = (thread, obj, failed)


def start_runtime(target: hl.Target) -> None:
    """Starts compiling the runtime for (the ahead-of-time form of) the JIT target `target`
    where the cache has none yet: called before a pipeline is scheduled, so that the runtime
    is ready by the time the pipeline is linked."""
    with _lock:
        _start_runtime(CACHE.directory(), _aot_target(target))


def _runtime_object(directory: str, target: hl.Target, obj: str) -> None:
    """Writes the runtime's object to `obj`: the one its thread compiled, where one did, else
    compiled here."""
    with _lock:
        started = _runtime_objects.pop(directory, None)
    if started is not None:
        thread, made, failed = started
        thread.join()
        done = not failed and os.path.exists(made) and os.path.getsize(made) > 0
        if done:
            shutil.move(made, obj)
        shutil.rmtree(os.path.dirname(made), ignore_errors=True)
        if done:
            return
    _native.compile_runtime(obj, target)


def _runtime(directory: str, target: hl.Target) -> str:
    """The runtime library for `target` in `directory`, built and loaded once; its file name."""
    name = _runtime_name(target)
    directory = os.path.realpath(directory)
    with _runtime_lock:
        return _runtimes[directory][1] if directory in _runtimes else \
            _load_runtime(directory, target, name)


def _load_runtime(directory: str, target: hl.Target, name: str) -> str:
    """Builds (unless it is on disk) and loads the runtime library `name`. (Under
    _runtime_lock.)"""
    path = _build(directory, name, lambda obj: _runtime_object(directory, target, obj),
                  [f"-Wl,-soname,{name}.so", *POOL_FLAGS, str(POOL_SOURCE)])
    # (loaded by its path before any pipeline, so theirs resolves to this one)
    lib = ctypes.CDLL(path)
    lib.halide_set_error_handler.restype = ctypes.c_void_p
    lib.halide_set_error_handler(_record_error)
    lib.tcstage_pool_install(pool_threads(), pool_spin_us())
    _runtimes[directory] = (lib, name)
    if "torch" in sys.modules:
        _share_openmp(lib)
    return name


def share_torch_threads() -> None:
    """Where PyTorch is loaded and runs its operators on OpenMP, the pool of every runtime
    library loaded runs its loops on PyTorch's OpenMP team instead of threads of its own
    (pool.c says why): called when tcstage.torch is imported and when a call first passes
    tensors. TCSTAGE_TORCH_OPENMP=0 keeps tcstage's own threads."""
    with _runtime_lock:
        for lib, _ in _runtimes.values():
            _share_openmp(lib)


_openmp_shared: set[int] = set()  # (the runtime libraries that share it, by handle)


def _share_openmp(lib: ctypes.CDLL) -> None:
    if lib._handle in _openmp_shared or os.environ.get("TCSTAGE_TORCH_OPENMP", "1") == "0":
        return
    _openmp_shared.add(lib._handle)
    entries = _torch_openmp()
    if entries is not None:
        lib.tcstage_pool_share_openmp(*(ctypes.c_void_p(e) for e in entries))


@functools.cache
def _torch_openmp() -> tuple[int, int | None] | None:
    """The addresses of GOMP_parallel and omp_get_max_threads in the OpenMP runtime PyTorch
    loaded (GNU libgomp, or Intel's libiomp5, which provides the same entry points), or None
    where it runs on none."""
    torch = sys.modules.get("torch")
    if torch is None or not getattr(torch._C, "has_openmp", False):
        return None
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if "/lib" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if os.path.basename(path).startswith(("libgomp", "libiomp")):
            try:  # (already loaded: RTLD_NOLOAD only finds it)
                runtime = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
                parallel = ctypes.cast(runtime.GOMP_parallel, ctypes.c_void_p).value
            except (OSError, AttributeError):
                continue
            max_threads = getattr(runtime, "omp_get_max_threads", None)
            return parallel, None if max_threads is None else \
                ctypes.cast(max_threads, ctypes.c_void_p).value
    return None


# -- pipelines --------------------------------------------------------------------------------------

# halide_type_code_t (HalideRuntime.h) << 8 | bits: a type as _native.call_argv takes it
_INT, _UINT, _FLOAT, _BFLOAT = 0, 1, 2, 4
_SCALAR_TYPES = {(_INT, 8), (_INT, 16), (_INT, 32), (_INT, 64), (_UINT, 1), (_UINT, 8),
                 (_UINT, 16), (_UINT, 32), (_UINT, 64), (_FLOAT, 32), (_FLOAT, 64)}
_buffer_kinds: dict = {}


def _buffer_kind(dtype: np.dtype) -> int:
    """The Halide type of a buffer over an array of `dtype`, as `hl.Buffer` would give it
    (bool as uint1, ml_dtypes' bfloat16 as bfloat16)."""
    kind = _buffer_kinds.get(dtype)
    if kind is None:
        if dtype == _BFLOAT16:
            kind = _BFLOAT << 8 | 16
        elif dtype.kind == "b":
            kind = _UINT << 8 | 1
        elif dtype.kind in "iuf":
            kind = {"i": _INT, "u": _UINT, "f": _FLOAT}[dtype.kind] << 8 | 8 * dtype.itemsize
        else:
            raise TCError(f"the CPU kernel cache cannot pass an array of {dtype} to Halide",
                          notes=("this is a bug in tcstage",))
        _buffer_kinds[dtype] = kind
    return kind


def _scalar_kind(t: hl.Type) -> int:
    """A scalar Param's type as _native.call_argv takes a scalar: -(code << 8 | bits) - 1."""
    code = _FLOAT if t.is_float() else _UINT if t.is_uint() or t.is_bool() else _INT
    if (code, t.bits()) not in _SCALAR_TYPES:
        raise TCError(f"the CPU kernel cache cannot pass a scalar of Halide type {t}",
                      notes=("this is a bug in tcstage",))
    return -(code << 8 | t.bits()) - 1


class AotPipeline:
    """A compiled pipeline's entry point, called through `run` on numpy arrays and numbers:
    the inputs in signature order, then the in/out outputs' values, then the outputs."""

    def __init__(self, path: str, kinds: list):
        self.library = ctypes.CDLL(path)
        self.address = ctypes.cast(getattr(self.library, f"{ENTRY}_argv"), ctypes.c_void_p).value
        self.scalar_kinds = kinds  # per argument: _scalar_kind's, or None for a buffer
        self.path = path

    def run(self, values: list, mins: dict) -> None:
        """Runs on `values`: numpy arrays where the pipeline takes buffers, numbers elsewhere;
        `mins`: argument index -> the buffer's minimum coordinates (numpy's order) where not
        zero. One native call builds the buffers and calls the entry point
        (`_native.call_argv`), with the GIL released while it runs."""
        kinds = [_buffer_kind(v.dtype) if k is None else k
                 for v, k in zip(values, self.scalar_kinds)]
        _messages.text = ""
        status = _native.call_argv(self.address, values, kinds, mins)
        if status != 0:
            message = _messages.text.strip() or f"the pipeline returned error code {status}"
            raise RuntimeError(f"Error: {message}")

    def prepare(self, layouts: list, scalars: list):
        """A call of this pipeline made ready for arguments of fixed layouts: a
        `_native.PreparedCall`, called on the buffers' addresses or numpy arrays and the
        values of the scalars passed with each call, in argument order, that returns the status
        (a caller runs `run` again for the error of a nonzero one). `layouts`: per argument,
        None for a scalar, else (shape, strides in elements, mins or None, numpy dtype), numpy's
        order; `scalars`: per argument, a fixed scalar's value (None for a buffer, or for a
        scalar passed with each call)."""
        kinds = [_buffer_kind(np.dtype(layout[3])) if k is None else k
                 for layout, k in zip(layouts, self.scalar_kinds)]
        return _native.PreparedCall(self.address, kinds,
                                    [None if layout is None else layout[:3] for layout in layouts],
                                    scalars)


def _compile_objects(pipeline: hl.Pipeline, obj: str, arguments: list,
                     target: hl.Target) -> list[str] | None:
    """Compiles `pipeline` into `obj`; None. Where its outputs fall into groups that share no
    Func (`_native.output_groups`: a convolution's input and weight gradients), each group is
    compiled as a pipeline of its own, on threads side by side (Halide and LLVM compile a
    pipeline on one core, and these are the longest compiles of a layer's first call), and a
    stub entry point calls them in turn: returns the files to link (objects and the stub)."""
    outputs = pipeline.outputs()
    try:
        groups = _native.output_groups(outputs) if len(outputs) > 1 else [0]
    except RuntimeError:  # (Halide's error: then one pipeline, which says what is wrong)
        groups = [0]
    if max(groups) == 0:
        _native.compile_object(pipeline, obj, arguments, ENTRY, target)
        return None
    directory = os.path.dirname(obj)
    members = [[k for k, g in enumerate(groups) if g == n] for n in range(max(groups) + 1)]
    names = [f"{ENTRY}_part{n}" for n in range(len(members))]
    objects = [os.path.join(directory, f"{name}.o") for name in names]
    failures: list[BaseException] = []

    def compile_part(n: int) -> None:
        try:
            part = hl.Pipeline([outputs[k] for k in members[n]])
            _native.compile_object(part, objects[n], arguments, names[n], target)
        except BaseException as e:  # (re-raised on the calling thread)
            failures.append(e)
    threads = [threading.Thread(target=compile_part, args=(n,), name="tcstage-compile-part")
               for n in range(1, len(members))]
    for t in threads:
        t.start()
    compile_part(0)
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    # (Halide's _argv entry points take every argument's address in order: the inputs, then
    # one buffer per value of each output, of that part's outputs only)
    first = len(arguments)
    slots, at = [], first
    for f in outputs:
        slots.append(list(range(at, at + len(f.types()))))
        at += len(f.types())
    stub = [f"extern int {name}_argv(void **args);" for name in names]
    stub.append(f"int {ENTRY}_argv(void **args) {{")
    stub.append("    int status;")
    for name, part in zip(names, members):
        picks = [*range(first), *(i for k in part for i in slots[k])]
        stub.append(f"    {{ void *part[] = {{{', '.join(f'args[{i}]' for i in picks)}}};")
        stub.append(f"      status = {name}_argv(part); if (status) return status; }}")
    stub += ["    return 0;", "}", ""]
    source = os.path.join(directory, "entry.c")
    with open(source, "w") as f:
        f.write("\n".join(stub))
    return [*objects, source]


def compile_pipeline(pipeline: hl.Pipeline, arguments: list, target: hl.Target,
                     key: tuple) -> AotPipeline:
    """`pipeline`, compiled for `arguments` (Params and ImageParams, in order; the outputs
    follow) and `target`, from the disk cache where `key` and this tcstage and Halide built it
    before, else compiled now and kept there."""
    aot = _aot_target(target)
    digest = hashlib.sha256("\0".join(
        [FORMAT, repr(key), str(aot), code_digest()]).encode()).hexdigest()[:32]
    kinds = [None if isinstance(a, hl.ImageParam) else _scalar_kind(a.type()) for a in arguments]
    kinds += [None] * sum(len(f.types()) for f in pipeline.outputs())
    while True:  # (one thread builds a library; others wanting it wait for it)
        with _lock:
            found = _loaded.get(digest)
            if found is not None:
                return found
            building = _building.get(digest)
            if building is None:
                building = _building[digest] = threading.Event()
                directory = CACHE.directory()  # (CpuKernel started its runtime: start_runtime)
                break
        building.wait()  # (and where that build failed, this thread tries, and says why)
    try:
        def make_object(obj: str) -> list[str] | None:
            return _compile_objects(pipeline, obj, arguments, aot)
        path = _build(directory, digest, make_object,
                      ["-fPIC", f"-L{directory}", f"-l:{_runtime_name(aot)}.so",
                       "-Wl,-rpath,$ORIGIN"],  # (-fPIC: for a stub's C, `_compile_objects`)
                      before_link=lambda: _runtime(directory, aot))
        _runtime(directory, aot)  # (loaded before the pipeline, which links against it)
        found = AotPipeline(path, kinds)
        with _lock:
            _loaded[digest] = found
        return found
    finally:
        with _lock:
            _building.pop(digest).set()
