"""`tc.autotune(..., target="cpu")`: a measured search over CpuSchedule.

The space is the structured scheduler's parameters (register tile, vector width, reduction
unrolling, packing, fusion of pointwise temporaries, parallel outer loop); optuna's TPE sampler
(the CUDA tuner's default strategy) proposes candidates, starting from the scheduler's own
choices and `start_from`. Every candidate is compiled and timed for real on this machine, in
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

import numpy as np

from tcstage.cpu.options import CpuSchedule
from tcstage.errors import TCError

DEFAULT_BUDGET = 40
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


def autotune_cpu(program, fn, inputs, *, budget=None, seed=0, start_from=None,
                 progress=True, out=None):
    """Searches CpuSchedule for TC function `fn` (a TCFunction of `program`) at the shapes
    of `inputs` (arrays; shape tuples get random values). Returns a TuneResult whose
    `options` is the best CpuSchedule."""
    import optuna

    from tcstage.tune.tuner import Candidate, TuneResult, _Progress

    if program is None:
        raise TCError("target='cpu' tunes TC functions; a Halide pipeline (tc.from_halide) "
                      "keeps the schedule its author wrote",
                      notes=("tune its CUDA mapping with target='cuda'",))
    f = program[fn.name] if hasattr(program, "__getitem__") else fn
    args = _arrays(f, inputs)
    budget = DEFAULT_BUDGET if budget is None else int(budget)
    if budget < 1:
        raise TCError(f"budget must be at least 1 candidate, got {budget}")
    starts = [CpuSchedule()] + ([_start(start_from)] if start_from is not None else [])
    reference = _outputs(f(*args, schedule=None, out=_copies(out)))
    import halide as hl
    lanes = hl.get_jit_target_from_environment().natural_vector_size(hl.Float(32))
    choices = space(lanes)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize",
                                sampler=optuna.samplers.TPESampler(seed=seed))
    for s in starts:
        study.enqueue_trial(_params(s), skip_if_exists=True)
    measured_on = machine()
    history, seen, best = [], {}, None
    t0 = time.perf_counter()
    interrupted = False
    with _Progress(progress, budget, f.name, measured_on) as bar:
        try:
            for index in range(budget):
                trial = study.ask({k: optuna.distributions.CategoricalDistribution(v)
                                   for k, v in choices.items()})
                schedule = _schedule(trial.params)
                if schedule in seen:  # the same schedule again: its time, not a new run
                    study.tell(trial, seen[schedule])
                    bar.update(Candidate(index, str(schedule), "pruned", None, 0,
                                         "a repeat"), best)
                    continue
                candidate = _evaluate(f, args, out, schedule, reference, index)
                history.append(candidate)
                value = candidate.time if candidate.status == "ok" else float("inf")
                seen[schedule] = value
                study.tell(trial, value if value != float("inf") else 1e9)
                if candidate.status == "ok" and (best is None or candidate.time < best.time):
                    best = candidate
                bar.update(candidate, best)
        except KeyboardInterrupt:
            interrupted = True
    if best is None:
        raise TCError(f"no CPU schedule of '{f.name}' ran correctly among {len(history)} "
                      "candidates", notes=tuple(f"{c.options}: {c.status} {c.detail}"
                                                for c in history[:5]))
    return TuneResult(CpuSchedule.parse(best.options), best.time, measured_on, tuple(history),
                      f.name, dict(f.bind(args).sizes), "tpe", time.perf_counter() - t0, True,
                      interrupted, measured_on)


def _start(start_from) -> CpuSchedule:
    if isinstance(start_from, CpuSchedule):
        return start_from
    if isinstance(start_from, str):
        return CpuSchedule.parse(start_from)
    raise TCError(f"start_from for target='cpu' takes a CpuSchedule or its text, got "
                  f"{type(start_from).__name__}")


def _arrays(f, inputs) -> tuple:
    rng = np.random.default_rng(0)
    out = []
    for t, x in zip(f.checked.inputs, inputs):
        if isinstance(x, tuple) and all(isinstance(d, int) for d in x):
            kind = t.type.numpy
            x = (rng.standard_normal(x).astype(kind) if np.dtype(kind).kind == "f"
                 else rng.integers(0, 2, size=x).astype(kind))
        out.append(x)
    return tuple(out)


def _copies(out):
    if out is None:
        return None
    return tuple(np.array(o) for o in out) if isinstance(out, tuple) else np.array(out)


def _outputs(result) -> tuple:
    return tuple(np.asarray(r) for r in (result if isinstance(result, tuple) else (result,)))


def _evaluate(f, args, out, schedule, reference, index):
    from tcstage.tune.tuner import Candidate
    try:
        got = _outputs(f(*args, schedule=schedule, out=_copies(out)))
    except TCError as e:
        return Candidate(index, str(schedule), "compile_error", None, 0, e.message)
    for g, r in zip(got, reference):
        scale = float(np.max(np.abs(r))) if r.size else 0.0
        if g.shape != r.shape or not np.allclose(g, r, rtol=1e-4, atol=1e-5 * max(scale, 1.0),
                                                 equal_nan=True):
            return Candidate(index, str(schedule), "wrong", None, 0,
                             "differs from Halide's unscheduled result")
    times, start = [], time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < SECONDS_PER_CANDIDATE:
        t = time.perf_counter()
        f(*args, schedule=schedule, out=_copies(out))
        times.append(time.perf_counter() - t)
        if len(times) >= 1000:
            break
    return Candidate(index, str(schedule), "ok", statistics.median(times), 0,
                     checked="cpu")
