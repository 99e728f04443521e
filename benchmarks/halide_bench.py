#!/usr/bin/env python3
"""Benchmark (not a test) of the Halide apps in examples/halide/ on this machine's CPU.

    python3 benchmarks/halide_bench.py [--apps blur,harris] [--runs 7] [--no-write]
    python3 benchmarks/halide_bench.py --gpu      # needs a CUDA GPU
    python3 benchmarks/halide_bench.py --overhead # per-call cost against Halide's realize

For each app at its "bench" size, all in one process, times Halide's own execution of the
same pipeline with (a) the app's manual schedule, (b) the Adams2019 and (c) the Mullapudi2016
autoschedulers (estimates from the actual input and output sizes, parallelism = the number
of cores), and tcstage's CPU path for Halide pipelines (`tc.from_halide`): (d) its default
schedule ("tcstage": on a copy of the unscheduled pipeline, tcstage's structured scheduler
where it has reductions, else Mullapudi2016, planned for the call) and (e) "tcstage-root",
its schedule before 2026-11-24 (every intermediate computed at the root, nothing else).
`--variants` picks some (Adams2019 takes minutes on the pyramids). Each app runs in a child
process (`--in-process`: all in this one), so a variant that crashes Halide costs that
variant only and is reported as such. Each time is the median
of several calls after a warm-up call, in ms; ratios are time / manual time of the same run
(below 1: faster than the manual schedule). Every variant's output is checked against the
manual schedule's; a mismatch or an error is reported in the table instead of a time.

--gpu times the manual GPU schedule and the Anderson2021 GPU autoscheduler instead (and
tcstage's CUDA kernel is left for when its CUDA path takes Halide pipelines).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import halide as hl
import numpy as np
from importlib.metadata import version

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.halide import APPS, common, load  # noqa: E402
DATE = datetime.date.today().isoformat()
CPU_VARIANTS = ["manual", "Adams2019", "Mullapudi2016", "Li2018", "tcstage-root", "tcstage"]
GPU_VARIANTS = ["manual-gpu", "Anderson2021"]


def machine() -> tuple[str, int]:
    model = "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = re.search(r"Model name:\s*(.+)", out).group(1).strip()
    except Exception:  # noqa: BLE001 - a description only
        pass
    return model, os.cpu_count() or 1


def machine_slug(model: str, cores: int) -> str:
    words = re.sub(r"\(.*?\)|processor|cpu|\d+-core", " ", model.lower())
    return "-".join(re.findall(r"[a-z0-9]+", words)[:3]) + f"-{cores}-cores"


def load_autoscheduler(name: str) -> None:
    path = Path(hl.__file__).parent / "lib64" / f"libautoschedule_{name.lower()}.so"
    if not path.exists():
        raise RuntimeError(f"the halide wheel has no {name} autoscheduler ({path})")
    hl.load_plugin(str(path))


def set_estimates(app: common.App, args, shapes) -> None:
    """Autoschedulers need the sizes: every input's and output's, from the actual arguments."""
    for p, a in zip(app.params, args):
        if isinstance(p, hl.ImageParam):
            p.set_estimates([(0, n) for n in reversed(a.shape)])
        else:
            p.set_estimate(a)
    for f, shape in zip(app.outputs, shapes):
        f.set_estimates([(0, n) for n in reversed(shape)])


def halide_runner(app: common.App, args, shapes, target, to_host: bool = True):
    """A call realizing the app into the same buffers; without `to_host`, the outputs stay
    where the pipeline left them (on the GPU, synchronised) and the call returns None."""
    pipeline = hl.Pipeline(app.outputs)
    keep = common.bind(app, args)
    arrays, buffers = common.output_buffers(app, shapes)
    pipeline.compile_jit(target)

    def run():
        pipeline.realize(buffers)
        for b in buffers:
            b.device_sync()
            if to_host:
                b.copy_to_host()
        return arrays if to_host else None
    run.keep = keep
    return run


ADAMS_BEAM = {"size": 32}  # Adams2019's default beam; --adams-beam-size changes it


def make_runner(module, variant: str, args, shapes):
    if variant in ("tcstage", "tcstage-root"):
        import tcstage as tc
        if not hasattr(tc, "from_halide"):
            raise NotImplementedError("tcstage has no from_halide yet (hook: tc.from_halide)")
        app = module.build()
        f = tc.from_halide(app.outputs, name=app.name)
        shape = shapes[0] if len(shapes) == 1 else list(shapes)
        schedule = "root" if variant == "tcstage-root" else "auto"
        # Into the same arrays every call, as the Halide runs realize into the same buffers:
        # a fresh array of tens of MB costs milliseconds of page faults, which would be
        # counted against one side only (the per-call cost is --overhead's measure).
        # (aligned as tcstage's own outputs are: it writes an unaligned array through a copy)
        from tcstage.halide.jit import aligned_empty
        arrays = [aligned_empty(shape, common.numpy_type(t)) for o, shape in zip(app.outputs, shapes)
                  for t in o.types()]
        out = arrays[0] if len(arrays) == 1 else arrays

        def run():
            got = f(*args, out=out, schedule=schedule)
            return got if isinstance(got, (list, tuple)) else [got]
        return run
    app = module.build()
    target = hl.get_jit_target_from_environment()
    if variant == "manual":
        module.schedule_cpu(app)
    elif variant == "manual-gpu":
        target = target.with_feature(hl.TargetFeature.CUDA)
        module.schedule_gpu(app)
    else:  # an autoscheduler
        if variant == "Anderson2021":
            target = target.with_feature(hl.TargetFeature.CUDA)
        load_autoscheduler(variant)
        set_estimates(app, args, shapes)
        params = {"parallelism": str(os.cpu_count() or 1)}
        if variant == "Adams2019":
            params["beam_size"] = str(ADAMS_BEAM["size"])
        if variant == "Anderson2021":
            params = {"parallelism": "80"}  # streaming multiprocessors of the GPU, roughly
        hl.Pipeline(app.outputs).apply_autoscheduler(target, hl.AutoschedulerParams(variant, params))
    return halide_runner(app, args, shapes, target)


def time_ms(run, runs: int, budget_s: float = 2.0) -> float:
    run()  # warm-up: first-touch allocation, thread pool start
    times = []
    start = time.perf_counter()
    while len(times) < runs or (time.perf_counter() - start < budget_s and len(times) < 50):
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) * 1e3)
        if len(times) >= runs and time.perf_counter() - start > budget_s:
            break
    return statistics.median(times)


def agree(module, args, got, want) -> bool:
    """Within the app's tolerance, but for the fraction of pixels it allows to differ
    (MISMATCH_FRACTION: local_laplacian's lookup makes single pixels sensitive to rounding)."""
    tol = getattr(module, "tolerance", lambda a: 0)(args)
    allowed = getattr(module, "MISMATCH_FRACTION", 0.0)
    for g, w in zip(got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.shape != w.shape:
            return False
        off = ~np.isclose(g, w, rtol=1e-4, atol=tol)
        if off.mean() > allowed:
            return False
    return True


def bench_app_isolated(name: str, variants: list[str], runs: int) -> dict:
    """bench_app in a child process, so that a variant that kills its process (Halide 21's
    Adams2019 ends resize with an uncaught C++ exception) costs that variant only: the child
    records each variant as it finishes, and a crashed one is run again without it (the first
    variant, the baseline every output is checked against, runs again too)."""
    import tempfile
    todo, row = list(variants), None
    while todo:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            path = Path(tmp.name)
        cmd = [sys.executable, __file__, "--apps", name, "--variants", ",".join(todo),
               "--runs", str(runs), "--adams-beam-size", str(ADAMS_BEAM["size"]),
               "--row-out", str(path), "--no-write"]
        done = subprocess.run(cmd, stdout=sys.stdout, stderr=subprocess.PIPE, text=True)
        part = json.loads(path.read_text()) if path.stat().st_size else None
        path.unlink()
        if row is None:
            row = part or {"app": name, "adams2019_beam_size": ADAMS_BEAM["size"], "ms": {},
                           "compile_s": {}, "errors": {}}
        elif part:
            for key in ("ms", "compile_s", "errors", "unchecked"):
                row.setdefault(key, {}).update(
                    {v: t for v, t in part.get(key, {}).items() if v != variants[0]})
        finished = set(row["ms"]) | set(row["errors"])
        if done.returncode == 0:
            break
        crashed = next((v for v in todo if v not in finished), None)
        if crashed is None:
            break
        why = (done.stderr.strip().splitlines() or ["no message"])[-1][:160]
        row["errors"][crashed] = f"crashed the process (exit {done.returncode}): {why}"
        print(f"  {name:16s} {crashed:14s} {row['errors'][crashed]}", flush=True)
        rest = todo[todo.index(crashed) + 1:]
        todo = [variants[0]] + rest if rest else []
    return row


def bench_app(name: str, variants: list[str], runs: int, row_out: str | None = None) -> dict:
    module = load(name)
    args = module.inputs(np.random.default_rng(0), "bench")
    shapes = module.output_shapes(args)
    row = {"app": name, "adams2019_beam_size": ADAMS_BEAM["size"], "shapes": [list(a.shape) if hasattr(a, "shape") else a for a in args],
           "ms": {}, "compile_s": {}, "errors": {}}
    expected = None
    for variant in variants:
        if row_out:  # (what has finished, for the parent of an isolated run)
            Path(row_out).write_text(json.dumps(row))
        try:
            t = time.perf_counter()
            run = make_runner(module, variant, args, shapes)
            out = [np.array(o, copy=True) for o in run()]
            row["compile_s"][variant] = round(time.perf_counter() - t, 2)
            if expected is None:
                expected = out
            elif hasattr(module, "OUTPUTS_DIFFER_PER_BUILD"):
                row.setdefault("unchecked", {})[variant] = module.OUTPUTS_DIFFER_PER_BUILD
            elif not agree(module, args, out, expected):
                raise AssertionError(f"{variant}'s output differs from {variants[0]}'s")
            row["ms"][variant] = round(time_ms(run, runs), 3)
        except NotImplementedError as e:
            row["errors"][variant] = f"hook: {e}"
        except Exception as e:  # noqa: BLE001 - reported in the table
            row["errors"][variant] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
            traceback.print_exc(limit=2)
        status = row["ms"].get(variant, row["errors"].get(variant))
        print(f"  {name:16s} {variant:14s} {status}", flush=True)
    if row_out:
        Path(row_out).write_text(json.dumps(row))
    return row


def table(rows: list[dict], variants: list[str]) -> str:
    base = variants[0]
    head = "| app | " + " | ".join(f"{v} ms" for v in variants) + " | " + " | ".join(
        f"{v} / {base}" for v in variants[1:]) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(variants) - 1)]
    for r in rows:
        cells = [r["ms"].get(v) for v in variants]
        times = [f"{c:.2f}" if c is not None else "—" for c in cells]
        ratios = [f"{c / cells[0]:.2f}" if c is not None and cells[0] else "—" for c in cells[1:]]
        lines.append(f"| {r['app']} | " + " | ".join(times) + " | " + " | ".join(ratios) + " |")
    notes = [f"- {r['app']} / {v}: {e}" for r in rows for v, e in r["errors"].items()]
    unchecked = sorted({f"- {r['app']}: {why}" for r in rows
                        for why in r.get("unchecked", {}).values()})
    return "\n".join(lines) + ("\n\nNot timed:\n" + "\n".join(notes) if notes else "") + (
        "\n\nTimed, outputs not compared with the first column's:\n" + "\n".join(unchecked)
        if unchecked else "")


def call_overhead(name: str, budget_s: float = 1.0) -> dict:
    """Per-call cost of tcstage's CPU path against Halide's own realize of the same pipeline,
    both scheduled by the app's manual schedule (tcstage runs it as written), at the app's
    small size where the per-call work shows: microseconds per call, the fastest of calls
    alternating between the two within the budget. Halide's side allocates its outputs as
    numpy arrays each call too, as a caller wanting arrays does."""
    import tcstage as tc
    module = load(name)
    args = module.inputs(np.random.default_rng(0), "small")
    shapes = module.output_shapes(args)
    app = module.build()
    module.schedule_cpu(app)
    f = tc.from_halide(app.outputs, name=app.name)
    shape = shapes[0] if len(shapes) == 1 else list(shapes)
    theirs = module.build()
    module.schedule_cpu(theirs)
    keep = common.bind(theirs, args)
    pipeline = hl.Pipeline(theirs.outputs)
    pipeline.compile_jit(hl.get_jit_target_from_environment())

    def realize():
        arrays, buffers = common.output_buffers(theirs, shapes)
        pipeline.realize(buffers)
        return arrays

    first = f(*args, output_shape=shape)
    assert hasattr(module, "OUTPUTS_DIFFER_PER_BUILD") or agree(
        module, args, [np.asarray(o) for o in (first if isinstance(first, tuple) else [first])],
        realize())

    # The two alternate, and each side's fastest call counts: on a long call the noise of a
    # shared machine is larger than the difference sought, and it only ever adds time.
    runs = {"ours": (lambda: f(*args, output_shape=shape)), "halide": realize}
    times = {side: [] for side in runs}
    start = time.perf_counter()
    while time.perf_counter() - start < budget_s or len(times["ours"]) < 20:
        for side, run in runs.items():
            t = time.perf_counter()
            run()
            times[side].append((time.perf_counter() - t) * 1e6)
    ours, halide = min(times["ours"]), min(times["halide"])
    del keep
    return {"app": name, "tcstage_us": round(ours, 1), "realize_us": round(halide, 1),
            "overhead_us": round(ours - halide, 1),
            "shapes": [list(a.shape) for a in args if hasattr(a, "shape")]}


def overhead_table(rows: list[dict]) -> str:
    lines = ["| app | input shapes | tcstage call us | Halide realize us | difference us |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['app']} | {' '.join('x'.join(map(str, s)) for s in r['shapes'])} | "
                     f"{r['tcstage_us']:.1f} | {r['realize_us']:.1f} | {r['overhead_us']:.1f} |")
    return "\n".join(lines)


def gpu_available() -> bool:
    target = hl.get_host_target().with_feature(hl.TargetFeature.CUDA)
    try:
        return bool(hl.host_supports_target_device(target))
    except Exception:  # noqa: BLE001
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--apps", default=",".join(APPS))
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--gpu", action="store_true", help="manual GPU schedules vs Anderson2021 (CUDA)")
    ap.add_argument("--adams-beam-size", type=int, default=32,
                    help="Adams2019's beam (1: greedy; the default 32 takes many minutes on the pyramids here)")
    ap.add_argument("--variants", help=f"comma-separated, the first the baseline of the ratios "
                                        f"(default: {','.join(CPU_VARIANTS)})")
    ap.add_argument("--row-out", help=argparse.SUPPRESS)  # (a child of an isolated run)
    ap.add_argument("--in-process", action="store_true",
                    help="run every app in this process (a crashing variant ends the run)")
    ap.add_argument("--overhead", action="store_true",
                    help="per-call cost of tcstage against Halide's realize, same schedule")
    ap.add_argument("--no-write", action="store_true", help="print only, write no results file")
    opts = ap.parse_args(argv)
    apps = [a for a in opts.apps.split(",") if a]
    unknown = sorted(set(apps) - set(APPS))
    if unknown:
        ap.error(f"unknown apps {unknown}; known: {', '.join(APPS)}")
    if opts.overhead:
        return overhead_main(apps, opts.no_write)
    if opts.gpu and not gpu_available():
        print("halide_bench --gpu: no CUDA GPU here (Halide's host_supports_target_device says no "
              "for a CUDA target); run it on a machine with an NVIDIA GPU and its driver.",
              file=sys.stderr)
        return 2
    variants = GPU_VARIANTS if opts.gpu else CPU_VARIANTS
    if opts.variants:
        variants = [v for v in opts.variants.split(",") if v]
        if not set(variants) <= set(GPU_VARIANTS if opts.gpu else CPU_VARIANTS):
            known = GPU_VARIANTS if opts.gpu else CPU_VARIANTS
            ap.error(f"unknown variants in {variants}; known: {', '.join(known)}")
    ADAMS_BEAM["size"] = opts.adams_beam_size
    model, cores = machine()
    print(f"{model}, {cores} cores; Halide {version('halide')}; "
          f"target {hl.get_jit_target_from_environment()}", flush=True)
    rows = []
    for name in apps:
        if opts.row_out:
            bench_app(name, variants, opts.runs, opts.row_out)
            return 0
        isolated = not (opts.in_process or opts.gpu)
        rows.append(bench_app_isolated(name, variants, opts.runs) if isolated
                    else bench_app(name, variants, opts.runs))
    print(table(rows, variants))
    if not opts.no_write:
        kind = "gpu" if opts.gpu else "cpu"
        stem = ROOT / "benchmarks" / "results" / f"halide-{kind}-{machine_slug(model, cores)}-{DATE}"
        # A run of some apps replaces their rows in an earlier run's results, keeps the others.
        if stem.with_suffix(".json").exists() and \
                json.loads(stem.with_suffix(".json").read_text())["variants"] == variants:
            earlier = json.loads(stem.with_suffix(".json").read_text())["rows"]
            ran = {r["app"] for r in rows}
            rows = sorted([r for r in earlier if r["app"] not in ran] + rows, key=lambda r: APPS.index(r["app"]))
        text = table(rows, variants)
        beams = sorted({r.get("adams2019_beam_size", 32) for r in rows})
        beam_note = "; ".join(
            f"{b} for " + ", ".join(r["app"] for r in rows if r.get("adams2019_beam_size", 32) == b)
            for b in beams)
        header = (f"# Halide apps, {kind.upper()}: manual schedules, autoschedulers, tcstage\n\n"
                  f"Machine: {model}, {cores} cores (`lscpu`), shared with other work.  "
                  f"Halide {version('halide')}, target `{hl.get_jit_target_from_environment()}`.  Date {DATE} "
                  f"({datetime.date.today()} by the clock).\n"
                  f"Command: `python3 benchmarks/halide_bench.py{' --gpu' if opts.gpu else ''} --runs {opts.runs}"
                  f"{' --apps ' + opts.apps if opts.apps != ','.join(APPS) else ''}"
                  f"{' --variants ' + opts.variants if opts.variants else ''}` (the last run).\n"
                  "Each time: the median of at least that many calls after a warm-up, in ms per call; "
                  f"ratios: time / {variants[0]} time, same run (below 1 is faster).  Sizes: the apps' "
                  "`inputs(rng, 'bench')`.  Every output checked against the manual schedule's.  "
                  "Every variant writes into the same preallocated outputs each call (tcstage's "
                  "through `out=`).  "
                  f"Adams2019 beam size: {beam_note}.\n\n")
        stem.with_suffix(".md").write_text(header + text + "\n")
        stem.with_suffix(".json").write_text(json.dumps(
            {"machine": model, "cores": cores, "date": DATE, "variants": variants, "rows": rows}, indent=1) + "\n")
        print(f"wrote {stem}.md and .json")
    return 0


def overhead_main(apps: list[str], no_write: bool) -> int:
    import warnings
    model, cores = machine()
    print(f"{model}, {cores} cores; Halide {version('halide')}", flush=True)
    rows = []
    for name in apps:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (Halide's notes on the manual schedules)
            rows.append(call_overhead(name))
        print(f"  {name:28s} {rows[-1]['overhead_us']:8.1f} us", flush=True)
    text = overhead_table(rows)
    print(text)
    if not no_write:
        path = ROOT / "benchmarks" / "results" / \
            f"halide-call-overhead-{machine_slug(model, cores)}-{DATE}.md"
        path.write_text(
            "# Per-call cost of tcstage's CPU path against Halide's realize\n\n"
            f"Machine: {model}, {cores} cores (`lscpu`).  Halide {version('halide')}.  Date {DATE}."
            "\nCommand: `python3 benchmarks/halide_bench.py --overhead"
            f"{' --apps ' + ','.join(apps) if apps != APPS else ''}`.\n"
            "Both run the app's manual schedule at its small size; each figure is the fastest "
            "of calls alternating between the two, in microseconds (on a call of milliseconds "
            "the machine's noise still shows in the difference); Halide's side allocates its "
            "numpy outputs each call, as tcstage does.\n\n" + text + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
