"""`tc.autotune`: search the MappingOptions of one TC function at one set of sizes.

Generation 0 evaluates the warm starts as written (the caller's, the cache's, manual schedules,
the structural default, the presets); then, a generation at a time, the search strategy (an
optuna sampler) proposes candidates. Each goes through the evaluation phases of `evaluate.py`
in worker processes and its result goes back to the strategy; every new best is written to the
cache at once, checked or not (flagged), so that Ctrl-C, SIGTERM or a kill loses nothing found
before.

Limits: a number of candidates evaluated (`budget`), wall-clock seconds (`time_budget`), or an
effort level that sets both (`EFFORTS`); the search stops at the first one reached.

Objective: the time per call measured on the GPU, or, where there is none, the cost model's
prediction. A candidate's time counts only after its outputs matched the Halide CPU result on
the tuning inputs. On a GPU every candidate is checked. Under the model the check is emulation,
which costs about as much as everything else together, so it is spent where it decides the
outcome: on each candidate that would enter the best `CHECK_TOP` so far, best predicted first (a
candidate never checked can never be among them, hence never win). A kernel too large to
emulate whole is checked on a sample of its blocks (`evaluate.how_to_check`); one that cannot be
checked either way is unchecked, and a result that is unchecked says so (`TuneResult.checked`,
and a TCWarning).
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid

import attrs
import numpy as np

from tcstage.errors import TCError, warn
from tcstage.inputs import is_shape
from tcstage.options import MAX_THREADS_PER_BLOCK, MappingOptions
from tcstage.tune import evaluate
from tcstage.tune.evaluate import SAMPLE_RANDOM, Job, how_to_check
from tcstage.tune.heuristic import heuristic_options
from tcstage.tune.progress import Progress
from tcstage.tune.result import STATUSES, Candidate, TuneResult
from tcstage.tune.search import (DEFAULT_STRATEGY, EFFORTS, STRATEGIES, Limits, run,
                                 search_limits, stopping_signal)
from tcstage.tune.space import Space, build_space, loop_extents
from tcstage.tune.workers import LocalPool, default_memory, make_pool

TIMEOUT = 120.0  # seconds per candidate and phase
SCHEDULES = "schedules"  # manual schedules: the working directory's schedules/*.txt
PRESETS = ("naive", "pointwise", "mlp", "conv", "group_conv", "reduction")  # (TC's, then ours)


def autotune(source, name: str | None = None, *inputs, target: str = "cuda",
             measure: str | None = None, budget: int | None = None,
             time_budget: float | None = None, effort: str | None = None,
             generations: int | None = None, population: int | None = None, seed: int = 0,
             start_from=None, cache=None, progress: bool = True, strategy: str | None = None,
             jobs: int | None = None, timeout: float = TIMEOUT, evaluator=None, device=None,
             out=None, output_shape=None, candidates=None, log=None,
             manual_seeds: bool = True) -> TuneResult:
    """Searches MappingOptions for TC function `name` of `source` (TC text or a Program) at the
    shapes of `inputs` (arrays, or shape tuples; scalars as values).

    Limits (the search stops at the first reached): budget: candidates to evaluate;
    time_budget: seconds of wall time; effort: "quick", "default" or "thorough" (EFFORTS: about
    30 s, 2 min and 10 min on a 2-core machine, each with a candidate count to match), which
    a budget or time_budget given with it overrides. With none of them, effort="default";
    with only `budget`, no time limit (a run repeats exactly); `generations` alone keeps TC's
    population x generations.
    measure: "gpu" (time on the GPU), "model" (the cost model), or None (the GPU if one works
    here, else the model). strategy: "tpe" (the default: model-guided, optuna's
    Tree-structured Parzen Estimator) or "genetic" (TC's). start_from: MappingOptions, chain
    text, a preset name or "cache" to seed the search with. cache: None (the default cache), a
    path, or False. candidates: a list of options (MappingOptions or chain text) to evaluate
    exactly, with no search. log: a path to append every candidate's record to as JSON Lines.
    manual_seeds: seed with the working directory's schedules/*.txt lines for this function
    (False where the result is compared with them: tc.compare).
    Beyond the issue's API: strategy, jobs (parallel workers), timeout (seconds per candidate),
    evaluator ("local", "ray", or a pool object), device (the cost model's figures: "H100",
    "H200" or a model.Device), out (in/out starting values).
    A Halide pipeline (`tc.from_halide`) is tuned as `tc.autotune(f, *inputs,
    output_shape=...)`, with local workers (its Funcs cannot travel to a Ray cluster).
    """
    if target == "cpu":  # a measured search over CpuSchedule (tcstage/cpu/tune.py)
        if measure not in (None, "cpu"):
            raise TCError(f"target='cpu' measures on this CPU; measure={measure!r} is for "
                          "target='cuda'")
        from tcstage.compiler import function_of
        from tcstage.cpu.tune import autotune_cpu
        limits = search_limits(budget, time_budget, effort, population, generations, 1)
        program, fn, inputs = function_of(source, name, inputs, output_shape)
        return autotune_cpu(program, fn, inputs, limits=limits, seed=seed,
                            start_from=start_from, progress=progress, out=out,
                            strategy=strategy or DEFAULT_STRATEGY)
    if target not in ("cuda", "cuda-emulated"):
        raise TCError(f"unknown target {target!r}; autotune takes 'cuda', 'cuda-emulated' or "
                      "'cpu'")
    strategy = strategy or DEFAULT_STRATEGY
    if strategy not in STRATEGIES:
        raise TCError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    limits = search_limits(budget, time_budget, effort, population, generations, jobs)
    from tcstage.compiler import as_options, function_of
    given = None if candidates is None else [str(as_options(c)) for c in candidates]
    if given is not None and not given:
        raise TCError("candidates= is an empty list: give at least one MappingOptions")
    program, fn, inputs = function_of(source, name, inputs, output_shape)
    if program is None and evaluator not in (None, "local"):
        raise TCError("a Halide pipeline is tuned with local workers: its Funcs cannot be "
                      "sent to other processes than forked ones (evaluator='local')")
    session = _Session(program, fn, inputs, out, measure, device, cache, seed, jobs, timeout,
                       evaluator, log, manual_seeds)
    return session.search(strategy, limits, start_from, progress, given)


class _Session:
    """One tuning run's fixed facts: the function, sizes, inputs, device, cache, workers."""

    def __init__(self, program, fn, inputs, out, measure, device, cache, seed, jobs, timeout,
                 evaluator, log=None, manual_seeds=True):
        from tcstage.inputs import call_shapes
        from tcstage.tune import model
        self.program, self.fn, self.seed, self.timeout = program, fn, seed, timeout
        if program is not None and program.source is None:
            raise TCError("autotune needs the TC source text: pass the source, or a Program "
                          "made by tc.define")
        self.binding = fn.bind(inputs, out, shapes_only=True)
        self.sizes = dict(sorted(self.binding.sizes.items()))
        self.values = {**self.binding.sizes, **{k: v for k, v in self.binding.scalars.items()
                                                if not isinstance(v, np.ndarray)}}
        self.shape_args, out_shapes = call_shapes(fn.checked, self.values)
        self.out_shapes = tuple(out_shapes) or None
        self.given = (inputs, out) if all(not is_shape(a) for a in inputs) and \
            any(isinstance(a, np.ndarray) for a in inputs) else None
        self.reports = fn.ranges(*self.shape_args, out=self.out_shapes)
        self.space = build_space(loop_extents(self.reports), narrow_operands=any(
            t.type.name in ("float16", "bfloat16") for t in fn.checked.inputs),
            intermediates=any(t.kind == "temp" for t in fn.checked.tensors.values()))
        self.measure = _measure(measure)
        if isinstance(device, model.Device):
            self.model_device = device
        else:
            self.model_device = model.device_by_name(device) if device else model.H100
        if self.measure == "gpu":
            self.gpu = detect_gpu()
            if self.gpu is None:
                raise TCError("measure='gpu' needs a GPU that pycuda can use, and none works "
                              "here", notes=("measure='model' tunes with the cost model",))
            self.device_key = self.gpu
            self.measured_on = self.gpu.rsplit(" (", 1)[0]
        else:
            self.gpu = None
            self.device_key = f"model:{self.model_device.name}"
            self.measured_on = "model"
        self.cache = _open_cache(cache)
        self.key = None
        if self.cache is not None:
            from tcstage.tune.cache import Key
            self.key = Key.for_call(fn, self.binding, "cuda", self.device_key)
        # (no address-space limit where CUDA runs: its driver reserves far more than it uses)
        memory = None if self.measure == "gpu" else default_memory(jobs)
        self.compile_pool = make_pool(evaluator, jobs, timeout, memory)
        self.check_pool = LocalPool(1, timeout) if self.measure == "gpu" and \
            evaluator in (None, "local") else self.compile_pool
        self._reference = None
        self.log, self.manual_seeds = log, manual_seeds
        self.run = uuid.uuid4().hex[:12]  # names this run's records in the cache

    # -- candidates -------------------------------------------------------------------------
    def seeds(self, start_from) -> list[tuple[MappingOptions, str]]:
        """Warm starts, best first: start_from, the cache (this device at these sizes, then
        the nearest sizes, then other devices), manual schedules for this function at these
        sizes (schedules/*.txt), the structural default, the presets, a single thread."""
        from tcstage.compiler import as_options
        seeds: list[tuple[MappingOptions, str]] = []
        if start_from is not None and not (isinstance(start_from, str)
                                           and start_from.strip() == "cache"):
            seeds.append((as_options(start_from), "start_from"))
        if self.cache is not None:
            exact = self.cache.get(self.key)
            found = ([exact] if exact else []) + self.cache.nearest(self.key)
            for entry in found:
                try:
                    seeds.append((MappingOptions.parse(entry.options),
                                  f"cache ({entry.key.device}, "
                                  f"{', '.join(f'{k}={v}' for k, v in entry.key.sizes)})"))
                except TCError:
                    continue
        from tcstage.tune.compare import schedule_lines
        filename = None if self.program is None or self.program.filename.startswith("<") \
            else self.program.filename
        for label, options, where in schedule_lines(SCHEDULES, self.fn.name, filename,
                                                    self.sizes) if self.manual_seeds else ():
            seeds.append((options, f"schedules ({label}, {where})"))
        seeds.append((heuristic_options(self.fn, self.reports), "heuristic"))
        seeds += [(MappingOptions.named(p), f"preset {p}") for p in PRESETS]
        seeds.append((MappingOptions(), "single thread"))
        unique, seen = [], set()
        for options, origin in seeds:
            if str(options) not in seen:
                seen.add(str(options))
                unique.append((options, origin))
        return unique

    def job(self, options: str, check: bool = False, sample: bool = False) -> Job:
        args, out = (self.inputs_and_reference()[:2]) if check else \
            (tuple(self.shape_args), self.out_shapes)
        source, filename = (self.program.source, self.program.filename) if self.program \
            else (self.fn, "<halide>")  # a Halide pipeline travels as itself (forked workers)
        return Job(source, filename, self.fn.name, tuple(args), out,
                   options, device=self.model_device,
                   target="cuda" if self.measure == "gpu" else "cuda-emulated",
                   reference=self.inputs_and_reference()[2] if check else (),
                   narrow_accumulation=bool(self.program and self.program.narrow_accumulation),
                   sample=SAMPLE_RANDOM if sample else 0, seed=self.seed)

    def inputs_and_reference(self):
        """Tuning inputs (the caller's arrays, or random ones drawn like `tcstage run`'s) and
        the Halide CPU result on them; made on first need (large sizes may never need them)."""
        if self._reference is None:
            from tcstage.inputs import as_out, random_inputs
            if self.given is not None:
                args, out = self.given
                args = tuple(args)
            else:
                args, outs = random_inputs(self.fn.checked, self.values, self.seed)
                args, out = tuple(args), as_out(outs)
            self._reference = (args, out, evaluate.reference_outputs(self.fn, args, out))
        return self._reference

    # -- the search ---------------------------------------------------------------------------
    def search(self, strategy, limits: Limits, start_from, progress, given=None) -> TuneResult:
        if given is not None:  # a list to evaluate exactly: generation 0 is the whole run
            warm = [(options, "given") for options in dict.fromkeys(given)]
        else:
            warm = [(str(o), origin) for o, origin in self.seeds(start_from)]
        space, known = self.space, []
        for options, _ in warm:  # the warm starts the space can write, for the strategy
            genome = _exact_genome(space, MappingOptions.parse(options))
            if genome is not None:
                space = space.with_values(genome)
                known.append((options, genome))
        self.space = space
        bar = Progress(progress, f"{self.fn.name} ({self.measured_on})", limits.candidates,
                       limits.seconds)
        state, stopped, seconds = run({g.name: g.values for g in space.genes}, known,
                                      self.item, self.evaluate, warm, limits, strategy,
                                      self.seed, bar, self.record, listed=given is not None)
        return self.result(state, strategy, seconds, stopped)

    def item(self, genome: dict) -> tuple[str, str, str]:
        """(options text, origin, why it is pruned before compiling or '') for a proposal."""
        why = _pre_prune(genome, self.fn.checked.statements, self.reports)
        try:
            options = str(self.space.options(genome))
        except TCError:  # (a block beyond the CUDA limit cannot even be written down)
            options, why = _genome_text(genome), why or "not valid MappingOptions"
        return options, "search", why

    def evaluate(self, items, generation, state, bar, deadline=math.inf) -> list:
        """Evaluates one generation of (options, origin, why pruned) items; returns a record per
        item, in order (None for those the time limit left unevaluated)."""
        records: list[Candidate | None] = [None] * len(items)
        compile_jobs, where = [], []
        for i, (options, origin, why) in enumerate(items):
            earlier = state.by_options.get(options)
            if why or earlier is not None:
                records[i] = state.add(Candidate(
                    state.next_index(), options, "pruned",
                    earlier.time if earlier is not None and earlier.status == "ok" else None,
                    generation, why or f"repeats candidate {earlier.index}", source=origin,
                    compiled=False), bar)
                continue
            # (a warm start or a listed candidate is evaluated as written: the options it gives
            # that change nothing are no reason to skip it)
            compile_jobs.append(attrs.evolve(self.job(options), as_written=origin != "search"))
            where.append(i)
        compiled = {}
        outcomes = self.compile_pool.run(evaluate.compile_job, compile_jobs)
        try:
            for k, outcome in outcomes:
                compiled[k] = outcome
                if time.monotonic() >= deadline:
                    break  # (the candidates still compiling are given up)
        finally:
            with contextlib.suppress(AttributeError):
                outcomes.close()  # kills the workers still running
        to_check = []
        for k, i in enumerate(where):
            if k not in compiled:
                continue
            outcome, (options, origin, _) = compiled[k], items[i]
            if outcome.status != "ok":
                records[i] = state.add(Candidate(state.next_index(), options, outcome.status,
                                                 None, generation, outcome.detail,
                                                 source=origin), bar)
                continue
            r = outcome.value
            options = r.get("options", options)  # (fitted to the loops the schedule maps)
            if r["status"] != "ok":
                records[i] = state.add(Candidate(state.next_index(), options, r["status"],
                                                 None, generation, r["detail"],
                                                 source=origin), bar)
                continue
            same = state.by_kernel.get(r["kernel"])
            if same is not None:
                records[i] = state.add(Candidate(
                    state.next_index(), options, "pruned",
                    same.time if same.status == "ok" else None, generation,
                    f"same kernel as candidate {same.index}", r["predicted"], same.checked,
                    r["kernel"], origin), bar)
                continue
            to_check.append((i, options, r, origin))
        self.check(to_check, records, generation, state, bar)
        return records

    def check(self, to_check, records, generation, state, bar) -> None:
        if self.measure == "gpu":
            self.run_checks(to_check, records, generation, state, bar)
            return
        # The cost model: check where it decides the outcome (see the module docstring), in
        # rounds, best predicted first: a candidate that fails makes room for the next one.
        waiting = sorted(to_check, key=lambda t: t[2]["predicted"])
        while True:
            chosen = []
            for item in waiting:
                if state.would_rank(item[2]["predicted"]) and how_to_check(item[2])[0]:
                    chosen.append(item)
                    state.reserve(item[2]["predicted"])
            state.release()
            if not chosen:
                break
            waiting = [item for item in waiting if item not in chosen]
            self.run_checks(chosen, records, generation, state, bar)
        for i, options, r, origin in waiting:
            why = how_to_check(r)[1] or "not checked: never among the best predicted"
            records[i] = state.add(Candidate(state.next_index(), options, "ok", r["predicted"],
                                             generation, "", r["predicted"], why, r["kernel"],
                                             origin), bar)
            self.remember(records[i], state)

    def run_checks(self, chosen, records, generation, state, bar) -> None:
        jobs = [self.job(options, check=True,
                         sample=self.measure != "gpu" and how_to_check(r)[0] == "sampled")
                for _, options, r, _ in chosen]
        for k, outcome in self.check_pool.run(evaluate.check_job, jobs):
            i, options, r, origin = chosen[k]
            how = ""
            if outcome.status != "ok":
                status, t, detail = outcome.status, None, f"while checking: {outcome.detail}"
            else:
                v = outcome.value
                status, detail = v["status"], v.get("detail", "")
                if status == "unchecked":  # (a sample that wrote nothing checked nothing)
                    status, how, detail = "ok", detail, ""
                elif status == "ok":
                    how = v["checked"]
                t = (v["time"] if self.measure == "gpu" else r["predicted"]) \
                    if status == "ok" else None
            records[i] = state.add(Candidate(state.next_index(), options, status, t, generation,
                                             detail, r["predicted"], how, r["kernel"], origin),
                                   bar)
            self.remember(records[i], state)

    def remember(self, candidate: Candidate, state) -> None:
        """Writes a new best to the cache at once, checked or not (an unchecked one says so,
        and never displaces a checked one: cache.put): a later crash or kill keeps it."""
        if self.cache is None or candidate.status != "ok" or candidate.time is None:
            return
        best = state.best if candidate.is_checked else state.best_unchecked
        if best is not candidate:
            return
        from tcstage.tune.cache import Entry
        self.cache.put(Entry.new(self.key, candidate.options, candidate.time, self.measure,
                                 state.evaluated,
                                 candidate.checked if candidate.is_checked else ""))

    def record(self, candidate: Candidate) -> None:
        """Keeps a candidate's record: in the cache's records, and in the `log` file."""
        if self.cache is not None and candidate.compiled:
            self.cache.record(self.key, self.run, [candidate], self.measure)
        if self.log is not None:
            import json

            import tcstage
            row = {"run": self.run, "function": self.fn.name, "sizes": self.sizes,
                   "device": self.device_key, "measured": self.measured_on,
                   "version": tcstage.__version__, **attrs.asdict(candidate)}
            with open(self.log, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    def result(self, state, strategy, seconds, stopped) -> TuneResult:
        interrupted = stopped.startswith("interrupted")
        best, checked = state.best, True
        if best is None:  # nothing checked: the best unchecked one, if there is one
            best, checked = state.best_unchecked, False
            if best is None:
                if interrupted:  # (Ctrl-C before anything passed: Python's own meaning)
                    stop = KeyboardInterrupt(
                        f"tuning '{self.fn.name}' was {stopped} after {state.evaluated} "
                        "candidates, before any passed its check")
                    stop.signal = stopping_signal(stopped)  # ("": Ctrl-C)
                    raise stop
                raise TCError(f"no candidate for '{self.fn.name}' compiled and passed the check "
                              f"({state.evaluated} evaluated)")
            warn(f"the best options found for '{self.fn.name}' were not checked against the "
                 f"CPU result ({best.checked.removeprefix('not checked: ')}); tune with "
                 "measure='gpu' on a GPU, or check the kernel there")
        return TuneResult(MappingOptions.parse(best.options), best.time, self.measured_on,
                          tuple(state.history), self.fn.name, self.sizes, strategy, seconds,
                          checked, interrupted, self.device_key, best.checked, stopped)


def _pre_prune(genome, statements, reports) -> str:
    """Why a genome is not worth compiling ('' if it is): the block exceeds the device's
    threads, or uses less than a warp where the output loops offer more."""
    threads = math.prod(genome[f"thread_{a}"] for a in "xyz"[:genome["thread_dims"]])
    if threads > MAX_THREADS_PER_BLOCK:
        return f"{threads} threads per block; the device allows {MAX_THREADS_PER_BLOCK}"
    if threads < 32:
        parallel = max((math.prod(max(int(r.concrete[v][1]) - int(r.concrete[v][0]), 1)
                                  for v in st.indices if v in r.concrete)
                        for st, r in zip(statements, reports)), default=1)
        if parallel >= 32:
            return f"{threads} threads per block, less than a warp, while the output loops " \
                   f"have {parallel} iterations"
    return ""


def _genome_text(genome) -> str:
    return ", ".join(f"{k}={v}" for k, v in genome.items())


def _exact_genome(space: Space, options: MappingOptions):
    """A genome that decodes to exactly `options`, with values added to the space as needed;
    None if the options use something the space cannot express."""
    genome = space.encode(options)
    for k in range(len(space.loops)):
        genome[f"tile{k}"] = options.tile_sizes[k] if k < len(options.tile_sizes) else \
            space.gene(f"tile{k}").values[0]
    for k, axis in enumerate("xyz"):
        genome[f"thread_{axis}"] = options.threads[k] if k < len(options.threads) else 1
        genome[f"block_{axis}"] = options.blocks[k] if k < len(options.blocks) else 1
    genome.update(unroll=options.unroll_factor, max_shared=options.max_shared_memory,
                  shared_depth=options.shared_depth, private_depth=options.private_depth,
                  unroll_copy_shared=options.unroll_copy_shared)
    if len(options.tile_sizes) > len(space.loops):
        return None
    try:
        decoded = space.with_values(genome).options(genome)
    except TCError:
        return None
    return genome if str(decoded) == str(options) else None


def _measure(measure) -> str:
    if measure in ("gpu", "model"):
        return measure
    if measure is not None:
        raise TCError(f"measure must be 'gpu', 'model' or None (the GPU if one works here, "
                      f"else the model); got {measure!r}")
    return "gpu" if detect_gpu() else "model"


_GPU: list = []


def detect_gpu() -> str | None:
    """The GPU's name, asked in a worker process (CUDA must not start in the tuner's own
    process: forked workers could not use it), once per process."""
    if not _GPU:
        outcome = next(iter(LocalPool(1, 60).run(_gpu_name, [None])))[1]
        _GPU.append(outcome.value if outcome.status == "ok" else None)
    return _GPU[0]


def _gpu_name(_):
    return evaluate.gpu_name()


def _open_cache(cache):
    if cache is False:
        return None
    from tcstage.tune.cache import Cache
    return Cache(None if cache is None or cache is True else cache)


def tuned_options(fn, binding, device_key: str, cache=None) -> MappingOptions | None:
    """The cached best options for this call on this device, or None."""
    from tcstage.tune.cache import Key
    c = _open_cache(cache)
    if c is None:
        return None
    with c:
        entry = c.get(Key.for_call(fn, binding, "cuda", device_key))
    if entry is None:
        return None
    try:
        options = MappingOptions.parse(entry.options)
    except TCError:
        return None
    if not entry.checked:
        warn(f"options='auto' for '{getattr(fn, 'name', fn)}' uses tuned options that were never "
             f"checked against the CPU result (the kernel was too large to emulate when it was "
             f"tuned, on {entry.date}): {entry.options}; check the kernel on a GPU, or tune "
             "again at sizes that can be emulated")
    return options


__all__ = ["autotune", "TuneResult", "Candidate", "tuned_options", "STATUSES", "EFFORTS",
           "search_limits"]
