"""The search core both tuners share: limits (effort levels, time, candidates), the strategy
(optuna samplers), generations, the history and its best, signals. What a candidate is and how
it is evaluated is the caller's: the CUDA tuner's MappingOptions, compiled and checked in
worker processes (tuner.py), or the CPU tuner's CpuSchedule, timed here (cpu/tune.py).

A space is given as genes (name -> the values it may take) and three functions:
`propose(genome) -> (options text, origin, why it is pruned before compiling or '')`, and
`evaluate(items, generation, state, bar, deadline) -> a Candidate or None per item`, which
records what it evaluates with `state.add`. Generation 0 is the warm starts as written; those
with a genome in the space (`known`) are shown to the strategy with their times.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time

import attrs

from tcstage.errors import TCError
from tcstage.tune.result import Candidate
from tcstage.tune.workers import STOPPING_SIGNALS

STRATEGIES = ("genetic", "tpe")
DEFAULT_STRATEGY = "tpe"  # better than genetic at equal budgets: benchmarks/results/tune-*
# The TC autotuner's defaults (the paper's Section 7; TC's GeneticTuner flags)
POPULATION, GENERATIONS, ELITES, CROSSOVER, MUTATION = 100, 25, 10, 0.8, 0.07
CHECK_TOP = 2  # where checks cost much: check candidates that would enter the best two
# Candidates pruned before compiling (invalid launch shapes, repeats) cost nothing and do not
# count against the budget; the search stops after this many generations in a row that
# compiled nothing new (a space exhausted, or almost all invalid). Everything compiled counts.
IDLE_GENERATIONS = 20


@attrs.frozen
class Effort:
    seconds: float  # wall time of the search (the checks of candidates compiled by then finish)
    candidates: int  # at most this many evaluated


# About 30 s, 2 min and 10 min on a 2-core machine under the cost model; the candidate counts
# are what those times allow there, so that a faster machine stops at the same search. The
# default's search stops at 110 s: with the reference result and the last checks the whole
# call stays within 2 minutes (at 120 s, gconv at the paper's sizes took 121 s).
EFFORTS = {"quick": Effort(30.0, 100), "default": Effort(110.0, 500),
           "thorough": Effort(600.0, 2500)}
DEFAULT_EFFORT = "default"


@attrs.frozen
class Limits:
    candidates: int | None  # evaluated candidates (None: no limit)
    seconds: float | None  # wall time (None: no limit)
    population: int  # candidates proposed per generation
    effort: str | None = None


def search_limits(budget=None, time_budget=None, effort=None, population=None,
                  generations=None, jobs=None) -> Limits:
    """The limits `tc.autotune`'s arguments ask for: the first reached stops the search.
    With none of budget, time_budget, effort and generations: effort "default". An effort's
    time and candidates, each replaced by time_budget or budget where given. budget alone:
    no time limit (a run repeats exactly); generations alone: TC's population x generations."""
    for what, v in (("population", population), ("generations", generations),
                    ("budget", budget)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise TCError(f"{what} must be a positive integer, got {v!r}")
    if time_budget is not None and (isinstance(time_budget, bool) or not isinstance(
            time_budget, (int, float)) or not time_budget > 0 or not math.isfinite(time_budget)):
        raise TCError(f"time_budget must be a positive number of seconds, got {time_budget!r}")
    if effort is not None and effort not in EFFORTS:
        raise TCError(f"unknown effort {effort!r}; choose one of {', '.join(EFFORTS)}")
    if effort is None and budget is None and time_budget is None and generations is None:
        effort = DEFAULT_EFFORT
    seconds, candidates = time_budget, budget
    if effort is not None:
        seconds = EFFORTS[effort].seconds if time_budget is None else time_budget
        candidates = EFFORTS[effort].candidates if budget is None else budget
    elif generations is not None and budget is None:
        candidates = (population or POPULATION) * generations
    if population is None:
        if generations is not None:
            population = max(1, -(-candidates // generations)) if candidates else POPULATION
        elif seconds is not None:
            # generations small enough for the strategy to learn often within the time (and
            # to stop close to it): a few rounds of the workers
            population = max(8, 4 * (jobs or os.cpu_count() or 1))
            population = min(population, candidates or population)
        else:
            population = max(4, min(POPULATION, candidates // 4))
    return Limits(candidates, float(seconds) if seconds is not None else None, population,
                  effort)


class SearchState:
    """The history so far, the best candidates, and what the next ones are compared against."""

    def __init__(self, started: float = 0.0, keep=None):
        self.started, self.keep = started, keep
        self.history: list[Candidate] = []
        self.by_options: dict[str, Candidate] = {}
        self.by_kernel: dict[str, Candidate] = {}
        self.best_times: list[float] = []  # checked ok times, ascending
        self._reserved: list[float] = []
        self.best: Candidate | None = None
        self.best_unchecked: Candidate | None = None
        self.signals: list[str] = []  # the stopping signals that came (see _stop_on_signals)

    @property
    def evaluated(self) -> int:
        """Candidates that cost an evaluation: all but those pruned before compiling."""
        return sum(c.compiled for c in self.history)

    def next_index(self) -> int:
        return len(self.history)

    def add(self, c: Candidate, bar) -> Candidate:
        c = attrs.evolve(c, seconds=round(time.monotonic() - self.started, 3))
        self.history.append(c)
        self.by_options.setdefault(c.options, c)
        if c.kernel is not None and c.status != "pruned":
            self.by_kernel.setdefault(c.kernel, c)
        if c.status == "ok" and c.time is not None:
            if c.is_checked:
                self.best_times = sorted(self.best_times + [c.time])
                if self.best is None or c.time < self.best.time:
                    self.best = c
            elif self.best_unchecked is None or c.time < self.best_unchecked.time:
                self.best_unchecked = c
        if self.keep is not None:
            self.keep(c)
        bar.update(c, self.best or self.best_unchecked)
        if self.signals:  # (the handler's own KeyboardInterrupt was lost: see _stop_on_signals)
            raise KeyboardInterrupt
        return c

    def would_rank(self, t: float) -> bool:
        ranked = sorted(self.best_times + self._reserved)
        return len(ranked) < CHECK_TOP or t < ranked[CHECK_TOP - 1]

    def reserve(self, t: float) -> None:
        self._reserved.append(t)

    def release(self) -> None:
        self._reserved = []


def run(genes: dict, known, propose, evaluate, warm, limits: Limits, strategy: str, seed: int,
        bar, keep=None, listed: bool = False) -> tuple[SearchState, str, float]:
    """Searches; returns (the state, why it stopped, seconds). `warm`: (options text, origin)
    evaluated first, as written; `known`: (options text, genome) of those the space can write;
    `listed`: the warm starts are the whole run (a list of candidates)."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.monotonic()
    deadline = started + limits.seconds if limits.seconds else math.inf
    state = SearchState(started, keep)
    if limits.candidates is not None:
        warm = warm[:limits.candidates]
    study = optuna.create_study(direction="minimize",
                                sampler=sampler(strategy, limits.population, seed))
    distributions = {name: optuna.distributions.CategoricalDistribution(values)
                     for name, values in genes.items()}
    stopped = "list" if listed else ""
    with bar, _stop_on_signals(state.signals) as caught:
        try:
            records = evaluate([(o, origin, "") for o, origin in warm], 0, state, bar, deadline)
            by_options = {r.options: r for r in records if r is not None}
            for options, genome in known:
                r = by_options.get(options)
                if r is not None and r.status in ("ok", "pruned") and r.time is not None:
                    study.add_trial(optuna.trial.create_trial(
                        params=genome, distributions=distributions, value=r.time))
            bar.generation(0)
            generation, idle = 1, 0
            while not stopped:
                stopped = ("budget" if limits.candidates is not None and
                           state.evaluated >= limits.candidates else
                           "time" if time.monotonic() >= deadline else
                           "space" if idle >= IDLE_GENERATIONS else "")
                if stopped:
                    break
                count = limits.population if limits.candidates is None else \
                    min(limits.population, limits.candidates - state.evaluated)
                trials = [study.ask() for _ in range(count)]
                genomes = [{name: t.suggest_categorical(name, values)
                            for name, values in genes.items()} for t in trials]
                before = state.evaluated
                records = evaluate([propose(g) for g in genomes], generation, state, bar,
                                   deadline)
                idle = idle + 1 if state.evaluated == before else 0
                for trial, record in zip(trials, records):
                    if record is not None and record.time is not None and \
                            record.status in ("ok", "pruned"):
                        study.tell(trial, record.time)
                    else:
                        study.tell(trial, state=optuna.trial.TrialState.FAIL)
                bar.generation(generation)
                generation += 1
        except KeyboardInterrupt:
            named = [name for name in caught if name != "SIGINT"]  # (Ctrl-C needs no name)
            stopped = "interrupted" + (f" ({named[0]})" if named else "")
    return state, stopped, time.monotonic() - started


def stopping_signal(stopped: str) -> str:
    """The signal named in a stop reason, `interrupted (SIGTERM)` ("" for Ctrl-C's, which
    goes unnamed, and for other reasons)."""
    return stopped.partition("(")[2].rstrip(")") if stopped.startswith("interrupted") else ""


def sampler(strategy: str, population: int, seed: int):
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


@contextlib.contextmanager
def _stop_on_signals(caught: list[str]):
    """SIGINT, SIGTERM and SIGHUP stop the search (the best so far is returned and is already
    in the cache), where this is the main thread (only it may set handlers); `caught` gets the
    name of each signal that came. The handler raises KeyboardInterrupt at once, and the
    search also checks `caught` after each candidate: a KeyboardInterrupt raised while Python
    runs a finalizer (a generator closed by the garbage collector, a connection's __del__) is
    printed and dropped, and once that left a tuning run going after Ctrl-C. Such a drop is not
    printed while the search runs (it stops anyway): a SIGTERM that came during a fork printed
    a traceback from logging's fork hook, which a caller reads as a crash."""
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def stop(number, _frame):
        caught.append(signal.Signals(number).name)
        raise KeyboardInterrupt

    printing = sys.unraisablehook

    def drop_own_interrupts(unraisable):
        if not (caught and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            printing(unraisable)

    previous = {}
    for sig in STOPPING_SIGNALS:
        # (a signal the caller ignores stays ignored, as `nohup` and background jobs expect)
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, stop)
    sys.unraisablehook = drop_own_interrupts
    try:
        yield caught
    finally:
        sys.unraisablehook = printing
        for sig, handler in previous.items():
            signal.signal(sig, handler)
