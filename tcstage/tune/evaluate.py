"""What happens to one candidate, inside its worker process: compile, prune, predict, check,
time. Jobs are plain data (the TC source, not Halide objects) so that they travel to Ray workers
as well as to forked ones.

Two phases, so that duplicates and hopeless candidates cost no check or measurement:
  `compile_job`   compile; prune options the kernel ignored and shared memory that does not
                  fit; the kernel's hash (equal kernels are evaluated once); the model's time;
  `check_job`     run on the tuning inputs (on the GPU, or under emulation) and compare with the
                  Halide CPU result; on the GPU, then time it.
"""

from __future__ import annotations

import functools
import hashlib
import math
import statistics

import attrs
import islpy as isl
import numpy as np

from tcstage.errors import TCError

# Work (statement instances) beyond which emulation is not attempted: the emulator runs a
# GPU's threads one at a time, about 1e8 simple instances a minute.
EMULATION_LIMIT = 5e7


@attrs.frozen
class Job:
    source: object  # the TC program's text, or a Halide pipeline (tc.from_halide)
    filename: str
    function: str
    args: tuple  # inputs: arrays (for checking) or shape tuples; scalars as values
    out: object  # in/out starting values (arrays) or None
    options: str  # the candidate's chain text
    device: object = None  # model.Device (the cost model's figures, shared memory limit)
    resources: bool = False  # ask ptxas for registers (costs an nvcc run)
    target: str = "cuda-emulated"  # where check_job runs it: "cuda" or "cuda-emulated"
    reference: tuple = ()  # the Halide CPU outputs to compare with
    runs: int = 20  # timed launches on a GPU
    narrow_accumulation: bool = False  # as the program was defined (tc.define)


@functools.lru_cache(maxsize=8)
def _program(source: str, filename: str, narrow_accumulation: bool = False):
    from tcstage.program import define
    return define(source, filename, narrow_accumulation=narrow_accumulation)


def _compile(job: Job):
    from tcstage.compiler import compile_cuda
    from tcstage.options import MappingOptions
    fn = job.source if not isinstance(job.source, str) else \
        _program(job.source, job.filename, job.narrow_accumulation)[job.function]
    return compile_cuda(fn, job.args, job.out, MappingOptions.parse(job.options))


def compile_job(job: Job) -> dict:
    """{"status": "ok" | "compile_error" | "pruned", "detail", "kernel" (hash of the CUDA source
    and launch shape), "predicted" (s), "work" (statement instances)}."""
    import warnings
    from tcstage.tune import model
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ignored options are pruned below, not printed
            compiled = _compile(job)
    except TCError as e:
        return {"status": "compile_error", "detail": _one_line(e)}
    if compiled.notes:  # an option the kernel ignores: a simpler candidate makes this kernel
        return {"status": "pruned", "detail": f"no effect: {compiled.notes[0]}"}
    device = job.device or model.H100
    shared = max(part.shared_bytes for part in compiled.parts)
    if shared > device.shared_per_block:
        return {"status": "pruned", "detail": f"{shared} bytes of shared memory per block; "
                                              f"the device has {device.shared_per_block}"}
    resources = None
    if job.resources:
        from tcstage.cuda.nvcc import resources as ptxas
        try:
            resources = ptxas(compiled.cuda.source)
        except TCError as e:
            return {"status": "compile_error", "detail": _one_line(e)}
    prediction = model.predict(compiled, device, resources)
    shape = "".join(f"{p.cuda.grid}{p.cuda.block}" for p in compiled.parts)
    kernel = hashlib.sha256(f"{shape}\0{compiled.cuda.source}".encode()).hexdigest()[:16]
    return {"status": "ok", "kernel": kernel, "predicted": float(prediction.time),
            "work": float(_work(compiled))}


def check_job(job: Job) -> dict:
    """{"status": "ok" | "wrong" | "compile_error", "detail", "time" (s, median of GPU launches;
    None under emulation), "error" (largest deviation from the reference)}."""
    import warnings
    from tcstage.cuda.runtime import Kernel
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kernel = Kernel(_compile(job), job.target)
    except TCError as e:
        return {"status": "compile_error", "detail": _one_line(e)}
    out = fresh(job.out)
    call = kernel.prepare(*job.args, out=out)
    results = call()
    results = results if isinstance(results, tuple) else (results,)
    results = [np.asarray(r.get() if hasattr(r, "get") and not isinstance(r, np.ndarray) else r)
               for r in results]
    verdict = compare(results, job.reference, kernel.compiled.fn.checked.outputs)
    if verdict:
        return {"status": "wrong", "detail": verdict}
    time = None
    if job.target == "cuda":
        time = _time_on_gpu(call, job.runs)
    return {"status": "ok", "time": time}


# half and bfloat16 outputs: four units in their last place (a reassociated float32 sum can
# round to a neighbour of the reference's value)
_NARROW_TOLERANCE = {"float16": 4 * 2.0**-10, "bfloat16": 4 * 2.0**-7}


def reference_outputs(fn, args, out) -> tuple:
    """The Halide CPU result every candidate is checked against: a TC function's default CPU
    kernel, or a Halide pipeline with every intermediate computed at the root (the plainest
    evaluation, whatever schedule its CPU calls get by default)."""
    from tcstage.halide.pipeline import HalideFunction
    result = fn(*args, schedule="root") if isinstance(fn, HalideFunction) else \
        fn(*args, out=fresh(out))
    return tuple(np.asarray(r) for r in (result if isinstance(result, tuple) else (result,)))


def compare(results, reference, names) -> str:
    """'' if every output matches the reference, else what differs where."""
    for name, got, want in zip(names, results, reference):
        want = np.asarray(want)
        if got.shape != want.shape:
            return f"{name}: shape {got.shape}, expected {want.shape}"
        if want.dtype.kind in "fc" or want.dtype.name == "bfloat16":
            tol = _NARROW_TOLERANCE.get(want.dtype.name,
                                        1e-3 if want.dtype.itemsize <= 4 else 1e-9)
            if want.dtype.name == "bfloat16":  # (ml_dtypes' type: compared in float64)
                got, want = np.asarray(got, np.float64), want.astype(np.float64)
            scale = max(float(np.max(np.abs(want), initial=0.0)), 1.0)
            bad = ~(np.isclose(got, want, rtol=tol, atol=tol * scale, equal_nan=True))
        else:
            bad = got != want
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            return (f"{name}{list(where)} = {got[where]!r}, expected {want[where]!r} "
                    f"({int(bad.sum())} of {bad.size} elements differ)")
    return ""


def _time_on_gpu(call, runs: int) -> float:
    """Median seconds of `runs` launches, timed with CUDA events after a warm-up."""
    import pycuda.driver as driver
    for _ in range(3):
        call.launch()
    times = []
    for _ in range(runs):
        start, end = driver.Event(), driver.Event()
        start.record()
        call.launch()
        end.record()
        end.synchronize()
        times.append(start.time_till(end) * 1e-3)
    return statistics.median(times)


def gpu_name() -> str | None:
    """'NVIDIA H100 80GB HBM3 (sm_90)' for the first GPU, or None where pycuda cannot see one.
    Call it in a worker: CUDA initialised in the tuner's process would not survive the fork."""
    try:
        import pycuda.driver as driver
        driver.init()
        device = driver.Device(0)
        major, minor = device.compute_capability()
        return f"{device.name()} (sm_{major}{minor})"
    except Exception:  # noqa: BLE001 - no pycuda, no driver, no GPU: all mean "none"
        return None


def _work(compiled) -> float:
    """Statement instances of the kernel (the domains' bounding boxes: an upper bound)."""
    total = 0.0
    for s in compiled.scop.statements:
        box = s.domain.intersect_params(compiled.scop.context)
        count = 1.0
        for k in range(box.dim(isl.dim_type.set)):
            lo, hi = box.dim_min_val(k), box.dim_max_val(k)
            if not (lo.is_int() and hi.is_int()):
                return math.inf
            count *= max(0, hi.to_python() - lo.to_python() + 1)
        total += count
    return total


def fresh(out):
    """A copy of in/out starting values, so every run starts from the same ones."""
    if out is None:
        return None
    return tuple(np.array(o) for o in out) if isinstance(out, tuple) else np.array(out)


def _one_line(e: Exception) -> str:
    text = " ".join(str(getattr(e, "message", None) or e).split())
    return text[:400] + ("..." if len(text) > 400 else "")


def emulable(work: float) -> bool:
    return work <= EMULATION_LIMIT and math.isfinite(work)
