"""`tc.autotune`: search the MappingOptions of one TC function at one set of sizes.

A generation at a time, the search strategy (an optuna sampler) proposes candidates; each goes
through the evaluation phases of `evaluate.py` in worker processes; the results go back to the
strategy, and every new best is written to the cache at once (so Ctrl-C, or a kill, loses
nothing found before).

Objective: the time per call measured on the GPU, or, where there is none, the cost model's
prediction. A candidate's time counts only after its outputs matched the Halide CPU result on
the tuning inputs. On a GPU every candidate is checked. Under the model the check is emulation,
which costs about as much as everything else together, so it is spent where it decides the
outcome: on each candidate that would enter the best `CHECK_TOP` so far, best predicted first (a candidate never
checked can never be among them, hence never win). Kernels too large to emulate are marked
unchecked, and a result that is unchecked says so (`TuneResult.checked`, and a TCWarning).
"""

from __future__ import annotations

import datetime
import math
import time

import attrs
import numpy as np

from tcstage.errors import TCError, warn
from tcstage.options import MAX_THREADS_PER_BLOCK, MappingOptions
from tcstage.tune import evaluate
from tcstage.tune.evaluate import Job
from tcstage.tune.heuristic import heuristic_options
from tcstage.tune.space import Space, build_space, loop_extents
from tcstage.tune.workers import LocalPool, make_pool

STATUSES = ("ok", "wrong", "compile_error", "timeout", "crash", "pruned")
STRATEGIES = ("genetic", "tpe")
DEFAULT_STRATEGY = "tpe"  # better than genetic at equal budgets: benchmarks/results/tune-*
# The TC autotuner's defaults (the paper's Section 7; TC's GeneticTuner flags)
POPULATION, GENERATIONS, ELITES, CROSSOVER, MUTATION = 100, 25, 10, 0.8, 0.07
CHECK_TOP = 2  # under the model: emulate candidates that would enter the best two
# Candidates pruned before compiling (invalid launch shapes, repeats) cost nothing and do not
# count against the budget; the search stops anyway after this many proposals per unit of
# budget (a space almost all invalid). Everything compiled counts.
PROPOSALS = 20
TIMEOUT = 120.0  # seconds per candidate and phase
SCHEDULES = "schedules"  # manual schedules: the working directory's schedules/*.txt
PRESETS = ("naive", "pointwise", "mlp", "conv", "group_conv", "reduction")  # (TC's, then ours)


@attrs.frozen
class Candidate:
    """One evaluated candidate: `options` (chain text), `status` (one of STATUSES), `time`
    (seconds per call, measured or predicted; None unless ok), `generation`."""

    index: int
    options: str
    status: str
    time: float | None
    generation: int
    detail: str = ""  # why it failed or was pruned
    predicted: float | None = None  # the cost model's time
    checked: str = ""  # "gpu", "emulated", or why not
    kernel: str | None = None  # hash of the generated kernel (equal hashes: equal kernels)
    source: str = "search"  # "search", or where a warm start came from


@attrs.frozen
class TuneResult:
    options: MappingOptions  # the best
    time: float  # seconds per call of the best, measured or predicted
    measured_on: str  # the GPU's name, or "model"
    history: tuple[Candidate, ...]
    function: str
    sizes: dict
    strategy: str
    seconds: float  # tuning time
    checked: bool  # whether the best was checked against the CPU result
    interrupted: bool = False
    device: str = ""  # the cache key's device

    def curve(self) -> list[tuple[int, float]]:
        """(candidates evaluated, best time so far) after each improvement."""
        points, best = [], math.inf
        for n, c in enumerate(self.history, 1):
            if c.status == "ok" and c.time is not None and c.time < best and \
                    (c.checked in ("gpu", "emulated") or not self.checked):
                best = c.time
                points.append((n, best))
        return points

    def __str__(self) -> str:
        counts = {s: sum(c.status == s for c in self.history) for s in STATUSES}
        tally = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        how = "measured on " + self.measured_on if self.measured_on != "model" else \
            "predicted by the cost model"
        return (f"best for {self.function} ({', '.join(f'{k}={v}' for k, v in self.sizes.items())}): "
                f"{self.time * 1e6:.2f} us per call, {how}\n  {self.options}\n"
                f"  {len(self.history)} candidates ({tally}) in {self.seconds:.1f} s with "
                f"{self.strategy}{'; interrupted' if self.interrupted else ''}"
                f"{'' if self.checked else '; the best could not be checked (too large to emulate)'}")


def autotune(source, name: str | None = None, *inputs, target: str = "cuda",
             measure: str | None = None, budget: int | None = None,
             generations: int | None = None, population: int | None = None, seed: int = 0,
             start_from=None, cache=None, progress: bool = True, strategy: str | None = None,
             jobs: int | None = None, timeout: float = TIMEOUT, evaluator=None, device=None,
             out=None, output_shape=None) -> TuneResult:
    """Searches MappingOptions for TC function `name` of `source` (TC text or a Program) at the
    shapes of `inputs` (arrays, or shape tuples; scalars as values).

    measure: "gpu" (time on the GPU), "model" (the cost model), or None (the GPU if one works
    here, else the model). budget: candidates to evaluate (default population x generations:
    TC's 100 x 25). strategy: "tpe" (the default: model-guided, optuna's Tree-structured Parzen
    Estimator) or "genetic" (TC's). start_from: MappingOptions, chain text, a preset name or
    "cache" to seed the search with. cache: None (the default cache), a path, or False.
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
        program, fn, inputs = function_of(source, name, inputs, output_shape)
        return autotune_cpu(program, fn, inputs, budget=budget, seed=seed,
                            start_from=start_from, progress=progress, out=out)
    if target not in ("cuda", "cuda-emulated"):
        raise TCError(f"unknown target {target!r}; autotune takes 'cuda', 'cuda-emulated' or "
                      "'cpu'")
    strategy = strategy or DEFAULT_STRATEGY
    if strategy not in STRATEGIES:
        raise TCError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    from tcstage.compiler import function_of
    program, fn, inputs = function_of(source, name, inputs, output_shape)
    if program is None and evaluator not in (None, "local"):
        raise TCError("a Halide pipeline is tuned with local workers: its Funcs cannot be "
                      "sent to other processes than forked ones (evaluator='local')")
    session = _Session(program, fn, inputs, out, measure, device, cache, seed, jobs, timeout,
                       evaluator)
    population, generations, budget = _sizes(population, generations, budget)
    return session.search(strategy, population, budget, start_from, progress)


def _sizes(population, generations, budget) -> tuple[int, int, int]:
    for what, v in (("population", population), ("generations", generations),
                    ("budget", budget)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise TCError(f"{what} must be a positive integer, got {v!r}")
    if budget is None:
        population = population or POPULATION
        budget = population * (generations or GENERATIONS)
    elif population is None:
        population = max(4, min(POPULATION, budget // 4)) if generations is None else \
            max(1, -(-budget // generations))
    return population, (generations or -(-budget // population)), budget


class _Session:
    """One tuning run's fixed facts: the function, sizes, inputs, device, cache, workers."""

    def __init__(self, program, fn, inputs, out, measure, device, cache, seed, jobs, timeout,
                 evaluator):
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
        self.given = (inputs, out) if all(not _is_shape(a) for a in inputs) and \
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
            self.gpu = _detect_gpu()
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
        self.compile_pool = make_pool(evaluator, jobs, timeout, None)
        self.check_pool = LocalPool(1, timeout) if self.measure == "gpu" and \
            evaluator in (None, "local") else self.compile_pool
        self._reference = None
        self._mappable: dict = {}  # schedule and tiling genes -> (block, thread) loops

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
                                                    self.sizes):
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

    def job(self, options: str, check: bool = False) -> Job:
        args, out = (self.inputs_and_reference()[:2]) if check else \
            (tuple(self.shape_args), self.out_shapes)
        source, filename = (self.program.source, self.program.filename) if self.program \
            else (self.fn, "<halide>")  # a Halide pipeline travels as itself (forked workers)
        return Job(source, filename, self.fn.name, tuple(args), out,
                   options, device=self.model_device,
                   target="cuda" if self.measure == "gpu" else "cuda-emulated",
                   reference=self.inputs_and_reference()[2] if check else (),
                   narrow_accumulation=bool(self.program and self.program.narrow_accumulation))

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
    def search(self, strategy, population, budget, start_from, progress) -> TuneResult:
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        started = time.monotonic()
        seeds = self.seeds(start_from)
        space = self.space
        encoded = []
        for options, origin in seeds:
            genome = space.encode(options)
            if str(space.options(genome)) != str(options):
                genome = _exact_genome(space, options)
                if genome is None:
                    continue  # not expressible in the space (e.g. a 4-d block): skip it
            space = space.with_values(genome)
            encoded.append((genome, origin))
        self.space = space
        sampler = _sampler(strategy, population, self.seed)
        study = optuna.create_study(direction="minimize", sampler=sampler)
        for genome, origin in encoded:
            study.enqueue_trial(genome, user_attrs={"origin": origin}, skip_if_exists=True)
        state = _State(budget)
        bar = _Progress(progress, budget, self.fn.name, self.measured_on)
        interrupted = False
        try:
            with bar:
                generation = 0
                proposals = 0
                while state.evaluated < budget and proposals < PROPOSALS * budget:
                    count = min(population, budget - state.evaluated)
                    proposals += count
                    trials = [study.ask() for _ in range(count)]
                    genomes = [{g.name: t.suggest_categorical(g.name, g.values)
                                for g in space.genes} for t in trials]
                    origins = [t.user_attrs.get("origin", "search") for t in trials]
                    records = self.evaluate(genomes, origins, generation, state, bar)
                    for trial, record in zip(trials, records):
                        if record.time is not None and record.status in ("ok", "pruned"):
                            study.tell(trial, record.time)
                        else:
                            study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    generation += 1
        except KeyboardInterrupt:
            interrupted = True
        return self.result(state, strategy, time.monotonic() - started, interrupted)

    def evaluate(self, genomes, origins, generation, state, bar) -> list[Candidate]:
        """Evaluates one generation; returns a record per genome, in order."""
        records: list[Candidate | None] = [None] * len(genomes)
        compile_jobs, where = [], []
        for i, genome in enumerate(genomes):
            genome = self.repair(genome)
            why = _pre_prune(genome, self.fn.checked.statements, self.reports)
            try:
                options = str(self.space.options(genome))
            except TCError:  # (a block beyond the CUDA limit cannot even be written down)
                options = None
            earlier = state.by_options.get(options)
            if why or earlier is not None:
                records[i] = state.add(Candidate(
                    state.next_index(), options or _genome_text(genome), "pruned",
                    earlier.time if earlier is not None and earlier.status == "ok" else None,
                    generation, why or f"repeats candidate {earlier.index}",
                    source=origins[i]), bar, free=True)
                continue
            compile_jobs.append(self.job(options))
            where.append(i)
        compiled = {}
        for k, outcome in self.compile_pool.run(evaluate.compile_job, compile_jobs):
            compiled[k] = outcome
        to_check = []
        for k, i in enumerate(where):
            outcome = compiled[k]
            options = compile_jobs[k].options
            if outcome.status != "ok":
                records[i] = state.add(Candidate(state.next_index(), options, outcome.status,
                                                 None, generation, outcome.detail,
                                                 source=origins[i]), bar)
                continue
            r = outcome.value
            if r["status"] != "ok":
                records[i] = state.add(Candidate(state.next_index(), options, r["status"],
                                                 None, generation, r["detail"],
                                                 source=origins[i]), bar)
                continue
            same = state.by_kernel.get(r["kernel"])
            if same is not None:
                records[i] = state.add(Candidate(
                    state.next_index(), options, "pruned",
                    same.time if same.status == "ok" else None, generation,
                    f"same kernel as candidate {same.index}", r["predicted"], same.checked,
                    r["kernel"], origins[i]), bar)
                continue
            to_check.append((i, options, r))
        self.check(to_check, records, generation, origins, state, bar)
        return records

    def repair(self, genome: dict) -> dict:
        """The genome with no more block and thread dimensions than the schedule has loops to
        map (the polyhedral model says how many, for its schedule and tiling choices): extra
        ones would be ignored, making the same kernel as the genome without them."""
        key = tuple(genome.get(k) for k in ("fusion", "allow_skewing", "fix_parameters",
                                            "tile_count", "tile_imperfectly_nested",
                                            "register_tiling", "overlapped_tiles"))
        # threads take loops the blocks leave: their probe keeps the genome's block dimensions
        # (which of them are more than one block)
        blocking = tuple(genome[f"block_{a}"] > 1 for a in "xyz"[:genome["block_dims"]])
        if key not in self._mappable:
            self._mappable[key] = self.mappable_loops(genome)[0]
        if (key, blocking) not in self._mappable:
            self._mappable[key, blocking] = self.mappable_loops(genome, blocking)[1]
        blocks, threads = self._mappable[key], self._mappable[key, blocking]
        genome = dict(genome)
        for kind, n in (("block", blocks), ("thread", threads)):
            if n is not None and genome[f"{kind}_dims"] > max(n, 1):
                genome[f"{kind}_dims"] = max(n, 1)
            # (with parallel reductions a reduction loop may take threadIdx.x when the probe's
            # few threads find no other loop)
            if n == 0 and not (kind == "thread" and
                               genome.get("parallel_reductions") is not False):
                genome[f"{kind}_x"] = 1
        return genome

    def mappable_loops(self, genome: dict, blocking: tuple[bool, ...] = (True, True, True)
                       ) -> tuple[int | None, int | None]:
        """(loops blocks can take, loops threads can take) for the genome's schedule and
        tiling, from a compile with three of each asked for (blocks only in the dimensions
        `blocking` marks); None where it cannot be said."""
        import warnings
        from tcstage.compiler import compile_cuda
        probe = dict(genome, thread_dims=3, block_dims=max(len(blocking), 1), thread_x=2,
                     thread_y=2, thread_z=2, shared=False, private=False)
        probe.update({f"block_{a}": 2 if on else 1
                      for a, on in zip("xyz", blocking + (False,) * 3)})
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                parts = compile_cuda(self.fn, self.shape_args, self.out_shapes,
                                     self.space.options(probe)).parts
        except TCError:
            return None, None
        # (a kernel sequence: the launch that can take the most)
        return (max(len(p.mapped.block_loops) for p in parts),
                max(len(p.mapped.thread_loops) for p in parts))

    def check(self, to_check, records, generation, origins, state, bar) -> None:
        if self.measure == "gpu":
            self.run_checks(to_check, records, generation, origins, state, bar)
            return
        # The cost model: check where it decides the outcome (see the module docstring), in
        # rounds, best predicted first: a candidate that fails makes room for the next one.
        waiting = sorted(to_check, key=lambda t: t[2]["predicted"])
        while True:
            chosen = []
            for item in waiting:
                if state.would_rank(item[2]["predicted"]) and evaluate.emulable(item[2]["work"]):
                    chosen.append(item)
                    state.reserve(item[2]["predicted"])
            state.release()
            if not chosen:
                break
            waiting = [item for item in waiting if item not in chosen]
            self.run_checks(chosen, records, generation, origins, state, bar)
        for i, options, r in waiting:
            why = "not checked: never among the best predicted" if evaluate.emulable(r["work"]) \
                else f"not checked: {r['work']:.3g} instances are too many to emulate"
            records[i] = state.add(Candidate(state.next_index(), options, "ok", r["predicted"],
                                             generation, "", r["predicted"], why, r["kernel"],
                                             origins[i]), bar)

    def run_checks(self, chosen, records, generation, origins, state, bar) -> None:
        jobs = [self.job(options, check=True) for _, options, _ in chosen]
        for k, outcome in self.check_pool.run(evaluate.check_job, jobs):
            i, options, r = chosen[k]
            how = "gpu" if self.measure == "gpu" else "emulated"
            if outcome.status != "ok":
                status, t, detail = outcome.status, None, f"while checking: {outcome.detail}"
            else:
                v = outcome.value
                status, detail = v["status"], v.get("detail", "")
                t = (v["time"] if self.measure == "gpu" else r["predicted"]) \
                    if status == "ok" else None
            records[i] = state.add(Candidate(state.next_index(), options, status, t, generation,
                                             detail, r["predicted"], how if status == "ok" else
                                             "", r["kernel"], origins[i]), bar)
            if status == "ok" and self.cache is not None and state.best is records[i]:
                self.remember(records[i], state)

    def remember(self, best: Candidate, state) -> None:
        """Writes a new best to the cache at once (committed: a later crash keeps it)."""
        import tcstage
        from tcstage.tune.cache import Entry
        self.cache.put(Entry(self.key, best.options, best.time,
                             "gpu" if self.measure == "gpu" else "model", tcstage.__version__,
                             datetime.datetime.now(datetime.timezone.utc).isoformat(
                                 timespec="seconds"), len(state.history)))

    def result(self, state, strategy, seconds, interrupted) -> TuneResult:
        best = state.best
        checked = True
        if best is None:  # nothing checked: the best unchecked one, if the sizes forbade checks
            unchecked = [c for c in state.history if c.status == "ok" and c.time is not None
                         and c.checked.startswith("not checked: ") and "too many" in c.checked]
            if not unchecked:
                raise TCError(f"no candidate for '{self.fn.name}' compiled and passed the check "
                              f"({len(state.history)} evaluated"
                              f"{', interrupted' if interrupted else ''})")
            best = min(unchecked, key=lambda c: c.time)
            checked = False
            warn(f"'{self.fn.name}' at these sizes is too large to emulate: the tuned options "
                 "were not checked against the CPU result; tune with measure='gpu' on a GPU, "
                 "or check the kernel there")
            if self.cache is not None:
                self.remember(best, state)
        return TuneResult(MappingOptions.parse(best.options), best.time, self.measured_on,
                          tuple(state.history), self.fn.name, self.sizes, strategy, seconds,
                          checked, interrupted, self.device_key)


class _State:
    """The history so far, and what the next candidates are compared against."""

    def __init__(self, budget: int):
        self.budget = budget
        self.history: list[Candidate] = []
        self.by_options: dict[str, Candidate] = {}
        self.by_kernel: dict[str, Candidate] = {}
        self.best_times: list[float] = []  # checked ok times, ascending
        self._reserved: list[float] = []
        self.best: Candidate | None = None
        self.free = 0  # pruned before compiling

    @property
    def evaluated(self) -> int:
        """Candidates that cost an evaluation: all but those pruned before compiling."""
        return len(self.history) - self.free

    def next_index(self) -> int:
        return len(self.history)

    def add(self, c: Candidate, bar, free: bool = False) -> Candidate:
        self.history.append(c)
        self.free += free
        self.by_options.setdefault(c.options, c)
        if c.kernel is not None and c.status != "pruned":
            self.by_kernel.setdefault(c.kernel, c)
        if c.status == "ok" and c.checked in ("gpu", "emulated"):
            self.best_times = sorted(self.best_times + [c.time])
            if self.best is None or c.time < self.best.time:
                self.best = c
        bar.update(c, self.best, 0 if free else 1)
        return c

    def would_rank(self, t: float) -> bool:
        ranked = sorted(self.best_times + self._reserved)
        return len(ranked) < CHECK_TOP or t < ranked[CHECK_TOP - 1]

    def reserve(self, t: float) -> None:
        self._reserved.append(t)

    def release(self) -> None:
        self._reserved = []


def _sampler(strategy: str, population: int, seed: int):
    import optuna
    if strategy == "genetic":
        # NSGA-II with one objective is an elitist genetic algorithm: the next parents are the
        # best `population` of parents and children. Uniform crossover (two parents; the paper
        # draws genes from three) and per-gene mutation, at TC's rates.
        return optuna.samplers.NSGAIISampler(
            population_size=max(2, population), mutation_prob=MUTATION,
            crossover=optuna.samplers.nsgaii.UniformCrossover(), crossover_prob=CROSSOVER,
            seed=seed)
    import warnings
    with warnings.catch_warnings():  # multivariate TPE was "experimental" in optuna < 4.x
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True,
                                          n_startup_trials=min(population, 20),
                                          constant_liar=True)


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


def _is_shape(a) -> bool:
    return isinstance(a, tuple) and all(isinstance(d, (int, np.integer)) for d in a)


def _measure(measure) -> str:
    if measure in ("gpu", "model"):
        return measure
    if measure is not None:
        raise TCError(f"measure must be 'gpu', 'model' or None (the GPU if one works here, "
                      f"else the model); got {measure!r}")
    return "gpu" if _detect_gpu() else "model"


_GPU: list = []


def _detect_gpu() -> str | None:
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


class _Progress:
    """A rich progress bar: candidates evaluated of the budget, failures, best so far."""

    def __init__(self, enabled: bool, budget: int, function: str, measured_on: str):
        self.enabled, self.budget = enabled, budget
        self.counts = dict.fromkeys(STATUSES, 0)
        self.bar = None
        if enabled:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn)
            self.bar = Progress(TextColumn(f"tuning {function} ({measured_on})"), BarColumn(),
                                MofNCompleteColumn(), TimeElapsedColumn(),
                                TextColumn("{task.fields[status]}"), transient=False)
            self.task = self.bar.add_task("tune", total=budget, status="")

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def update(self, candidate: Candidate, best: Candidate | None, advance: int = 1) -> None:
        self.counts[candidate.status] += 1
        if self.bar is None:
            return
        c = self.counts
        failed = c["compile_error"] + c["crash"] + c["timeout"]
        status = (f"generation {candidate.generation}: ok {c['ok']}, pruned {c['pruned']}, "
                  f"failed {failed}, wrong {c['wrong']}"
                  + (f"; best {best.time * 1e6:.2f} us" if best else ""))
        self.bar.update(self.task, advance=advance, status=status)


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
        return MappingOptions.parse(entry.options)
    except TCError:
        return None


__all__ = ["autotune", "TuneResult", "Candidate", "tuned_options", "STATUSES"]
