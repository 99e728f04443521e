"""`tc.autotune(..., target="cpu")`: a measured search over CpuSchedule.

The space is the structured scheduler's parameters (register tile, vector width, reduction
unrolling, packing, fusion of pointwise temporaries, parallel outer loop). The search is the
CUDA tuner's (tune/search.py: the same limits, effort levels, strategies, progress and
signals), starting from the scheduler's own choices and `start_from`. Every candidate is compiled and timed for real on this machine, in
this process: a CPU compile takes well under a second, and the structured scheduler turns its
own failures into an autoscheduled pipeline rather than a crash, so a worker process per
candidate (as the CUDA tuner needs) would only add start-up time. Each candidate's result is
compared with Halide's unscheduled code (a different schedule of the same algorithm); one that
differs is "wrong" and cannot win.
"""

from __future__ import annotations

import os
import platform
import statistics
import time

import attrs
import halide as hl

from tcstage.cpu.options import CpuSchedule
from tcstage.errors import TCError
from tcstage.inputs import as_out, is_shape, random_inputs
from tcstage.tune.evaluate import as_tuple, compare, fresh
from tcstage.tune.progress import Progress
from tcstage.tune.result import Candidate, TuneResult
from tcstage.tune.search import DEFAULT_STRATEGY, Limits, run

SECONDS_PER_CANDIDATE = 0.25  # timing budget per candidate (at least 3 calls)


def space(lanes: int) -> dict[str, list]:
    """The categorical choices, from the target's natural vector width."""
    return {
        "vectors": [0, 1, 2, 3, 4],
        "rows": [0, 1, 2, 3, 4, 6, 8, 12],
        "lanes": sorted({0, lanes, max(1, lanes // 2), max(1, lanes // 4)}),
        "unroll": [1, 2, 4],
        "pack": [True, False],
        "inline": [True, False],
        "parallel": [True, False],
    }


def _schedule(params: dict) -> CpuSchedule:
    return CpuSchedule(register_tile=(params["vectors"], params["rows"]),
                       vector_lanes=params["lanes"], unroll_reduction=params["unroll"],
                       pack_operands=params["pack"], inline_pointwise=params["inline"],
                       parallel_outer=params["parallel"])


def _params(s: CpuSchedule) -> dict:
    return {"vectors": s.register_tile[0], "rows": s.register_tile[1], "lanes": s.vector_lanes,
            "unroll": s.unroll_reduction, "pack": s.pack_operands,
            "inline": s.inline_pointwise, "parallel": s.parallel_outer}


def machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), "")
    except OSError:
        pass
    return f"cpu: {model or platform.processor() or platform.machine()} " \
           f"({len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} cores)"


def autotune_cpu(program, fn, inputs, *, limits: Limits, seed=0, start_from=None,
                 progress=True, out=None, strategy: str = DEFAULT_STRATEGY):
    """Searches CpuSchedule for TC function `fn` (a TCFunction of `program`) at the shapes
    of `inputs` (arrays; shape tuples get random values), within `limits`, on the tuners'
    shared search core (tune/search.py). Returns a TuneResult whose `options` is the best
    CpuSchedule."""
    if program is None:
        raise TCError("target='cpu' tunes TC functions; a Halide pipeline (tc.from_halide) "
                      "keeps the schedule its author wrote",
                      notes=("tune its CUDA mapping with target='cuda'",))
    f = fn
    args, out = _arguments(f, inputs, out)
    starts = [CpuSchedule()] + ([_start(start_from)] if start_from is not None else [])
    reference = as_tuple(f(*args, schedule=None, out=fresh(out)))
    lanes = hl.get_jit_target_from_environment().natural_vector_size(hl.Float(32))
    genes = {k: tuple(v) for k, v in space(lanes).items()}
    measured_on = machine()

    def propose(genome: dict) -> tuple[str, str, str]:
        return str(_schedule(genome)), "search", ""

    def evaluate(items, generation, state, bar, deadline) -> list:
        records = []
        for options, origin, _ in items:
            earlier = state.by_options.get(options)
            if earlier is not None:  # the same schedule again: its time, not a new run
                records.append(state.add(Candidate(
                    state.next_index(), options, "pruned", earlier.time if
                    earlier.status == "ok" else None, generation,
                    f"repeats candidate {earlier.index}", source=origin, compiled=False), bar))
            elif time.monotonic() >= deadline:
                records.append(None)
            else:
                c = _evaluate(f, args, out, CpuSchedule.parse(options), reference,
                              state.next_index())
                records.append(state.add(attrs.evolve(c, generation=generation,
                                                      source=origin), bar))
        return records

    warm = [(str(s), "default" if k == 0 else "start_from") for k, s in enumerate(starts)]
    known = [(str(s), _params(s)) for s in starts]
    bar = Progress(progress, f"{f.name} ({measured_on})", limits.candidates, limits.seconds)
    state, stopped, seconds = run(genes, known, propose, evaluate, warm, limits, strategy,
                                  seed, bar)
    best = state.best
    if best is None:
        if stopped.startswith("interrupted"):
            raise KeyboardInterrupt(f"tuning '{f.name}' was {stopped} before any schedule ran "
                                    "correctly")
        raise TCError(f"no CPU schedule of '{f.name}' ran correctly among "
                      f"{state.evaluated} candidates", notes=tuple(
                          f"{c.options}: {c.status} {c.detail}" for c in state.history[:5]))
    return TuneResult(CpuSchedule.parse(best.options), best.time, measured_on,
                      tuple(state.history), f.name, dict(f.bind(args).sizes), strategy,
                      seconds, True, stopped.startswith("interrupted"), measured_on, "cpu",
                      stopped)


def _start(start_from) -> CpuSchedule:
    if isinstance(start_from, CpuSchedule):
        return start_from
    if isinstance(start_from, str):
        return CpuSchedule.parse(start_from)
    raise TCError(f"start_from for target='cpu' takes a CpuSchedule or its text, got "
                  f"{type(start_from).__name__}")


def _arguments(f, inputs, out) -> tuple:
    """The call's arrays and out= values, or random ones drawn as `tcstage run` draws them
    (index tensors within the extents they index) where shapes stand in for arrays."""
    if not any(is_shape(a) for a in inputs):
        return tuple(inputs), out
    values = {**f.bind(inputs, None, shapes_only=True).sizes,
              **{t.name: a for t, a in zip(f.checked.inputs, inputs) if not t.rank}}
    args, outs = random_inputs(f.checked, values, 0)
    return tuple(args), as_out(outs)


def _evaluate(f, args, out, schedule, reference, index):
    try:
        got = as_tuple(f(*args, schedule=schedule, out=fresh(out)))
    except TCError as e:
        return Candidate(index, str(schedule), "compile_error", None, 0, e.message)
    wrong = compare(got, reference, f.checked.outputs)
    if wrong:
        return Candidate(index, str(schedule), "wrong", None, 0,
                         f"differs from Halide's unscheduled result: {wrong}")
    times, start = [], time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < SECONDS_PER_CANDIDATE:
        t = time.perf_counter()
        f(*args, schedule=schedule, out=fresh(out))
        times.append(time.perf_counter() - t)
        if len(times) >= 1000:
            break
    return Candidate(index, str(schedule), "ok", statistics.median(times), 0,
                     checked="cpu")
