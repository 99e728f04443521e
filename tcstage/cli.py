"""`tcstage run | show`: run a TC file on random inputs, or print what the compiler made of it.

    tcstage run examples/tmm.tc --sizes M=128,K=64,N=256
    tcstage run examples/tmm.tc --target cuda-emulated --options "MappingOptions().tile(32, 32)"
    tcstage show examples/tmm.tc --ranges --halide
    tcstage show examples/tmm.tc --schedule --cuda --options "MappingOptions().tile(16, 16)
        .mapToThreads(16, 8).mapToBlocks(8, 8)" --sizes M=64,K=32,N=64
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np

import tcstage as tc
from tcstage.errors import TCError
from tcstage.lang import checked as C

DEFAULT_SIZE = 32


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tcstage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a TC function on random inputs on the CPU")
    show = sub.add_parser("show", help="print ranges, Halide Funcs, schedules and CUDA source")
    for p in (run, show):
        p.add_argument("file", help="a .tc source file")
        p.add_argument("--fn", help="the function to use (default: the only one, or the last)")
        p.add_argument("--sizes", default="", metavar="N=128,K=64",
                       help=f"size variables and scalar inputs (unset sizes are {DEFAULT_SIZE})")
        p.add_argument("--options", default=None, metavar="'MappingOptions()...'",
                       help="CUDA mapping options: a chain or a preset name (default: naive)")
    run.add_argument("--target", default="cpu", choices=("cpu", "cuda", "cuda-emulated"),
                     help="cpu: Halide JIT (default); cuda: one CUDA kernel on the GPU (pycuda); "
                          "cuda-emulated: the same kernel run on the CPU")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    run.add_argument("--repeat", type=int, default=10, help="timed runs after the first")
    run.add_argument("--schedule", default="Mullapudi2016",
                     help="CPU autoscheduler: Mullapudi2016 (default), Adams2019, Li2018 or none")
    show.add_argument("--ranges", action="store_true", help="inferred ranges per statement")
    show.add_argument("--halide", action="store_true", help="the Halide Func definitions")
    show.add_argument("--schedule", action="store_true",
                      help="the schedule tree before and after tiling and mapping")
    show.add_argument("--cuda", action="store_true", help="the generated CUDA source")
    args = parser.parse_args(argv)
    warnings.showwarning = _show_warning
    try:
        return _run(args) if args.command == "run" else _show(args)
    except TCError as e:
        print(e, file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (e.g. `| head`): not an error
        sys.stderr.close()
        return 0
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"warning: {message}", file=sys.stderr)


def _load(args) -> tuple[tc.TCFunction, dict]:
    with open(args.file, encoding="utf-8") as f:
        prog = tc.define(f.read(), args.file)
    name = args.fn or prog.names[-1]
    return prog[name], _parse_sizes(args.sizes)


def _parse_sizes(text: str) -> dict[str, float]:
    sizes = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, eq, value = item.partition("=")
        try:
            if not eq:
                raise ValueError
            sizes[name.strip()] = float(value) if "." in value else int(value)
        except ValueError:
            raise TCError(f"--sizes expects NAME=VALUE pairs separated by commas, got '{item}'") \
                from None
    return sizes


def random_inputs(fn: C.Function, sizes: dict, seed: int) -> tuple[list, list, list[str]]:
    """Random arguments for fn: (inputs, out= arrays, notes about defaulted values)."""
    rng = np.random.default_rng(seed)
    notes = []

    def size(d: str) -> int:
        if d.isdigit():
            return int(d)
        if d not in sizes:
            sizes[d] = DEFAULT_SIZE
            notes.append(f"{d}={DEFAULT_SIZE}")
        return int(sizes[d])

    bounds = index_bounds(fn, size)
    args = []
    for t in fn.inputs:
        if t.rank == 0:
            if t.name not in sizes:
                sizes[t.name] = 1
                notes.append(f"{t.name}=1")
            args.append(sizes[t.name])
            continue
        args.append(_random_tensor(rng, t.type, tuple(size(d) for d in t.dims),
                                   bounds.get(t.name)))
    outs = []
    for name in fn.outputs:
        t = fn.tensors[name]
        if t.inout:
            missing = [d for d in t.dims if d not in sizes]
            if missing:
                raise TCError(f"output '{name}' starts from the caller's values; give its shape "
                              f"with --sizes {','.join(f'{d}=...' for d in t.dims)}")
            outs.append(_random_tensor(rng, t.type, tuple(int(sizes[d]) for d in t.dims), None))
    return args, outs, notes


def index_bounds(fn: C.Function, size) -> dict[str, int]:
    """For integer inputs used inside subscripts: the smallest extent they index."""
    bounds: dict[str, int] = {}
    for st in fn.statements:
        for r in (n for n in C.walk(st.rhs) if isinstance(n, C.Read)):
            target = fn.tensors.get(r.tensor)
            if target is None or target.kind != "input":
                continue
            for k, arg in enumerate(r.args):
                for inner in (n for n in C.walk(arg) if isinstance(n, C.Read)):
                    extent = size(target.dims[k])
                    bounds[inner.tensor] = min(bounds.get(inner.tensor, extent), extent)
    return bounds


def _random_tensor(rng, t, shape, index_bound):
    if t.is_float:
        return rng.standard_normal(shape).astype(t.numpy)
    if t.kind == "bool":
        return rng.random(shape) < 0.5
    high = index_bound if index_bound else 10
    return rng.integers(0, max(high, 1), size=shape).astype(t.numpy)


def _run(args) -> int:
    f, sizes = _load(args)
    inputs, outs, notes = random_inputs(f.checked, sizes, args.seed)
    schedule = None if args.schedule.lower() == "none" else args.schedule
    out = (tuple(outs) if len(outs) > 1 else outs[0]) if outs else None
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
                            options=args.options, target=args.target)
        print(f"compiled to CUDA in {(time.perf_counter() - start) * 1e3:.1f} ms: "
              f"grid {kernel.grid}, block {kernel.block}")

        def call():
            return kernel(*inputs, out=_fresh(out))
    start = time.perf_counter()
    result = call()
    first = time.perf_counter() - start
    times = []
    for _ in range(max(args.repeat, 0)):
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
    f, sizes = _load(args)
    if not (args.ranges or args.halide or args.schedule or args.cuda):
        args.ranges = True
    call_args = None
    if sizes or f.specialized_scalars or args.schedule or args.cuda:
        inputs, outs, _ = random_inputs(f.checked, sizes, 0)
        call_args = (inputs, (tuple(outs) if len(outs) > 1 else outs[0]) if outs else None)
    if args.ranges:
        print(f"# ranges of {f.name}")
        reports = f.ranges(*call_args[0], out=call_args[1]) if call_args else f.ranges()
        for report in reports:
            print(report)
        if call_args:
            shapes = f.output_shapes(*call_args[0], out=call_args[1])
            for name, shape in zip(f.checked.outputs, shapes):
                print(f"output {name}: shape {shape}")
    if args.halide:
        print(f"# Halide Funcs of {f.name}")
        lowered = f.lower(*call_args[0], out=call_args[1]) if call_args else f.lower()
        print(lowered.describe())
    if args.schedule or args.cuda:
        kernel = tc.compile(tc.Program({f.name: f}), f.name, *call_args[0], out=call_args[1],
                            options=args.options, target="cuda")
        if args.schedule:
            print(f"# schedule of {f.name}")
            print(kernel.describe())
        if args.cuda:
            print(f"# CUDA of {f.name}")
            print(kernel.cuda_source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
