#!/usr/bin/env python3
"""The autotuner's strategies against each other and against the manual schedules, on the
paper's kernels at the paper's sizes (schedules/paper-manual.txt).

    python benchmarks/tune_bench.py [--budget 60] [--kernels tmm-small,tbmm]
                                    [--strategies genetic,tpe] [--seeds 0,1] [--jobs 2]
    python benchmarks/tune_bench.py --efforts quick,default [--kernels tmm-medium,tbmm,...]

With --efforts, each kernel is tuned once per effort level (default strategy, seed 0, not
seeded with the manual schedules it is compared with) and the report gives the wall time, the
candidates evaluated, the best found, how it was checked, and the manual options' prediction:
benchmarks/results/tune-efforts-<machine>-<date>.{json,md}.

Per kernel, strategy and seed, at equal budgets: tuning time, candidates evaluated (not
pruned) and proposed in all, the best time found, the manual schedule's and the naive
kernel's predicted time from the same cost model, and tuned / manual. With a GPU that pycuda
can use the tuner measures (measure="gpu"); without one it predicts with the cost model's H100
figures, and the manual and naive columns are always the model's. At the paper's sizes most
kernels are too large to emulate: their best is unchecked, which the table says. Candidates
that crash or hang are compiler bugs: the report lists them. Results go to
benchmarks/results/tune-<machine>-<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tcstage as tc  # noqa: E402
from gpu_bench import ROOT, cases, program, shapes  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in out.splitlines()
                     if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        model = platform.processor() or platform.machine()
    import os
    return f"{model}, {os.cpu_count()} cores"


def predicted(fn, args, options) -> float | None:
    """The cost model's H100 time for `options`, or None if they do not compile."""
    from tcstage.compiler import compile_cuda
    from tcstage.tune import model
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(model.predict(compile_cuda(fn, args, None, options), model.H100).time)
    except tc.TCError:
        return None


def us(t) -> str:
    return "-" if t is None else f"{t * 1e6:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=int, default=60)
    p.add_argument("--kernels", default="", help="comma-separated case names (default: all)")
    p.add_argument("--strategies", default="genetic,tpe")
    p.add_argument("--seeds", default="0")
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--measure", choices=("gpu", "model"), default=None,
                   help="default: the GPU if one works here, else the model")
    p.add_argument("--out", default=None, help="file stem under benchmarks/results/")
    p.add_argument("--efforts", default="", help="comma-separated effort levels: time each "
                                                  "(instead of strategies at a budget)")
    a = p.parse_args(argv)
    if a.efforts:
        return efforts(a, argv)
    all_cases = cases()
    wanted = [k.strip() for k in a.kernels.split(",") if k.strip()]
    unknown = set(wanted) - {c["name"] for c in all_cases}
    if unknown:
        raise SystemExit(f"unknown kernels: {', '.join(sorted(unknown))}")
    chosen = [c for c in all_cases if not wanted or c["name"] in wanted]
    strategies = [s.strip() for s in a.strategies.split(",") if s.strip()]
    seeds = [int(s) for s in a.seeds.split(",")]

    from tcstage.tune.tuner import detect_gpu
    measure = a.measure or ("gpu" if detect_gpu() else "model")
    where = "GPU " + detect_gpu() if measure == "gpu" else "model (no GPU), cost model H100"
    host = machine()
    date = datetime.date.today().isoformat()
    command = "python3 benchmarks/tune_bench.py " + " ".join(sys.argv[1:] if argv is None
                                                              else argv)
    print(f"# tune_bench: {host}; {where}; budget {a.budget}; {date}", flush=True)

    rows, failures = [], []
    for case in chosen:
        fn = program(case["file"])[case["function"]]
        args = [s for _, s, _ in shapes(fn, case["sizes"])]
        manual = predicted(fn, args, case["options"])
        naive = predicted(fn, args, tc.MappingOptions())
        for strategy in strategies:
            for seed in seeds:
                started = time.monotonic()
                row = {"kernel": case["name"], "strategy": strategy, "seed": seed,
                       "manual_s": manual, "naive_s": naive}
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", tc.TCWarning)
                        warnings.simplefilter("ignore", FutureWarning)  # optuna's deprecations
                        res = tc.autotune(program(case["file"]), case["function"], *args,
                                          measure=measure, budget=a.budget, strategy=strategy,
                                          cache=False, progress=False, seed=seed, jobs=a.jobs)
                except tc.TCError as e:
                    row.update(error=str(e).splitlines()[0],
                               seconds=time.monotonic() - started)
                    rows.append(row)
                    print(f"{case['name']} {strategy} seed {seed}: {row['error']}", flush=True)
                    continue
                h = res.history
                counts = {s: sum(c.status == s for c in h) for s in
                          ("ok", "wrong", "compile_error", "timeout", "crash", "pruned")}
                row.update(seconds=res.seconds, proposed=len(h),
                           evaluated=res.counts()["evaluated"], counts=counts,
                           best_s=res.time, best_options=str(res.options),
                           checked=res.checked, measured_on=res.measured_on,
                           ratio=res.time / manual if manual else None)
                rows.append(row)
                for c in h:
                    if c.status in ("crash", "timeout", "wrong"):
                        failures.append({"kernel": case["name"], "strategy": strategy,
                                         "seed": seed, "status": c.status,
                                         "options": c.options, "detail": c.detail})
                # after each run: a kill keeps what was found
                save(rows, failures, host, where, date, a.budget, command, a.out)
                print(f"{case['name']} {strategy} seed {seed}: best {us(res.time)} us, manual "
                      f"{us(manual)}, naive {us(naive)}, {row['evaluated']}/{len(h)} in "
                      f"{res.seconds:.0f} s, {counts}", flush=True)

    md = save(rows, failures, host, where, date, a.budget, command, a.out)
    print("\n" + md)
    return 0


EFFORT_KERNELS = ("tmm-medium", "tbmm", "gconv-14", "MLP3")  # the paper's, at its sizes


def efforts(a, argv) -> int:
    """Each kernel at each effort level: wall time, result, how checked, against manual."""
    from tcstage.tune.tuner import EFFORTS, detect_gpu
    levels = [e.strip() for e in a.efforts.split(",") if e.strip()]
    unknown = set(levels) - set(EFFORTS)
    if unknown:
        raise SystemExit(f"unknown efforts: {', '.join(sorted(unknown))}")
    wanted = [k.strip() for k in a.kernels.split(",") if k.strip()] or list(EFFORT_KERNELS)
    by_name = {c["name"]: c for c in cases()}
    measure = a.measure or ("gpu" if detect_gpu() else "model")
    where = "GPU " + detect_gpu() if measure == "gpu" else "model (no GPU), cost model H100"
    host, date = machine(), datetime.date.today().isoformat()
    command = "python3 benchmarks/tune_bench.py " + " ".join(sys.argv[1:] if argv is None
                                                              else argv)
    stem = a.out or f"tune-efforts-{_slug(host)}-{date}"
    print(f"# tune_bench efforts: {host}; {where}; {date}", flush=True)
    rows = []
    for name in wanted:
        case = by_name[name]
        fn = program(case["file"])[case["function"]]
        args = [s for _, s, _ in shapes(fn, case["sizes"])]
        # the best of the manual lines for this function at these sizes (tmm-medium has two)
        manual = min(filter(None, (predicted(fn, args, c["options"]) for c in by_name.values()
                                   if (c["file"], c["function"], c["sizes"]) ==
                                   (case["file"], case["function"], case["sizes"]))),
                     default=None)
        for level in levels:
            started = time.monotonic()
            row = {"kernel": name, "effort": level, "manual_s": manual}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", tc.TCWarning)
                    warnings.simplefilter("ignore", FutureWarning)
                    res = tc.autotune(program(case["file"]), case["function"], *args,
                                      measure=measure, effort=level, cache=False,
                                      progress=False, jobs=a.jobs, manual_seeds=False)
            except tc.TCError as e:
                row.update(error=str(e).splitlines()[0], wall_s=time.monotonic() - started)
            else:
                row.update(wall_s=time.monotonic() - started, counts=res.counts(),
                           best_s=res.time, best_options=str(res.options),
                           checked=res.checked, how_checked=res.how_checked,
                           stopped=res.stopped,
                           ratio=res.time / manual if manual else None)
            rows.append(row)
            _save_efforts(rows, host, where, date, command, stem)
            print(f"{name} {level}: " + (row.get("error") or
                  f"best {us(row['best_s'])} us ({row['how_checked']}), manual {us(manual)}, "
                  f"{row['counts']['evaluated']} evaluated in {row['wall_s']:.0f} s"), flush=True)
    print("\n" + _save_efforts(rows, host, where, date, command, stem))
    return 0


def _save_efforts(rows, host, where, date, command, stem) -> str:
    lines = [f"# Autotuner effort levels on the paper's kernels ({date})", "",
             f"Machine: {host}; {where}.", f"Command: `{command}`", "",
             "One run per kernel and effort (TPE, seed 0), not seeded with the manual "
             "schedules. Times in us per call, predicted by the cost model unless measured on "
             "a GPU; wall = the whole autotune call; evaluated = candidates compiled; manual = "
             "the best schedules/paper-manual.txt line for the kernel at its sizes, from the "
             "same model.", "",
             "| kernel | effort | wall s | evaluated | best | manual | best / manual | "
             "checked | stopped |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['kernel']} | {r['effort']} | {r['wall_s']:.0f} | - | error: "
                         f"{r['error']} | {us(r['manual_s'])} | - | - | - |")
            continue
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        lines.append(f"| {r['kernel']} | {r['effort']} | {r['wall_s']:.0f} | "
                     f"{r['counts']['evaluated']} | {us(r['best_s'])} | {us(r['manual_s'])} | "
                     f"{ratio} | {r['how_checked'] if r['checked'] else 'NOT checked: ' + r['how_checked']} | "
                     f"{r['stopped']} |")
    lines += ["", "Best options found:", ""]
    lines += [f"- {r['kernel']} {r['effort']}: `{r['best_options']}`" for r in rows
              if "error" not in r]
    md = "\n".join(lines) + "\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.md").write_text(md)
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"machine": host, "measured": where, "date": date, "command": command, "rows": rows},
        indent=1) + "\n")
    return md


def save(rows, failures, host, where, date, budget, command, out) -> str:
    md = report(rows, failures, host, where, date, budget, command)
    stem = out or f"tune-{_slug(host)}-{date}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.md").write_text(md)
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"machine": host, "measured": where, "date": date, "budget": budget,
         "command": command, "rows": rows, "failures": failures}, indent=1) + "\n")
    return md


def report(rows, failures, host, where, date, budget, command) -> str:
    lines = [f"# Autotuner strategies at equal budgets ({date})", "",
             f"Machine: {host}; {where}. Budget: {budget} evaluated candidates per run.",
             f"Command: `{command}`", "",
             "Times in us per call (predicted by the cost model unless measured on a GPU); "
             "evaluated = candidates not pruned, proposed = all; checked = the best was "
             "checked against the CPU result (kernels too large to emulate are not).", "",
             "| kernel | strategy | seed | tuning s | evaluated / proposed | best | manual | "
             "tuned / manual | naive | checked | failures |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['kernel']} | {r['strategy']} | {r['seed']} | "
                         f"{r['seconds']:.0f} | - | error: {r['error']} | {us(r['manual_s'])} "
                         f"| - | {us(r['naive_s'])} | - | - |")
            continue
        c = r["counts"]
        bad = ", ".join(f"{c[s]} {s}" for s in ("compile_error", "wrong", "crash", "timeout")
                        if c[s]) or "0"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        lines.append(f"| {r['kernel']} | {r['strategy']} | {r['seed']} | {r['seconds']:.0f} | "
                     f"{r['evaluated']} / {r['proposed']} | {us(r['best_s'])} | "
                     f"{us(r['manual_s'])} | {ratio} | {us(r['naive_s'])} | "
                     f"{'yes' if r['checked'] else 'no (unchecked)'} | {bad} |")
    # wins: per kernel and seed, the strategy with the lowest best time
    wins: dict[str, int] = {}
    ties = 0
    groups: dict = {}
    for r in rows:
        if "error" not in r:
            groups.setdefault((r["kernel"], r["seed"]), []).append(r)
    for group in groups.values():
        if len(group) < 2:
            continue
        best = min(r["best_s"] for r in group)
        winners = [r["strategy"] for r in group if r["best_s"] <= best * (1 + 1e-9)]
        if len(winners) > 1:
            ties += 1
        else:
            wins[winners[0]] = wins.get(winners[0], 0) + 1
    lines += ["", "Wins at equal budget (lowest best time per kernel and seed): " +
              (", ".join(f"{s} {n}" for s, n in sorted(wins.items())) or "none") +
              f", ties {ties}", ""]
    lines.append("Best options found:")
    lines.append("")
    for r in rows:
        if "error" not in r:
            lines.append(f"- {r['kernel']} {r['strategy']} seed {r['seed']}: "
                         f"`{r['best_options']}`")
    lines += ["", f"Crashed, hung or wrong candidates (compiler bugs): {len(failures)}"]
    for f in failures:
        lines.append(f"- {f['kernel']} {f['strategy']} seed {f['seed']}: {f['status']}: "
                     f"`{f['options']}`: {f['detail']}")
    return "\n".join(lines) + "\n"


def _slug(text: str) -> str:
    import re
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


if __name__ == "__main__":
    sys.exit(main())
