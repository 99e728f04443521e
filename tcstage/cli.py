"""`tcstage run | show | tune | compare`: run a TC file on random inputs, print what the compiler
made of it, tune its MappingOptions, or compare its schedules.

    tcstage run examples/tmm.tc --sizes M=128,K=64,N=256
    tcstage run examples/tmm.tc --target cuda-emulated --options "MappingOptions().tile(32, 32)"
    tcstage show examples/tmm.tc --ranges --halide
    tcstage show examples/tmm.tc --schedule --cuda --options "MappingOptions().tile(16, 16)
        .mapToThreads(16, 8).mapToBlocks(8, 8)" --sizes M=64,K=32,N=64
    tcstage tune examples/tmm.tc --sizes M=128,K=64,N=256 --effort quick --log tune.jsonl
    tcstage cache export --out records.jsonl

Exit status: 0 on success, 2 for a mistake on the command line, 1 for an error in the TC file
or while compiling and running it, 130 when Ctrl-C interrupted it (a tuning run prints the best
so far first; 143 and 129 for SIGTERM and SIGHUP). Errors are one line (`tcstage: error: ...`), or the compiler's
located message with a caret under the TC source.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import sys
import time
import warnings

import numpy as np

import tcstage as tc
from tcstage.lang import ellipsis
from tcstage.errors import TCError
from tcstage.halide.jit import AUTOSCHEDULERS, DEFAULT_SCHEDULE, schedule_name
from tcstage.halide.pipeline import PIPELINE_SCHEDULES
from tcstage.inputs import as_out, call_shapes, random_inputs
from tcstage.tune.tuner import EFFORTS
from tcstage.lang import checked as C

DEFAULT_SIZE = 32
# Under emulation every array exists three times: the caller's, and one private copy for each of
# the two thread schedules the race check compares.
_EMULATION_COPIES = 3


class UsageError(Exception):
    """A mistake on the command line (a flag, its value, a --sizes entry): exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{message} (see '{self.prog} --help')")


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        warnings.showwarning = _show_warning
        _check_flags(args)
        if args.command == "cache":
            return _cache(args)
        if args.file.endswith(".py"):
            return _halide_command(args)
        return {"run": _run, "show": _show, "tune": _tune, "compare": _compare}[args.command](args)
    except UsageError as e:
        return _fail(f"tcstage: error: {e}", 2)
    except TCError as e:  # located errors read like a compiler's, with the TC line and a caret
        return _fail(str(e) if e.span else f"tcstage: {e}", 1)
    except BrokenPipeError:  # the reader went away (e.g. `| head`): not an error
        sys.stderr.close()
        return 0
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        return _fail(f"tcstage: error: {e.strerror or e}{where}", 1)
    except MemoryError:
        return _fail("tcstage: error: out of memory; try smaller --sizes", 1)
    except KeyboardInterrupt as e:  # (a tuning run stopped by SIGTERM before anything passed
        # names the signal: its status is the signal's, as after a run that has a best)
        return _fail("tcstage: interrupted", _interrupted_status(getattr(e, "signal", "")))
    except Exception as e:  # a bug in tcstage: say so in one line, unless asked for the traceback
        if os.environ.get("TCSTAGE_TRACEBACK"):
            raise
        return _fail(f"tcstage: internal error: {type(e).__name__}: {' '.join(str(e).split())} "
                     "(a bug in tcstage; set TCSTAGE_TRACEBACK=1 to see where)", 1)


def _fail(message: str, status: int) -> int:
    print(message, file=sys.stderr)
    return status


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tcstage", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"tcstage {tc.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a TC function on random inputs on the CPU")
    show = sub.add_parser("show", help="print ranges, Halide Funcs, schedules and CUDA source")
    tune = sub.add_parser("tune", help="search CUDA MappingOptions (tc.autotune)")
    compare = sub.add_parser("compare", help="compare the schedules of a function (tc.compare)")
    cache = sub.add_parser("cache", help="the tuning cache: where it is, its entries, export "
                                         "its records")
    cache.add_argument("action", choices=("path", "list", "export"),
                       help="path: the cache file; list: the best options per kernel; export: "
                            "every evaluated candidate, one JSON object per line")
    cache.add_argument("--file", dest="cache_file", metavar="PATH",
                       help="a cache file other than the default one")
    cache.add_argument("--out", metavar="FILE.jsonl", help="write the export there (default: "
                                                           "standard output)")
    for p in (run, show, tune, compare):
        p.add_argument("file", help="a .tc source file, or a Python module with a Halide "
                                    "pipeline: build(), inputs(rng, size), output_shapes(args) "
                                    "(and for compare, optionally schedule_cpu(app)), as in "
                                    "examples/halide/")
        p.add_argument("--fn", help="the function to use (default: the last one in the file; "
                                    "for tune and compare, the file's only one)")
        p.add_argument("--sizes", type=_size_items, default=(), metavar="N=128,K=64",
                       help=f"size variables and scalar inputs (unset sizes are {DEFAULT_SIZE})")
    for p in (run, show, tune, compare):
        p.add_argument("--input-size", default="small", metavar="SIZE",
                       help="for a Halide pipeline module: the size its inputs() makes "
                            "(small, the default, or bench)")
    run.add_argument("--target", default="cpu", choices=("cpu", "cuda", "cuda-emulated"),
                     help="cpu: Halide JIT (default); cuda: one CUDA kernel on the GPU (pycuda); "
                          "cuda-emulated: the same kernel run on the CPU")
    run.add_argument("--options", metavar="'MappingOptions()...'",
                     help="CUDA mapping options of --target cuda and cuda-emulated: a chain or "
                          "a preset name (default: single_thread)")
    run.add_argument("--seed", type=_natural, default=0, help="seed of the random inputs")
    run.add_argument("--repeat", type=_natural, default=10, help="timed runs after the first")
    run.add_argument("--schedule", type=_schedule, metavar="NAME",
                     help=f"CPU schedule of --target cpu: {DEFAULT_SCHEDULE} (the default: "
                          "tcstage's structured scheduler), a 'CpuSchedule()...' chain, one of "
                          f"Halide's autoschedulers ({', '.join(AUTOSCHEDULERS)}), or none; "
                          "for a Halide pipeline (.py) auto (the default), as_written, root, "
                          "tcstage or an autoscheduler (docs/halide.md)")
    for p in (run, show):
        p.add_argument("--dynamic", type=_names, default=(), metavar="B,N",
                       help="CUDA: size variables the kernel leaves symbolic (tc.compile's "
                            "dynamic=); --sizes still picks their values for the inputs")
    show.add_argument("--ranges", action="store_true", help="inferred ranges per statement")
    show.add_argument("--halide", action="store_true", help="the Halide Func definitions")
    show.add_argument("--schedule", action="store_true",
                      help="the schedule tree before and after tiling and mapping")
    show.add_argument("--cuda", action="store_true", help="the generated CUDA source")
    show.add_argument("--gradient", action="store_true",
                      help="the backward function as TC source (tc.gradient)")
    show.add_argument("--options", metavar="'MappingOptions()...'",
                      help="CUDA mapping options for --schedule and --cuda: a chain or a preset "
                           "name (default: single_thread)")
    for p in (tune, compare):
        p.add_argument("--measure", choices=("gpu", "model"),
                       help="time on the GPU, or predict with the cost model (default: the GPU "
                            "if one works here)")
        p.add_argument("--budget", type=_positive if p is tune else _natural, metavar="N",
                       help="candidates to evaluate" + (" (default: as --effort says)"
                                                         if p is tune else
                                                         " if the cache has no tuned options "
                                                         "(default: 30; 0: no tuning run)"))
        p.add_argument("--no-progress", dest="progress", action="store_false",
                       help="no progress bar")
    tune.add_argument("--time", dest="time_budget", type=_seconds, metavar="SECONDS",
                      help="stop the search after this much wall time")
    tune.add_argument("--effort", choices=tuple(EFFORTS),
                      help="how long to search: " + ", ".join(
                          f"{k} (about {e.seconds:g} s, at most {e.candidates} candidates)"
                          for k, e in EFFORTS.items()) + "; default: default, unless --budget "
                      "or --time is given")
    tune.add_argument("--jobs", type=_positive, metavar="N",
                      help="candidates evaluated at a time (default: the CPU count)")
    tune.add_argument("--candidates", metavar="FILE",
                      help="evaluate exactly the options in FILE, one MappingOptions chain per "
                           "line ('#' starts a comment), instead of searching")
    tune.add_argument("--log", metavar="FILE.jsonl",
                      help="append every candidate's record to this file, one JSON object "
                           "per line")
    tune.add_argument("--target", default="cuda", choices=("cuda", "cpu"),
                      help="cuda: MappingOptions, timed on the GPU or predicted by the cost model; "
                           "cpu: the CPU schedule (CpuSchedule), each candidate timed here")
    tune.add_argument("--strategy", choices=("genetic", "tpe"), default="tpe",
                      help="tpe (model-guided, default) or genetic (TC's)")
    tune.add_argument("--seed", type=_natural, default=0,
                      help="seed of the search and the random inputs")
    tune.add_argument("--save", metavar="schedules/NAME.txt",
                      help="append the best options to a schedules file")
    compare.add_argument("--options", action="append", default=[], metavar="CHAIN",
                         help="manual mapping options to compare (repeatable): a chain or a "
                              "preset name")
    compare.add_argument("--schedules", default="schedules", metavar="DIR",
                         help="directory of schedules/*.txt files whose lines for this "
                              "function and sizes are compared (default: schedules)")
    compare.add_argument("--plot", metavar="OUT.png", help="write a PNG of the comparison")
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _positive(text: str) -> int:
    value = _natural(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expects an integer >= 1, got '{text}'")
    return value


def _natural(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expects an integer >= 0, got '{text}'")
    return value


def _schedule(text: str):
    """The CPU schedule `--schedule` names: 'tcstage', a CpuSchedule chain, an autoscheduler's
    name in any case, or 'none'; for a Halide pipeline also 'auto', 'as_written' or 'root'."""
    if text in PIPELINE_SCHEDULES:
        return text
    try:
        schedule = schedule_name(text)
    except tc.TCError as e:
        raise argparse.ArgumentTypeError(
            f"{e.message}; for a Halide pipeline (.py): {', '.join(PIPELINE_SCHEDULES)} or an "
            "autoscheduler") from None
    return "none" if schedule is None else schedule


def _names(text: str) -> tuple[str, ...]:
    """'B, N' -> ('B', 'N')."""
    return tuple(filter(None, (s.strip() for s in text.split(","))))


def _size_items(text: str) -> tuple[tuple[str, str], ...]:
    """'M=128, K=64' -> (('M', '128'), ('K', '64')); values are checked against the function."""
    items = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, eq, value = (s.strip() for s in item.partition("="))
        if name == "..." and eq:  # the run of a rank-polymorphic TC: '...=2x3', '...=' (none)
            if value and not all(v.strip().isdigit() for v in value.split("x")):
                raise argparse.ArgumentTypeError(
                    f"'...' takes the sizes of the run of dimensions it stands for, as in "
                    f"'...=2x3' ('...=' for none), got '{value}'")
        elif not (eq and name and value):
            raise argparse.ArgumentTypeError(
                f"expects NAME=VALUE pairs separated by commas, got '{item}'")
        if name in dict(items):
            raise argparse.ArgumentTypeError(f"gives {name} twice")
        items.append((name, value))
    return tuple(items)


def _check_flags(args) -> None:
    """Flags that would be silently ignored in this combination are mistakes."""
    if args.command == "run":
        if args.options is not None and args.target == "cpu":
            raise UsageError("--options maps the CUDA kernel and has no effect with --target cpu "
                             "(add --target cuda-emulated or --target cuda)")
        if args.schedule is not None and args.target != "cpu":
            raise UsageError(f"--schedule chooses the CPU autoscheduler and has no effect with "
                             f"--target {args.target}")
    elif args.command == "show" and args.options is not None and not (args.schedule or args.cuda):
        raise UsageError("--options maps the CUDA kernel, which only --schedule and --cuda show")
    elif args.command == "tune" and args.target == "cpu":
        given = [f for f, v in (("--jobs", args.jobs), ("--log", args.log),
                                ("--candidates", args.candidates)) if v is not None]
        if given:
            raise UsageError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for "
                             "--target cuda; a CPU tune times its candidates one at a time "
                             "here")


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"warning: {message}", file=sys.stderr)


# --- the function and its sizes --------------------------------------------------------------


def _load(args) -> tc.TCFunction:
    with open(args.file, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TCError(f"{args.file} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                      f"{e.start})") from None
    with warnings.catch_warnings(record=True) as caught:  # each function warns when defined
        warnings.simplefilter("always")
        prog = args.program = tc.define(text, args.file)
    if args.fn is None:
        if args.command in ("tune", "compare") and len(prog.names) > 1:
            raise UsageError(f"{args.file} defines several TC functions ({', '.join(prog.names)})"
                             "; choose one with --fn")
        name = prog.names[-1]
    elif args.fn not in prog.names:
        raise UsageError(f"--fn: {args.file} has no TC function named '{args.fn}'"
                         f"{_did_you_mean(args.fn, prog.names)} (it defines "
                         f"{', '.join(prog.names)})")
    else:
        name = args.fn
    _warn_again(caught, others=[n for n in prog.names if n != name])
    return _instance(prog[name], args)


def _warn_again(caught, others) -> None:
    """The warnings of defining the file, less those about its other functions ("in '1LUT',
    ..."), which the command does not run: `run --fn 2LUT` warned about 1LUT's reads too."""
    about_others = tuple(f"in '{n}'," for n in others)
    for w in caught:
        if not str(w.message).startswith(about_others):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _instance(f, args):
    """f, or for a rank-polymorphic f the instance `--sizes ...=2x3` asks for (its run's sizes
    become the instance's size variables D0, D1, ... in args.sizes)."""
    if not isinstance(f, tc.PolymorphicFunction):
        if any(name == "..." for name, _ in getattr(args, "sizes", ())):
            raise UsageError(f"--sizes: '{f.name}' has no '...' in its types, so '...=' gives it "
                             "nothing")
        return f
    items = dict(getattr(args, "sizes", ()))
    if "..." not in items:
        raise UsageError(f"'{f.name}' is rank-polymorphic: give the sizes '...' stands for "
                         "with --sizes, as in --sizes '...=2x3' ('...=' for none)")
    run = [int(v) for v in items["..."].split("x")] if items["..."] else []
    instance = f.instance(len(run))
    sizes, _ = ellipsis.run_names(f.definition, len(run))
    args.sizes = tuple((n, v) for n, v in args.sizes if n != "...") + \
        tuple((name, str(v)) for name, v in zip(sizes, run))
    return instance


def _did_you_mean(name: str, candidates) -> str:
    """'; did you mean 'X'?' for the closest candidate, ignoring case, or ''."""
    by_lower = {c.lower(): c for c in candidates}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return f"; did you mean '{by_lower[close[0]]}'?" if close else ""


def size_names(fn: C.Function) -> tuple[str, ...]:
    """What --sizes may set: size variables, the dimensions of in/out outputs (`T.0`), and
    scalar inputs, in signature order."""
    names = [d for t in fn.inputs for d in t.dims if not d.isdigit()]
    names += [d for n in fn.outputs if fn.tensors[n].inout for d in fn.tensors[n].dims]
    names += list(fn.scalar_inputs)
    return tuple(dict.fromkeys(names))


def given_sizes(fn: C.Function, items, label: str) -> dict[str, int | float | bool]:
    """The --sizes items checked against fn: known names, positive integer sizes, and scalar
    values of the scalar's type. `label` names fn in messages."""
    known = size_names(fn)
    values = {}
    for name, text in items:
        if name not in known:
            listing = f"its sizes are {', '.join(known)}" if known else "it has no sizes"
            raise UsageError(f"--sizes: '{label}' has no size or scalar named '{name}'"
                             f"{_did_you_mean(name, known)} ({listing})")
        t = fn.tensors.get(name) if name in fn.scalar_inputs else None
        values[name] = _scalar_value(name, text, t.type) if t else _size_value(name, text)
    return values


def _size_value(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"--sizes: {name} must be a positive integer, got '{text}'")
    return value


def _scalar_value(name: str, text: str, t) -> int | float | bool:
    try:
        if t.is_float:
            return float(text)
        if t.kind == "bool":
            return {"true": True, "1": True, "false": False, "0": False}[text.lower()]
        value = int(text)
    except (ValueError, KeyError):
        raise UsageError(f"--sizes: scalar input {name} is {t}, got '{text}'") from None
    info = np.iinfo(t.numpy)
    if not info.min <= value <= info.max:
        raise UsageError(f"--sizes: scalar input {name} is {t}; {value} is out of its range "
                         f"[{info.min}, {info.max}]")
    return value


def complete_sizes(fn: C.Function, given: dict) -> tuple[dict, list[str]]:
    """Every size and scalar fn needs: the given ones, the rest defaulted (and listed in notes).
    The shape of an in/out output cannot be guessed, so it must be given."""
    sizes, notes = dict(given), []
    for name in fn.outputs:
        t = fn.tensors[name]
        missing = [d for d in t.dims if d not in sizes] if t.inout else []
        if missing:
            raise UsageError(f"output '{name}' starts from the caller's values; give its shape "
                             f"with --sizes {','.join(f'{d}=...' for d in t.dims)}")
    for name in size_names(fn):
        if name not in sizes:
            sizes[name] = 1 if name in fn.scalar_inputs else DEFAULT_SIZE
            notes.append(f"{name}={sizes[name]}")
    return sizes, notes


def tensor_bytes(f: tc.TCFunction, sizes: dict) -> int:
    """Bytes of every tensor of a call at these sizes: inputs, outputs and temporaries (each as
    the bounding box of the ranges its statements write). Inputs are counted first, so absurd
    sizes are measured without asking range inference about them."""
    fn = f.checked
    inputs, outs = call_shapes(fn, sizes)
    out = tuple(outs) or None
    total = sum(math.prod(s) * t.type.numpy.itemsize
                for t, s in zip(fn.inputs, inputs) if t.rank)
    if total > available_memory():
        return total
    for name, shape in zip(fn.outputs, f.output_shapes(*inputs, out=out)):
        total += math.prod(shape) * fn.tensors[name].type.numpy.itemsize
    boxes: dict[str, list[tuple[int, int]]] = {}
    for st, report in zip(fn.statements, f.ranges(*inputs, out=out)):
        if fn.tensors[st.tensor].kind == "temp" and all(v in report.concrete for v in st.indices):
            ranges = [report.concrete[v] for v in st.indices]
            old = boxes.setdefault(st.tensor, ranges)
            boxes[st.tensor] = [(min(a[0], b[0]), max(a[1], b[1])) for a, b in zip(old, ranges)]
    for name, box in boxes.items():
        total += math.prod(max(0, hi - lo) for lo, hi in box) * fn.tensors[name].type.numpy.itemsize
    return total


def available_memory() -> int:
    """Bytes the machine can give this process now (MemAvailable), or a huge number if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def _check_memory(f: tc.TCFunction, sizes: dict, target: str) -> None:
    needed = tensor_bytes(f, sizes) * (_EMULATION_COPIES if target == "cuda-emulated" else 1)
    available = available_memory()
    if needed > available:
        given = ",".join(f"{n}={sizes[n]}" for n in size_names(f.checked))
        raise UsageError(f"--sizes {given}: '{f.name}' would need {_gib(needed)} of memory for "
                         f"its tensors{' under emulation' if target == 'cuda-emulated' else ''}, "
                         f"more than the {_gib(available)} available")


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


# --- run and show ----------------------------------------------------------------------------


def _run(args) -> int:
    f = _load(args)
    sizes, notes = complete_sizes(f.checked, given_sizes(f.checked, args.sizes, f.name))
    _check_memory(f, sizes, args.target)
    inputs, outs = random_inputs(f.checked, sizes, args.seed)
    out = as_out(outs)
    schedule = args.schedule or DEFAULT_SCHEDULE
    schedule = None if schedule == "none" else schedule
    print(f"{f!r}")
    if notes:
        print(f"defaults: {', '.join(notes)}")
    shapes = [f"{t.name}{tuple(a.shape)}" for t, a in zip(f.checked.inputs, inputs) if t.rank]
    print(f"inputs:  {' '.join(shapes)}")
    if args.target == "cpu":
        def call():
            return f(*inputs, out=_fresh(out), schedule=schedule)
    else:
        start = time.perf_counter()
        kernel = tc.compile(tc.Program({f.name: f}), f.name, *inputs, out=out,
                            options=args.options, target=args.target, dynamic=args.dynamic)
        print(f"compiled to CUDA in {(time.perf_counter() - start) * 1e3:.1f} ms: "
              f"grid {kernel.grid}, block {kernel.block}")

        def call():
            return kernel(*inputs, out=_fresh(out))
    start = time.perf_counter()
    result = call()
    first = time.perf_counter() - start
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    results = result if isinstance(result, tuple) else (result,)
    mins = f.output_mins(*inputs, out=out)
    for name, r, m in zip(f.checked.outputs, results, mins):
        origin = f" starting at index {m}" if any(m) else ""
        print(f"output:  {name}{tuple(r.shape)} {r.dtype}{origin}  sum={float(np.sum(r)):.6g}")
    if args.target != "cpu":  # check the kernel against the CPU back end
        reference = f(*inputs, out=_fresh(out))
        reference = reference if isinstance(reference, tuple) else (reference,)
        worst = max(float(np.max(np.abs(np.asarray(r, np.float64) - np.asarray(c, np.float64)),
                                 initial=0.0)) for r, c in zip(results, reference))
        print(f"max |{args.target} - cpu| = {worst:.3g}")
    print(f"first call ({'compile + ' if args.target == 'cpu' else ''}run): "
          f"{first * 1e3:.1f} ms")
    if times:
        what = f"schedule: {schedule or 'none'}" if args.target == "cpu" else args.target
        print(f"run: median {np.median(times) * 1e3:.3f} ms over {len(times)} runs ({what})")
    return 0


def _fresh(out):
    """A copy of the in/out starting values, so that repeated runs start from the same ones."""
    if out is None:
        return None
    return tuple(o.copy() for o in out) if isinstance(out, tuple) else out.copy()


def _show(args) -> int:
    """Shows need shapes, not values: nothing is allocated, whatever the sizes."""
    f = _load(args)
    given = given_sizes(f.checked, args.sizes, f.name)
    if args.gradient:
        print(tc.gradient(args.program, f.name), end="")
        if not (args.ranges or args.halide or args.schedule or args.cuda):
            return 0
    if not (args.ranges or args.halide or args.schedule or args.cuda):
        args.ranges = True
    call = None
    if given or f.specialized_scalars or args.schedule or args.cuda:
        inputs, outs = call_shapes(f.checked, complete_sizes(f.checked, given)[0])
        call = (inputs, tuple(outs) or None)
    if args.ranges:
        print(f"# ranges of {f.name}")
        for report in f.ranges(*call[0], out=call[1]) if call else f.ranges():
            print(report)
        if call:
            for name, shape in zip(f.checked.outputs, f.output_shapes(*call[0], out=call[1])):
                print(f"output {name}: shape {shape}")
    if args.halide:
        print(f"# Halide Funcs of {f.name}")
        print((f.lower(*call[0], out=call[1]) if call else f.lower()).describe())
    if args.schedule or args.cuda:
        kernel = tc.compile(tc.Program({f.name: f}), f.name, *call[0], out=call[1],
                            options=args.options, target="cuda", dynamic=args.dynamic)
        _print_kernel(args, f.name, kernel)
    return 0


def _print_kernel(args, name: str, kernel) -> None:
    if args.schedule:
        print(f"# schedule of {name}")
        print(kernel.describe())
    if args.cuda:
        print(f"# CUDA of {name}")
        print(kernel.cuda_source)


# --- Halide pipelines (Python modules) --------------------------------------------------------


def _halide_app(args):
    """The pipeline a Python module builds, its arguments and its output shapes."""
    import importlib.util
    if args.sizes or args.fn:
        raise UsageError("a Halide pipeline module makes its own inputs (inputs(rng, size)): "
                         "choose their size with --input-size, not --sizes or --fn")
    if getattr(args, "gradient", False):
        raise UsageError("--gradient: tc.gradient differentiates TC functions, not Halide "
                         "pipelines")
    if not os.path.isfile(args.file):
        raise OSError(2, "No such file or directory", args.file)
    spec = importlib.util.spec_from_file_location("_tcstage_app", os.path.abspath(args.file))
    module = importlib.util.module_from_spec(spec)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(args.file))))
    sys.path.insert(0, root)  # examples/halide/x.py imports examples.halide.common
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(root)
    missing = [n for n in ("build", "inputs", "output_shapes") if not hasattr(module, n)]
    if missing:
        raise UsageError(f"{args.file} is not a Halide pipeline module: it defines no "
                         f"{', '.join(missing)} (see docs/halide.md, Porting a pipeline)")
    app = module.build()
    outputs = getattr(app, "outputs", app)
    name = getattr(app, "name", None) or os.path.splitext(os.path.basename(args.file))[0]
    f = outputs if isinstance(outputs, tc.HalideFunction) else tc.from_halide(outputs, name)
    inputs = module.inputs(np.random.default_rng(getattr(args, "seed", 0)), args.input_size)
    shapes = [tuple(s) for s in module.output_shapes(inputs)]
    args.module = module
    return f, list(inputs), shapes


def _manual_pipeline(module, name: str):
    """The module's pipeline with its own CPU schedule (`schedule_cpu(app)` on a fresh build),
    or None where it has none."""
    if not hasattr(module, "schedule_cpu"):
        return None
    app = module.build()
    module.schedule_cpu(app)
    return tc.from_halide(getattr(app, "outputs", app), name)


def _halide_command(args) -> int:
    f, inputs, shapes = _halide_app(args)
    shape = shapes[0] if len(shapes) == 1 else shapes
    print(f"{f!r}")
    if args.command == "tune":
        return _tuned(tc.autotune(f, *inputs, output_shape=shape, **_tune_arguments(args)))
    if args.command == "compare":
        result = tc.compare(f, *inputs, output_shape=shape, options=args.options,
                            schedules_dir=args.schedules,
                            tune_budget=30 if args.budget is None else args.budget,
                            measure=args.measure, progress=args.progress, plot=args.plot,
                            filename=args.file, manual=_manual_pipeline(args.module, f.name))
        print(result.table())
        if args.plot:
            print(f"plot written to {args.plot}")
        return 0
    cuda = args.command == "show" and (args.schedule or args.cuda) or \
        args.command == "run" and args.target != "cpu"
    kernel = tc.compile(f, *inputs, output_shape=shape, options=args.options,
                        target=getattr(args, "target", "cuda-emulated")
                        if args.command == "run" else "cuda-emulated",
                        dynamic=getattr(args, "dynamic", ())) if cuda else None
    if args.command == "show":
        if not (args.ranges or args.halide or args.schedule or args.cuda):
            args.ranges = True
        if args.ranges:
            print(f"# ranges of {f.name}")
            for report in f.ranges(*inputs, output_shape=shape):
                print(report)
        if args.halide:
            print(f"# Halide Funcs of {f.name}")
            print(f.describe())
            print(f"# tensors of {f.name} (Funcs over the regions Halide infers)")
            print(f.specialized(shape).lower(*inputs).describe())
        if kernel is not None:
            _print_kernel(args, f.name, kernel)
        return 0
    start = time.perf_counter()
    result = f(*inputs, output_shape=shape, schedule=args.schedule or "auto") \
        if kernel is None else kernel(*inputs)
    first = time.perf_counter() - start
    results = result if isinstance(result, tuple) else (result,)
    for r in results:
        print(f"output:  {tuple(r.shape)} {r.dtype}  sum={float(np.sum(r, dtype=np.float64)):.6g}")
    if kernel is None:
        print(f.explain(*inputs, output_shape=shape, schedule=args.schedule or "auto"))
    if kernel is not None:
        reference = f(*inputs, output_shape=shape)
        reference = reference if isinstance(reference, tuple) else (reference,)
        worst = max(float(np.max(np.abs(np.asarray(r, np.float64) - np.asarray(c, np.float64)),
                                 initial=0.0)) for r, c in zip(results, reference))
        print(f"max |{args.target} - cpu| = {worst:.3g}")
    print(f"first call: {first * 1e3:.1f} ms")
    return 0


# --- tune and compare ------------------------------------------------------------------------


def _call_shapes(args):
    """The function, its complete sizes, and shape-only call arguments."""
    f = _load(args)
    sizes, _ = complete_sizes(f.checked, given_sizes(f.checked, args.sizes, f.name))
    inputs, outs = call_shapes(f.checked, sizes)
    return f, sizes, inputs, (tuple(outs) or None)


def _tune(args) -> int:
    if args.save and args.target == "cpu":
        raise UsageError("--save stores MappingOptions for the CUDA path in schedules/; a tuned "
                         "CpuSchedule is printed: pass its text to `tcstage run --schedule`")
    f, sizes, inputs, out = _call_shapes(args)
    result = tc.autotune(args.program, f.name, *inputs, out=out, **_tune_arguments(args))
    if args.save:
        _save(args, f, sizes, result)
    return _tuned(result, f"saved to {args.save}" if args.save else "")


def _tune_arguments(args) -> dict:
    extra = {} if args.target == "cpu" else dict(jobs=args.jobs, log=args.log,
                                                 candidates=_candidates(args.candidates))
    return dict(target=args.target, measure=args.measure, budget=args.budget,
                time_budget=args.time_budget, effort=args.effort, strategy=args.strategy,
                seed=args.seed, progress=args.progress, **extra)


def _candidates(path: str | None) -> list[str] | None:
    """The chains of a --candidates file (each checked to parse, with its line named), or
    None without one."""
    if path is None:
        return None
    chains = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                tc.MappingOptions.parse(text)
            except TCError as e:
                raise UsageError(f"--candidates {path}:{number}: {e.message}") from None
            chains.append(text)
    if not chains:
        raise UsageError(f"--candidates {path}: no MappingOptions in the file")
    return chains


def _tuned(result, saved: str = "") -> int:
    """Prints a tuning result; the exit status says whether the run was interrupted (130 for
    Ctrl-C, 128 + the signal's number for SIGTERM and SIGHUP), as a shell expects."""
    print(result)
    if saved:
        print(saved)
    if not result.interrupted:
        return 0
    from tcstage.tune.search import stopping_signal
    return _interrupted_status(stopping_signal(result.stopped))


def _interrupted_status(signal_name: str) -> int:
    """128 + the signal's number, as a shell reports a process the signal killed (no name:
    Ctrl-C, 130)."""
    import signal
    return 128 + (getattr(signal, signal_name) if signal_name else signal.SIGINT)


def _cache(args) -> int:
    import json

    from tcstage.tune.cache import Cache
    with Cache(args.cache_file) as cache:
        if args.action == "path":
            print(cache.path)
            return 0
        if args.action == "list":
            for e in cache.entries():
                sizes = ",".join(f"{k}={v}" for k, v in e.key.sizes)
                print(f"{e.key.function} {sizes} {e.key.device} {e.measured} "
                      f"{e.time * 1e6:.2f} us {e.checked or 'UNCHECKED'}: {e.options}")
            return 0
        records = cache.records()
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
    try:
        for r in records:
            out.write(json.dumps(r) + "\n")
    finally:
        if args.out:
            out.close()
            print(f"{len(records)} records written to {args.out}")
    return 0


SCHEDULES_HEADER = ("# MappingOptions found by `tcstage tune --save`. One line per case:\n"
                    "# name | file:function | sizes | options\n")


def _save(args, f, sizes, result) -> None:
    """Appends the best options as a schedules-file line, after a comment saying where and
    when they were found; a new file starts with a header comment."""
    import datetime
    names = size_names(f.checked)
    line = (f"{f.name}-tuned | {os.path.basename(args.file)}:{f.name} | "
            f"{','.join(f'{n}={sizes[n]}' for n in names)} | {result.options}\n")
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %z")
    comment = (f"# tuned on {result.measured_on} at {now}: {result.time * 1e6:.3g} us per call, "
               f"{len(result.history)} candidates, {result.strategy}\n")
    directory = os.path.dirname(args.save)
    if directory:
        os.makedirs(directory, exist_ok=True)
    new = not os.path.exists(args.save) or os.path.getsize(args.save) == 0
    with open(args.save, "a", encoding="utf-8") as out:
        out.write((SCHEDULES_HEADER if new else "") + comment + line)


def _compare(args) -> int:
    f, sizes, inputs, out = _call_shapes(args)
    _check_memory(f, sizes, "cuda-emulated")
    result = tc.compare(args.program, f.name, *inputs,
                        options=args.options, schedules_dir=args.schedules,
                        tune_budget=30 if args.budget is None else args.budget,
                        measure=args.measure, progress=args.progress, plot=args.plot,
                        filename=args.file)
    print(result.table())
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
