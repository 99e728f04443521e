"""The test suite's emulated kernels launched on a real GPU as well: `pytest --real-gpu` (or
TCSTAGE_REAL_GPU=1), wired up in conftest.py.

Every kernel the suite runs under the CPU emulator goes through one method,
`tcstage.cuda.emulate.EmulatedKernel.__call__`: `tc.compile(..., target="cuda-emulated")` calls
and the emulator's own tests of hand-written kernels alike. With --real-gpu that method is
wrapped (`Twin`): when an emulated launch succeeds, the same CUDA source is compiled for the GPU
by pycuda, launched with the same grid and block on the arguments as they were before the
emulated launch, and every array the kernel may write is compared with the emulator's result
(`TOLERANCE`, by dtype; NaN equals NaN). A difference fails the test, naming the kernel, the
argument and the first differing element. Then the GPU's values replace the emulator's, so the
test's own assertions (against numpy, with the test's own tolerance) judge what the GPU computed.

Launches that cannot be compared are counted with their reason and listed in the summary pytest
prints at the end, never passed over silently: a launch with `check_races=False` (its result may
depend on the order threads run in, on purpose) keeps the emulator's result. Launches the
emulator refuses (races, faults, time limits) raise as before and never reach the GPU.

Without a GPU (no pycuda, no driver, no device) --real-gpu skips every test, with the reason.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from tcstage.cuda import emulate as emu

ENV = "TCSTAGE_REAL_GPU"
OPTION = "--real-gpu"

# Relative tolerance of the GPU against the emulator, by dtype name; the absolute tolerance is
# the same times the largest magnitude of the emulated array (at least 1). The two differ by
# contracted multiply-adds (nvcc's default --fmad=true), CUDA's math functions (expf and the
# like: 1-2 ulp) and the order of floating-point atomics; integers and bools must be equal.
TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}


def gpu_problem() -> str | None:
    """Why kernels cannot run on a GPU here (pycuda missing, no driver, no device), or None."""
    if importlib.util.find_spec("pycuda") is None:
        return "pycuda is not installed"
    try:
        import pycuda.driver as driver
        driver.init()
        return None if driver.Device.count() else "the CUDA driver sees no device"
    except Exception as e:  # noqa: BLE001 (any driver failure means: no GPU here)
        return f"no usable CUDA driver ({e})"


def requested(config) -> bool:
    import os
    return bool(config.getoption("real_gpu", False)) or \
        os.environ.get(ENV, "").strip() not in ("", "0")


# -- comparing -------------------------------------------------------------------------------

def first_mismatch(gpu: np.ndarray, emulated: np.ndarray) -> str | None:
    """None if `gpu` equals `emulated` within TOLERANCE, else where and by how much not."""
    name = emulated.dtype.name
    g, e = gpu.reshape(-1), emulated.reshape(-1)
    if name in TOLERANCE or emulated.dtype.kind == "f":
        g, e = g.astype(np.float64), e.astype(np.float64)
        rtol = TOLERANCE.get(name, 1e-4)
        finite = np.abs(e[np.isfinite(e)])
        atol = rtol * max(1.0, float(finite.max()) if finite.size else 1.0)
        with np.errstate(invalid="ignore"):
            ok = (g == e) | (np.isnan(g) & np.isnan(e)) | (np.abs(g - e) <= atol + rtol * np.abs(e))
        bound = f" (tolerance {atol:.3g} + {rtol:g} x |emulated|)"
    else:
        ok, bound = g == e, " (must be equal)"
    if ok.all():
        return None
    bad = np.flatnonzero(~ok)
    i = int(bad[0])
    where = f"flat index {i}" if emulated.ndim <= 1 else \
        f"index {tuple(int(x) for x in np.unravel_index(i, emulated.shape))}"
    return (f"at {where} the GPU gives {gpu.reshape(-1)[i].item()!r}, the emulator "
            f"{emulated.reshape(-1)[i].item()!r}; {bad.size} of {e.size} elements differ{bound}")


# -- launching on the GPU --------------------------------------------------------------------

class PycudaLauncher:
    """Compiles CUDA sources for the device (PTX, loaded by the driver) and launches kernels on
    copies of numpy arrays; the results come back as new numpy arrays. After a fault the
    process's context is unusable, and every later launch says so instead of failing obscurely."""

    def __init__(self):
        from tcstage.cuda.launch import _pycuda
        self.driver, self.compiler, _ = _pycuda()
        major, minor = self.driver.Context.get_device().compute_capability()
        self.arch = f"sm_{major}{minor}"
        self.device = self.driver.Context.get_device().name()
        self._modules: dict[str, tuple] = {}
        self.broken: str | None = None

    def _function(self, source: str, name: str):
        found = self._modules.get(source)
        if found is None:
            ptx = self.compiler.compile(source, no_extern_c=True, arch=self.arch,
                                        options=["-std=c++17"], target="ptx")
            text = ptx.decode() if isinstance(ptx, bytes) else ptx
            found = self._modules[source] = (self.driver.module_from_buffer(ptx),
                                             re.findall(r"\.entry\s+([\w$]+)\s*\(", text))
        module, entries = found
        # A kernel without extern "C" has a C++ (Itanium) name: _Z<length><name><parameters>
        symbol = name if name in entries else next(
            (e for e in entries if e.startswith(f"_Z{len(name)}{name}")), name)
        return module.get_function(symbol)

    def __call__(self, source: str, name: str, grid, block, params, args) -> dict[int, np.ndarray]:
        if self.broken:
            raise RuntimeError(f"the GPU context of this process is unusable since {self.broken}")
        from tcstage.cuda.launch import primary_context
        with primary_context():  # (a test's thread pool worker has no current context)
            return self._launch(source, name, grid, block, params, args)

    def _launch(self, source: str, name: str, grid, block, params, args) -> dict[int, np.ndarray]:
        drv = self.driver
        function = self._function(source, name)
        values, device = [], {}
        for i, (p, a) in enumerate(zip(params, args)):
            if not p.pointer:
                value = np.array(a, dtype=p.dtype)
                # (half and ml_dtypes' bfloat16 as their bits: pycuda's argument packing knows
                # neither)
                if value.dtype.kind not in "biu" and value.itemsize == 2 \
                        or not isinstance(value[()], np.number):
                    value = value.view(f"u{value.itemsize}")
                values.append(value[()])
                continue
            twin = next((j for j in device if emu._same_buffer(args[j], a)), None)
            if twin is None:
                alloc = drv.mem_alloc(max(a.nbytes, 1))
                drv.memcpy_htod(alloc, np.ascontiguousarray(a).view(np.uint8))
                device[i] = alloc
            else:  # the same array twice: one device buffer, as on the emulator
                device[i] = device[twin]
            values.append(device[i])
        try:
            function(*values, grid=tuple(grid), block=tuple(block))
            drv.Context.synchronize()
            results = {}
            for i, alloc in device.items():
                if not params[i].const:
                    out = np.empty_like(args[i])
                    drv.memcpy_dtoh(out.view(np.uint8), alloc)
                    results[i] = out
            return results
        except drv.Error as e:
            self.broken = f"kernel '{name}' failed on grid {tuple(grid)}, block {tuple(block)}: {e}"
            raise
        finally:
            for alloc in {id(a): a for a in device.values()}.values():
                alloc.free()


# -- the twin launch ---------------------------------------------------------------------------

class Twin:
    """Wraps EmulatedKernel.__call__ (`install`) so that each successful emulated launch also
    runs through `launch` (a PycudaLauncher, or a stand-in in tests) and is compared."""

    def __init__(self, launch: Callable):
        self.launch = launch
        self.sources: dict[int, tuple] = {}  # id(KernelSignature) -> (signature, CUDA source)
        self.compared = 0
        self.kernels: set[str] = set()  # short hashes of the sources of compared kernels
        self.not_compared: Counter = Counter()  # reason -> launches
        self._undo: list[tuple] = []

    def install(self) -> None:
        parse, call = emu.parse_kernels, emu.EmulatedKernel.__call__
        twin = self

        def recording_parse(source: str):
            kernels = parse(source)
            for sig in kernels.values():  # (held, so that no other object reuses the id)
                twin.sources[id(sig)] = (sig, source)
            return kernels

        def twin_call(kernel, grid, block, args: Sequence, *, check_races: bool = True, **kw):
            before = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
            call(kernel, grid, block, args, check_races=check_races, **kw)
            twin.after(kernel, grid, block, args, before, check_races)

        self._undo = [(emu, "parse_kernels", parse), (emu.EmulatedKernel, "__call__", call)]
        emu.parse_kernels = recording_parse
        emu.EmulatedKernel.__call__ = twin_call

    def uninstall(self) -> None:
        for owner, attr, value in reversed(self._undo):
            setattr(owner, attr, value)
        self._undo = []

    def after(self, kernel, grid, block, args: Sequence, before: Sequence, check_races: bool):
        """Runs the launch that just succeeded under emulation on the GPU, from the inputs
        `before` it; compares, then leaves the GPU's values in `args`."""
        if not check_races:
            self.not_compared["launched with check_races=False (its result may depend on "
                              "the order of threads)"] += 1
            return
        sig, source = self.sources.get(id(kernel.signature), (None, None))
        if source is None:
            self.not_compared["CUDA source unknown (compiled before --real-gpu was set up)"] += 1
            return
        grid, block = emu._dim(grid, "grid"), emu._dim(block, "block")
        params = kernel.signature.params
        got = self.launch(source, kernel.name, grid, block, params, before)
        for i, gpu in got.items():
            problem = first_mismatch(gpu, args[i])
            if problem:
                raise AssertionError(
                    f"--real-gpu: kernel '{kernel.name}' (grid {grid}, block {block}) on the GPU "
                    f"differs from the emulator in argument '{params[i].name}': {problem}")
        for i, gpu in got.items():
            np.copyto(args[i], gpu)
        self.compared += 1
        self.kernels.add(hashlib.sha256(source.encode()).hexdigest()[:16])

    def take(self) -> tuple[int, tuple[str, ...], tuple[tuple[str, int], ...]]:
        """(launches compared, kernel hashes, (reason, launches) not compared) since the last
        take: one test's share, plain data for pytest's reports (and xdist's workers)."""
        out = (self.compared, tuple(sorted(self.kernels)), tuple(self.not_compared.items()))
        self.compared, self.kernels, self.not_compared = 0, set(), Counter()
        return out


class Tally:
    """The controller's sum over every test's `Twin.take()`, for the closing summary."""

    def __init__(self):
        self.compared, self.tests = 0, 0
        self.kernels: set[str] = set()
        self.not_compared: Counter = Counter()

    def add_from(self, user_properties) -> None:
        for key, share in user_properties:
            if key == "real_gpu":
                self.add(share)

    def add(self, share) -> None:
        compared, kernels, not_compared = share
        self.compared += compared
        self.tests += bool(compared)
        self.kernels.update(kernels)
        for reason, n in not_compared:
            self.not_compared[reason] += n

    def lines(self, device: str) -> list[str]:
        out = [f"--real-gpu on {device}: {self.compared} emulated launches of "
               f"{len(self.kernels)} distinct kernels in {self.tests} tests also ran on the GPU "
               "and matched the emulator"]
        out += [f"--real-gpu: {n} launches not compared: {reason}"
                for reason, n in sorted(self.not_compared.items())]
        return out


class Session:
    """What conftest.py keeps for one pytest process: started when --real-gpu is given."""

    def __init__(self):
        self.requested = False
        self.problem: str | None = None  # why --real-gpu cannot run here
        self.twin: Twin | None = None
        self.device: str | None = None
        self.tally = Tally()

    def start(self) -> None:
        self.requested, self.problem = True, gpu_problem()
        if self.problem:
            return
        try:
            launcher = PycudaLauncher()
        except Exception as e:  # noqa: BLE001 (any failure to set up means: no GPU to use)
            self.problem = f"pycuda cannot use the GPU ({type(e).__name__}: {e})"
            return
        self.device, self.twin = launcher.device, Twin(launcher)
        self.twin.install()

    def stop(self) -> None:
        if self.twin is not None:
            self.twin.uninstall()

    def summary(self) -> list[str]:
        if not self.requested:
            return []
        if self.problem:
            return [f"{OPTION}: every test skipped, no GPU to use ({self.problem})"]
        return self.tally.lines(self.device or "the GPU")
