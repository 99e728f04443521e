"""Long fuzz and differential campaigns against tcstage (the generators live in tests/fuzz/).

    python3 benchmarks/fuzz_campaign.py frontend --inputs 100000 --timeout 5
    python3 benchmarks/fuzz_campaign.py differential --programs 1000 --options 3 --timeout 300
    python3 benchmarks/fuzz_campaign.py gradient --programs 1000 --timeout 120
    python3 benchmarks/fuzz_campaign.py narrow --programs 300 --options 3 --timeout 120
    python3 benchmarks/fuzz_campaign.py minimize --first SEED [--kind race] [--budget 600]

`frontend`: `tc.define` on random text, token soup in TC's shape, syntactically valid TC with
random meaning and mutants of the examples and of generated programs; every result other than
success or a `TCError`, and every input slower than --timeout seconds, is counted.

`differential`: random well-formed programs (seeds --first .. --first + --programs) on the CPU
(default schedule and schedule=None) and under emulation with --options random MappingOptions
each, against the explicit-loop reference; mismatches, crashes, rejections of valid programs,
races and hangs (a program slower than --timeout) are counted. A kernel of several launches is
compiled once more with one option set per launch (tc.compile's list form; the summary counts
these "per-launch option lists"), here and in `halide`.

`gradient`: random well-formed programs retyped to float64 through `tc.gradient`, the backward
TC's gradients compared with central differences of the forward (tests/fuzz/gradient.py);
counts documented refusals by reason, inputs skipped at non-smooth points, and bugs: invalid
backward TCs, crashes, errors running the backward, mismatches, missing gradients. With
--minimize, each bug's program is shrunk (--budget seconds) before its reproducer is written.

`narrow`: small half and bfloat16 contractions and reductions (tmm, tbmm, matmul with a bias,
sums, softmax, ...; tests/fuzz/narrow.py) at awkward sizes, on the CPU once and emulated with
--options random MappingOptions each, mostly with tensor cores on, against float64 numpy within
a derived error bound; the summary also counts kernels on tensor cores and split reductions.

`halide`: random Halide pipelines (tests/fuzz/halide_pipelines.py) through `tc.from_halide`:
every CPU schedule at two calls' sizes on one function, and --options random MappingOptions
emulated, against Halide's own realize of a fresh copy; the caller's Funcs must stay
unscheduled.

    python3 benchmarks/fuzz_campaign.py halide --programs 300 --options 2 --timeout 120

`minimize`: shrinks the program of seed --first (with its --options random options) to a
smaller one that fails the same way, and writes its reproducer to --out.

Each input runs in a worker process that is killed and replaced on a hang or a crash of the
interpreter (a hang: more than --timeout CPU seconds, so that a loaded machine does not make
hangs). Ctrl-C or `kill` ends a campaign early with the summary of what ran. The summary
groups findings into classes (kind, stage, error, message shape) and writes a reproducer for
the first few of each class to --out.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))


# -- the worker ------------------------------------------------------------------------------

def _frontend_task(kind: str, seed: int) -> dict | None:
    import warnings

    import tcstage as tc
    from fuzz import frontend

    text = frontend.input_for(kind, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tc.define(text)
        except tc.TCError:
            return None
        except BaseException as e:  # noqa: BLE001 - that is the finding
            import traceback
            tb = traceback.extract_tb(e.__traceback__)
            where = next((f"{f.filename.split('/tcstage/')[-1]}:{f.lineno} in {f.name}"
                          for f in reversed(tb) if "/tcstage/" in f.filename), "")
            return {"kind": "crash", "stage": "define", "error": type(e).__name__,
                    "detail": f"{str(e)[:300]} [{where}]", "options": None}
    return None


def _features(scatter: bool):
    from fuzz import programs

    return programs.SCATTER_FEATURES if scatter else programs.ALL_FEATURES


def _differential_task(seed: int, n_options: int, nvcc: bool, scatter: bool,
                       send) -> list[dict]:
    import random

    import attrs

    from fuzz import differential, mapping, programs

    case = programs.case(seed, _features(scatter))
    rng = random.Random(f"options/{seed}")
    options = [mapping.random_options(rng) for _ in range(n_options)]
    stats = collections.Counter()
    findings = differential.check(case, options, nvcc=nvcc, progress=_progress_to(send, stats))
    return [attrs.asdict(f) for f in findings] + [{"kind": "stats", **stats}]


def _gradient_task(seed: int) -> list[dict]:
    import attrs

    from fuzz import gradient, programs

    outcome = gradient.check(programs.case(seed, gradient.FEATURES))
    return [attrs.asdict(outcome)]


def _narrow_task(seed: int, n_options: int) -> list[dict]:
    import collections

    import attrs

    from fuzz import narrow

    stats = collections.Counter()
    c = narrow.case(seed, n_options)
    findings = [attrs.asdict(f) for f in narrow.check(c, stats=stats)]
    return findings + [{"kind": "stats", **stats}]


def _halide_task(seed: int, n_options: int, send) -> list[dict]:
    import random

    import attrs

    from fuzz import halide_pipelines, mapping

    case = halide_pipelines.case(seed)
    rng = random.Random(f"options/{seed}")
    options = [mapping.random_options(rng) for _ in range(n_options)]
    stats = collections.Counter()
    findings = halide_pipelines.check(case, options, progress=_progress_to(send, stats))
    return [attrs.asdict(f) for f in findings] + [{"kind": "stats", **stats}]


def _progress_to(send, stats):
    """A check's progress callback: each stage goes to the parent (which names the stage a
    hang was in), and the kernel sequences compiled with one option set per launch (tc.compile's
    list form, tests/fuzz/mapping.py's per_launch) are counted."""
    def progress(stage, options):
        send(("stage", stage, str(options)))
        if stage == "compile" and isinstance(options, list):
            stats["per-launch option lists"] += 1
    return progress


def _worker(conn, mode: str, config: dict) -> None:
    os.environ.setdefault("PYTHONHASHSEED", "0")
    while True:
        task = conn.recv()
        if task is None:
            return
        conn.send(("start",))
        try:
            if mode == "frontend":
                result = _frontend_task(*task)
                result = [result] if result else []
            elif mode == "gradient":
                result = _gradient_task(task)
            elif mode == "narrow":
                result = _narrow_task(task, config["options"])
            elif mode == "halide":
                result = _halide_task(task, config["options"], conn.send)
            else:
                result = _differential_task(task, config["options"], config["nvcc"],
                                            config.get("scatter", False), conn.send)
        except Exception as e:  # noqa: BLE001 - a failure of the harness itself
            result = [{"kind": "harness", "stage": "generate", "error": type(e).__name__,
                       "detail": str(e)[:300], "options": None}]
        conn.send(("done", result))


class Pool:
    """One worker process, replaced when it hangs or dies."""

    def __init__(self, mode: str, config: dict):
        self.mode, self.config = mode, config
        self.ctx = multiprocessing.get_context("spawn")
        self.proc = None
        self.start()

    def start(self) -> None:
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child, self.mode, self.config),
                                     daemon=True)
        self.proc.start()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.start()

    def cpu_seconds(self) -> float:
        """CPU time of the worker and its finished children (g++, nvcc); wall time where
        /proc is missing. Hangs are judged on it, so a loaded machine does not make them."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return time.monotonic()

    def run(self, task, timeout: float) -> tuple[str, list, str]:
        """('done', findings, last stage) or ('hang'|'died', [], last stage). A task hangs when
        it has used `timeout` CPU seconds, or five times that in wall time."""
        self.conn.send(task)
        cpu_start, wall_end = self.cpu_seconds(), time.monotonic() + 5 * timeout
        stage = "start"
        while True:
            try:
                ready = self.conn.poll(1.0)
            except (EOFError, OSError):
                ready = False
            if not ready:
                if not self.proc.is_alive():
                    code = self.proc.exitcode
                    self.kill()
                    return "died", [], f"{stage} (exit code {code})"
                if self.cpu_seconds() - cpu_start > timeout or time.monotonic() > wall_end:
                    self.kill()
                    return "hang", [], stage
                continue
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                code = (self.proc.join(5), self.proc.exitcode)[1]
                self.kill()
                return "died", [], f"{stage} (exit code {code})"
            if message[0] == "stage":
                stage = f"{message[1]}" + (f" under {message[2]}" if message[2] != "None" else "")
            elif message[0] == "done":
                return "done", message[1], stage

    def close(self) -> None:
        try:
            self.conn.send(None)
            self.proc.join(10)
        finally:
            if self.proc.is_alive():
                self.proc.kill()


# -- campaigns ---------------------------------------------------------------------------------

def _signature(f: dict) -> str:
    sys.path.insert(0, str(TESTS))
    from fuzz.differential import Finding
    return Finding(f.get("seed", -1), f["kind"], f["stage"], f["options"], f["error"],
                   f["detail"]).signature


def frontend(args) -> dict:
    from fuzz import frontend as F

    pool = Pool("frontend", {})
    kinds = list(F.GENERATORS)
    counts = collections.Counter()
    classes: dict = collections.defaultdict(list)
    slowest = (0.0, None)
    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    interrupted = False
    try:
        for n in range(args.first, args.first + args.inputs):
            kind = kinds[n % len(kinds)]
            seed = n // len(kinds)
            t0 = time.monotonic()
            status, findings, stage = pool.run((kind, seed), args.timeout)
            took = time.monotonic() - t0
            slowest = max(slowest, (took, f"{kind}/{seed}"), key=lambda x: x[0])
            counts["inputs"] += 1
            counts[f"inputs:{kind}"] += 1
            if status != "done":
                findings = [{"kind": "hang" if status == "hang" else "crash",
                             "stage": "define", "error": status, "detail": stage,
                             "options": None}]
            for f in findings:
                f["input"] = f"{kind}/{seed}"
                counts[f["kind"]] += 1
                sig = _signature(f)
                classes[sig].append(f)
                if len(classes[sig]) <= 3:
                    try:
                        text = f"tc.define({F.input_for(kind, seed)!r})"
                    except Exception as e:  # noqa: BLE001 - the generator's own failure
                        text = f"# (no input: {e!r})"
                    (out / f"frontend-{kind}-{seed}.py").write_text(
                        f"# {sig}\nimport tcstage as tc\n{text}\n")
            if args.progress and counts["inputs"] % args.progress == 0:
                print(f"  {counts['inputs']} inputs, {counts['crash']} crashes, "
                      f"{counts['hang']} hangs, {time.monotonic() - start:.0f} s", flush=True)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        pool.close()
    return {"counts": dict(counts), "classes": {k: [f["input"] for f in v]
                                                 for k, v in classes.items()},
            "slowest": slowest, "seconds": time.monotonic() - start,
            "interrupted": interrupted}


def differential(args) -> dict:
    pool = Pool("differential", {"options": args.options, "nvcc": args.nvcc,
                                 "scatter": args.scatter})

    def reproduce(out, seed, f, sig):
        _write_reproducer(out, seed, f, sig, args.scatter)
    return _seed_campaign(args, pool, reproduce)


def narrow(args) -> dict:
    """The narrow-type campaign (tests/fuzz/narrow.py)."""
    from fuzz import narrow as Nw

    def reproduce(out, seed, f, sig):
        try:
            text = Nw.reproducer(Nw.case(seed, args.options), Nw.Finding(
                seed, f["kind"], f["stage"], f["options"], f["error"], f["detail"]))
        except Exception as e:  # noqa: BLE001
            text = f"# (no reproducer: {e})\n"
        (out / f"narrow-{f['kind']}-{f['stage']}-seed{seed}.py").write_text(
            f"# {sig}\n# options: {f['options']}\n# {f['detail']}\n" + text)

    def progress(counts):
        print(f"    kernels {counts['kernels']}, on tensor cores {counts['on tensor cores']}, "
              f"split reductions {counts['split reductions']}", flush=True)
    return _seed_campaign(args, Pool("narrow", {"options": args.options}), reproduce, progress)


def halide(args) -> dict:
    """The Halide pipeline campaign (tests/fuzz/halide_pipelines.py)."""
    from fuzz import differential as D
    from fuzz import halide_pipelines as H

    def reproduce(out, seed, f, sig):
        try:
            text = H.reproducer(H.case(seed), D.Finding(
                seed, f["kind"], f["stage"], f["options"], f["error"], f["detail"]))
        except Exception as e:  # noqa: BLE001
            text = f"# (no reproducer: {e})\n"
        stage_name = f["stage"].split(" ")[0]
        (out / f"halide-{f['kind']}-{stage_name}-seed{seed}.py").write_text(f"# {sig}\n" + text)
    return _seed_campaign(args, Pool("halide", {"options": args.options}), reproduce)


def _seed_campaign(args, pool, reproduce, progress=None) -> dict:
    """A campaign over the programs of seeds --first .. --first + --programs (differential,
    narrow, halide): findings counted and grouped into classes, the first three of each class
    written to --out by reproduce(out, seed, finding, signature); a worker's "stats" findings
    only add to the counts, and progress(counts) adds to the progress line."""
    counts = collections.Counter()
    classes: dict = collections.defaultdict(list)
    failing_seeds = set()
    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def visit(seed, status, findings, stage):
        counts["programs"] += 1
        counts["option sets"] += args.options
        if status != "done":
            findings = [{"kind": "hang" if status == "hang" else "crash", "stage": stage,
                         "error": status, "detail": f"no answer within {args.timeout} s"
                         if status == "hang" else "the worker died", "options": None}]
        for f in findings:
            if f["kind"] == "stats":
                counts.update({k: v for k, v in f.items() if k != "kind"})
                continue
            f["seed"] = seed
            counts[f["kind"]] += 1
            failing_seeds.add(seed)
            sig = _signature(f)
            classes[sig].append(f)
            if len(classes[sig]) <= 3:
                reproduce(out, seed, f, sig)
        if args.progress and counts["programs"] % args.progress == 0:
            _progress(counts, start)
            if progress is not None:
                progress(counts)

    interrupted = _over_programs(args, pool, visit)
    return {"counts": dict(counts), "failing programs": len(failing_seeds),
            "classes": {k: sorted({f["seed"] for f in v}) for k, v in classes.items()},
            "seconds": time.monotonic() - start, "interrupted": interrupted}


def _over_programs(args, pool, visit) -> bool:
    """Runs each program of the campaign in the pool and hands its answer to
    visit(seed, status, results, stage); whether Ctrl-C ended it early (what came in is kept)."""
    try:
        for seed in range(args.first, args.first + args.programs):
            visit(seed, *pool.run(seed, args.timeout))
    except KeyboardInterrupt:
        return True
    finally:
        pool.close()
    return False


def gradient(args) -> dict:
    """The gradient campaign: one outcome per program (tests/fuzz/gradient.py)."""
    from fuzz import gradient as G

    pool = Pool("gradient", {})
    counts = collections.Counter()
    refusals = collections.Counter()
    classes: dict = collections.defaultdict(list)
    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def visit(seed, status, results, stage):
        counts["programs"] += 1
        if status != "done":
            results = [{"seed": seed, "kind": "hang" if status == "hang" else "crash",
                        "reason": status, "detail": stage, "checked": 0, "skipped": 0}]
        for r in results:
            kind = r["kind"]
            counts[kind] += 1
            counts["inputs checked"] += r.get("checked", 0)
            counts["inputs skipped (non-smooth)"] += r.get("skipped", 0)
            if kind == "refused":
                refusals[r["reason"]] += 1
            elif kind in (*G.BUG_KINDS, "hang", "harness", "forward"):
                sig = f"{kind}: {r['reason']}"
                classes[sig].append(seed)
                if kind != "forward" and len(classes[sig]) <= 3:
                    _write_gradient_reproducer(out, seed, r, sig, args)
        if args.progress and counts["programs"] % args.progress == 0:
            print(f"  {counts['programs']} programs: {counts['ok']} ok, "
                  f"{counts['refused']} refused, "
                  f"{sum(counts[k] for k in G.BUG_KINDS)} bugs, "
                  f"{time.monotonic() - start:.0f} s", flush=True)

    interrupted = _over_programs(args, pool, visit)
    return {"counts": dict(counts), "refusals": dict(refusals.most_common()),
            "classes": dict(classes), "seconds": time.monotonic() - start,
            "interrupted": interrupted}


def _write_gradient_reproducer(out: Path, seed: int, r: dict, sig: str, args) -> None:
    from fuzz import gradient as G
    from fuzz import programs

    case = programs.case(seed, G.FEATURES)
    note = ""
    if args.minimize and r["kind"] in G.BUG_KINDS:
        from fuzz.minimize import minimize as shrink
        outcome = G.Outcome(seed, r["kind"], r["reason"], r["detail"])
        case = shrink(case, G.fails_like(outcome), args.budget)
        r = attrs_dict(G.check(case, seed))
        note = " (minimized)"
    (out / f"gradient-{r['kind']}-seed{seed}.txt").write_text(
        f"# {sig}{note}\n# regenerate: programs.case({seed}, gradient.FEATURES) in tests/fuzz\n"
        f"{case.source}\n{r['detail']}\n")


def attrs_dict(outcome) -> dict:
    import attrs
    return attrs.asdict(outcome)


def _progress(counts, start) -> None:
    print(f"  {counts['programs']} programs: {counts['mismatch']} mismatches, "
          f"{counts['crash']} crashes, {counts['rejected']} rejections, {counts['race']} races, "
          f"{counts['hang']} hangs, {time.monotonic() - start:.0f} s", flush=True)


def _write_reproducer(out: Path, seed: int, f: dict, sig: str, scatter: bool = False) -> None:
    from fuzz import differential, programs

    stage, _, options = f["stage"].partition(" under ")  # hangs: the stage it was in
    name = f"{f['kind']}-{stage}-seed{seed}.py"
    try:
        case = programs.case(seed, _features(scatter))
        finding = differential.Finding(seed, f["kind"], stage, f["options"] or options or None,
                                       f["error"], f["detail"])
        text = f"# {sig}\n" + differential.reproducer(case, finding)
    except Exception as e:  # noqa: BLE001
        text = f"# {sig}\n# (no reproducer: {e})\n"
    (out / name).write_text(text)


def minimize(args) -> int:
    """Shrinks the program of --first to a smaller one with the same kind of failure."""
    import random

    from fuzz import differential, mapping, programs
    from fuzz.minimize import minimize as shrink

    seed = args.first
    case = programs.case(seed, _features(args.scatter))
    rng = random.Random(f"options/{seed}")
    options = [mapping.random_options(rng) for _ in range(args.options)]
    findings = [f for f in differential.check(case, options)
                if not args.kind or f.kind == args.kind]
    if not findings:
        print(f"seed {seed}: no finding to minimize")
        return 0
    target = findings[0]
    print(f"minimizing seed {seed}: {target}\n{case.source}", flush=True)
    small = shrink(case, differential.fails_like(target), args.budget,
                   log=lambda text: print("  " + text, flush=True))
    final = next(f for f in differential.check(
        small, [o for o in options if str(o) == target.options],
        cpu_schedules=differential.CPU_SCHEDULES if target.stage.startswith("cpu") else ())
        if f.kind == target.kind and f.stage == target.stage)
    print(f"\nminimized:\n{small.source}\n{final}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"min-{target.kind}-{target.stage}-seed{seed}.py"
    path.write_text(differential.reproducer(small, final))
    print(f"reproducer: {path}")
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("frontend", "differential", "gradient", "narrow",
                                         "halide", "minimize"))
    parser.add_argument("--inputs", type=int, default=100_000, help="front-end inputs")
    parser.add_argument("--programs", type=int, default=1000, help="differential programs")
    parser.add_argument("--options", type=int, default=3, help="MappingOptions per program")
    parser.add_argument("--first", type=int, default=0, help="first seed")
    parser.add_argument("--timeout", type=float, default=None,
                        help="CPU seconds per input (frontend: 5) or program (differential: "
                        "300) before it counts as a hang")
    parser.add_argument("--nvcc", action="store_true", help="also compile each kernel with nvcc")
    parser.add_argument("--scatter", action="store_true",
                        help="differential, minimize: programs with scatter statements")
    parser.add_argument("--out", default="fuzz-findings", help="directory for reproducers")
    parser.add_argument("--json", help="write the summary here too")
    parser.add_argument("--progress", type=int, default=0, help="print a line every N inputs")
    parser.add_argument("--kind", help="minimize: the kind of finding to keep (mismatch, ...)")
    parser.add_argument("--budget", type=float, default=600, help="minimize: seconds")
    parser.add_argument("--minimize", action="store_true",
                        help="gradient: shrink each bug's program before writing it")
    args = parser.parse_args(argv)
    # Ctrl-C or a plain `kill` stops the campaign early; it still ends its worker and prints
    # the summary of what ran.
    signal.signal(signal.SIGTERM, _interrupt)
    if args.mode == "minimize":
        return minimize(args)
    if args.timeout is None:
        args.timeout = {"frontend": 5.0, "gradient": 120.0, "narrow": 120.0,
                        "halide": 120.0}.get(args.mode, 300.0)
    if args.mode == "gradient":
        summary = gradient(args)
        _print_gradient_summary(summary)
    else:
        summary = {"frontend": frontend, "narrow": narrow, "halide": halide}.get(
            args.mode, differential)(args)
        _print_summary(args.mode, summary)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1, default=str))
    bad = sum(summary["counts"].get(k, 0) for k in
              ("mismatch", "crash", "hang", "rejected", "race", "invalid", "backward-error",
               "missing"))
    return 1 if bad else 0


def _print_gradient_summary(summary: dict) -> None:
    c = summary["counts"]
    stopped = " (interrupted)" if summary.get("interrupted") else ""
    print(f"\n== gradient campaign: {summary['seconds']:.0f} s{stopped} ==")
    print(f"programs: {c.get('programs', 0)}; checked: {c.get('ok', 0)} "
          f"({c.get('inputs checked', 0)} inputs, "
          f"{c.get('inputs skipped (non-smooth)', 0)} skipped at non-smooth points); "
          f"refused: {c.get('refused', 0)}; forward failed: {c.get('forward', 0)}")
    print("bugs: " + ", ".join(f"{k} {c.get(k, 0)}" for k in
                               ("invalid", "crash", "backward-error", "mismatch", "missing",
                                "hang")))
    print("refusals by reason:")
    for reason, n in summary["refusals"].items():
        print(f"  {n:5d}  {reason}")
    print(f"{len(summary['classes'])} classes:")
    for sig, where in sorted(summary["classes"].items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(where):5d}  {sig}\n         e.g. {', '.join(map(str, where[:6]))}")


def _print_summary(mode: str, summary: dict) -> None:
    c = summary["counts"]
    stopped = " (interrupted)" if summary.get("interrupted") else ""
    print(f"\n== {mode} campaign: {summary['seconds']:.0f} s{stopped} ==")
    if mode == "frontend":
        print(f"inputs: {c.get('inputs', 0)} ("
              + ", ".join(f"{k.split(':')[1]} {v}" for k, v in sorted(c.items())
                          if k.startswith("inputs:")) + ")")
        print(f"non-TCError exceptions: {c.get('crash', 0)}; hangs: {c.get('hang', 0)}; "
              f"slowest input: {summary['slowest'][0]:.2f} s ({summary['slowest'][1]})")
    else:
        print(f"programs: {c.get('programs', 0)}; option sets: {c.get('option sets', 0)}; "
              f"programs with a finding: {summary['failing programs']}")
        print(f"mismatches: {c.get('mismatch', 0)}; crashes: {c.get('crash', 0)}; "
              f"hangs: {c.get('hang', 0)}; rejections of valid programs: "
              f"{c.get('rejected', 0)}; races: {c.get('race', 0)}; slow stages: "
              f"{c.get('slow', 0)}; harness errors: {c.get('harness', 0)}")
        if mode == "narrow":
            print(f"kernels emulated: {c.get('kernels', 0)}; on tensor cores: "
                  f"{c.get('on tensor cores', 0)}; with a reduction split over threads: "
                  f"{c.get('split reductions', 0)} (across blocks too: "
                  f"{c.get('split across blocks', 0)})")
    print(f"{len(summary['classes'])} classes:")
    for sig, where in sorted(summary["classes"].items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(where):5d}  {sig}\n         e.g. {', '.join(map(str, where[:6]))}")


if __name__ == "__main__":
    sys.exit(main())
