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
import itertools
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
    as_written: bool = False  # compile the options as they are: neither fitted nor pruned
    #                           for options without effect (warm starts, listed candidates)
    sample: int = 0  # under emulation: check a sample of the blocks (this many at random
    #                  besides the grid's corners) instead of all of them
    seed: int = 0  # which random blocks


@functools.lru_cache(maxsize=8)
def _program(source: str, filename: str, narrow_accumulation: bool = False):
    from tcstage.program import define
    return define(source, filename, narrow_accumulation=narrow_accumulation)


def _compile(job: Job, codegen: bool = True):
    from tcstage.compiler import compile_cuda
    from tcstage.options import MappingOptions
    fn = job.source if not isinstance(job.source, str) else \
        _program(job.source, job.filename, job.narrow_accumulation)[job.function]
    return compile_cuda(fn, job.args, job.out, MappingOptions.parse(job.options),
                        codegen=codegen)


def compile_job(job: Job) -> dict:
    """{"status": "ok" | "compile_error" | "pruned", "detail", "options" (the chain compiled:
    the candidate's, with block and thread dimensions beyond the loops the schedule can map
    dropped), "kernel" (hash of the final schedule trees and launch shapes: equal hashes, equal
    kernels), "predicted" (s), "work" (statement instances), "launches", "scratch" (a reduction
    across blocks), "blocks" (the grid's blocks, summed over the launches)}.

    No CUDA source is printed: the model reads the schedule trees, and isl's AST generation
    costs more than the rest of a compile; the candidates checked compile in full."""
    import warnings
    from tcstage.tune import model
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ignored options are pruned below, not printed
            compiled = _compile(job, codegen=job.resources)
            fitted = fit_to_loops(compiled.options, compiled)
            if fitted != compiled.options and not job.as_written:
                job = attrs.evolve(job, options=str(fitted))  # the same kernel, asking for
                compiled = _compile(job, codegen=job.resources)  # no dimension it ignores
    except TCError as e:
        return {"status": "compile_error", "detail": _one_line(e)}
    if compiled.notes and not job.as_written:  # an option the kernel ignores: a simpler
        # candidate makes this kernel
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
    # (the trees carry the mapping, promotions, barriers and unroll marks; the read-only
    # cache is the one option only the printer applies)
    tree = "\0".join(f"{p.mapped.grid}{p.mapped.block}\0{p.promoted.schedule}"
                      for p in compiled.parts)
    kernel = hashlib.sha256(f"{compiled.options.use_read_only_cache}\0{tree}".encode()
                            ).hexdigest()[:16]
    return {"status": "ok", "options": job.options, "kernel": kernel,
            "predicted": float(prediction.time), **facts(compiled)}


def facts(compiled) -> dict:
    """What decides how a compiled kernel can be checked (`how_to_check`): "work" (statement
    instances), "launches", "scratch" (a reduction across blocks), "blocks" (summed over the
    launches)."""
    return {"work": float(_work(compiled)), "launches": len(compiled.parts),
            "scratch": any(r.across is not None for p in compiled.parts
                           for r in p.mapped.reductions),
            "blocks": sum(math.prod(p.mapped.grid) for p in compiled.parts)}


def fit_to_loops(options, compiled):
    """`options` with no more block and thread dimensions than `compiled`'s schedule mapped
    (a launch that can take the most counts): dimensions beyond them are ignored, so the
    fitted options make the same kernel without asking for what cannot happen. Where no loop
    takes threads (and no reduction does), one thread."""
    blocks = max(len(p.mapped.block_loops) for p in compiled.parts)
    threads = max(len(p.mapped.thread_loops) for p in compiled.parts)
    fitted = options
    if len(options.blocks) > max(blocks, 1):
        fitted = attrs.evolve(fitted, blocks=options.blocks[:blocks] if blocks else (1,))
    if len(options.threads) > max(threads, 1):
        fitted = attrs.evolve(fitted, threads=options.threads[:threads] if threads else (1,))
    return fitted


def check_job(job: Job) -> dict:
    """{"status": "ok" | "wrong" | "compile_error" | "unchecked", "detail", "checked" (how:
    "gpu", "emulated" or "sampled (...)"), "time" (s, median of GPU launches; None under
    emulation)}. A sampled check that wrote no output element checked nothing: "unchecked"."""
    import warnings
    from tcstage.cuda.runtime import Kernel
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kernel = Kernel(_compile(job), job.target)
    except TCError as e:
        return {"status": "compile_error", "detail": _one_line(e)}
    return check_kernel(kernel, job.args, job.out, job.reference, job.sample, job.seed,
                        job.runs)


def check_kernel(kernel, args, out, reference, sample: int = 0, seed: int = 0,
                 runs: int = 20) -> dict:
    """Runs `kernel` (a tcstage.cuda.runtime.Kernel) on `args` and compares its outputs with
    `reference`: whole, or with `sample` > 0 only a sample of its blocks (emulated); on a GPU
    then times it over `runs` launches. Returns check_job's dict."""
    out = fresh(out)
    names = kernel.compiled.fn.checked.outputs
    if sample:
        return _check_sample(kernel, args, out, reference, names, sample, seed)
    call = kernel.prepare(*args, out=out)
    results = _arrays(call())
    verdict = compare(results, reference, names)
    if verdict:
        return {"status": "wrong", "detail": verdict}
    time = None
    if kernel.target == "cuda":
        time = _time_on_gpu(call, runs)
    return {"status": "ok", "time": time,
            "checked": "gpu" if kernel.target == "cuda" else "emulated"}


def _arrays(results) -> list[np.ndarray]:
    results = results if isinstance(results, tuple) else (results,)
    return [np.asarray(r.get() if hasattr(r, "get") and not isinstance(r, np.ndarray) else r)
            for r in results]


def sample_blocks(grid, extra: int, seed: int) -> list[tuple[int, int, int]]:
    """The blocks a sampled check runs: the grid's corners (the first and the last block, and
    those at both ends of every dimension: the blocks that meet the iteration space's
    boundaries, where partial tiles are), then `extra` others at random."""
    ends = [sorted({0, g - 1}) for g in grid]
    chosen = list(dict.fromkeys(itertools.product(*ends)))
    rng = np.random.default_rng(seed)
    total = math.prod(grid)
    for linear in rng.choice(total, size=min(extra, total), replace=False):
        linear = int(linear)
        chosen.append((linear % grid[0], linear // grid[0] % grid[1], linear // (grid[0] * grid[1])))
    return list(dict.fromkeys(chosen))


def _sentinel(dtype: np.dtype):
    """A starting value that a computed element is unlikely to hold: NaN for floating point,
    an odd value near the bottom (signed) or top (unsigned) of an integer type's range."""
    if dtype.kind in "fc" or dtype.name == "bfloat16":
        return np.nan
    if dtype.kind == "b":
        return False
    info = np.iinfo(dtype)
    return info.min + 0x5A if dtype.kind == "i" else info.max - 0x25


def _check_sample(kernel, args, out, reference, names, sample: int, seed: int) -> dict:
    """Emulates the corners and `sample` random blocks of a single-launch kernel, outputs
    starting at a sentinel, and compares the elements they wrote with the reference (races
    within those blocks are caught as in a whole run)."""
    part = kernel.compiled.parts[0]
    blocks = sample_blocks(part.cuda.grid, sample, seed)
    starts = out if isinstance(out, tuple) else (out,) if out is not None else ()
    results = _arrays(kernel.prepare(*args, out=out, blocks=[blocks], fill=_sentinel)())
    written, total = 0, 0
    for k, (name, got, want) in enumerate(zip(names, results, reference)):
        start = np.asarray(starts[k]) if k < len(starts) and starts[k] is not None else None
        if start is not None:
            mask = got != start
        elif got.dtype.kind in "fc" or got.dtype.name == "bfloat16":
            mask = ~np.isnan(np.asarray(got, np.float64))
        else:
            mask = got != _sentinel(got.dtype)
        written += int(mask.sum())
        total += got.size
        want = np.asarray(want)
        # (the elements not written take the reference's values: only the written ones can
        # differ, and a difference is reported at its own index)
        verdict = compare([np.where(mask, got, want) if got.shape == want.shape else got],
                          [want], [name])
        if verdict:
            return {"status": "wrong", "detail": f"{verdict}, among the {int(mask.sum())} "
                                                 f"elements {len(blocks)} sampled blocks wrote"}
    grid = math.prod(part.cuda.grid)
    if not written:
        return {"status": "unchecked", "detail": f"not checked: the {len(blocks)} sampled blocks "
                                                 f"of {grid} wrote no output element"}
    return {"status": "ok", "time": None,
            "checked": f"sampled ({len(blocks)} of {grid} blocks, {written} of {total} "
                       "output elements)"}


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
        if box.is_empty():  # (no instance at these sizes: isl's bounds of it are not numbers)
            continue
        count = 1.0
        for k in range(box.dim(isl.dim_type.set)):
            lo, hi = box.dim_min_val(k), box.dim_max_val(k)
            if not (lo.is_int() and hi.is_int()):
                return math.inf
            count *= max(0, hi.to_python() - lo.to_python() + 1)
        total += count
    return total


def as_tuple(results) -> tuple:
    """A call's result (one array or a tuple of them) as a tuple of numpy arrays."""
    return tuple(np.asarray(x) for x in (results if isinstance(results, tuple) else (results,)))


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


SAMPLE_RANDOM = 4  # random blocks in a sampled check, besides the grid's corners (at most 8)


def how_to_check(compiled: dict) -> tuple[str, str]:
    """How a compiled candidate (compile_job's result) can be checked under emulation:
    ("emulated", "") whole, ("sampled", "") on a sample of its blocks, or ("", why not)."""
    work = compiled["work"]
    if emulable(work):
        return "emulated", ""
    if not math.isfinite(work):
        return "", "not checked: its instances cannot be counted"
    if compiled["launches"] > 1 or compiled["scratch"]:
        return "", (f"not checked: {work:.3g} instances are too many to emulate, and a sample "
                    "of blocks can stand for a kernel only where its blocks are independent (one "
                    "launch, no reduction across blocks)")
    if not emulable(work * (8 + SAMPLE_RANDOM) / compiled["blocks"]):
        return "", (f"not checked: {work:.3g} instances are too many to emulate, even in a "
                    f"sample of its {compiled['blocks']} blocks")
    return "sampled", ""
