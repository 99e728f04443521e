"""The public entry points above the passes: `tc.compile` (with its in-process cache of kernels)
and `options="auto"`, which asks the tuner's cache and, failing that, the structural default.

The passes (compiler.py) know nothing of the tuner or of launching; this layer joins them with
the runtime (cuda/runtime.py) and the tuner (tune/), which in turn only call the passes.
"""

from __future__ import annotations

import collections
import re
import threading
import warnings
from collections.abc import Sequence

from tcstage.compiler import as_options, check_dynamic, compile_cuda, function_of, say_again
from tcstage.errors import TCArgumentError, TCError, TCWarning, warn
from tcstage.options import PRESETS, MappingOptions, made_as_starting_point
from tcstage.program import TCFunction

# -- tc.compile -----------------------------------------------------------------------------

COMPILED_KERNELS = 64  # kernels the in-process cache keeps (least recently used go first)
_kernels: collections.OrderedDict = collections.OrderedDict()
_kernels_lock = threading.Lock()


def compile(source, name: str | None = None, *inputs, options=None, target: str = "cuda", out=None,
            output_shape=None, dynamic: Sequence[str] = ()):
    """Compiles TC function `name` of `source` (TC text or a `Program`) to one CUDA kernel for
    the shapes of `inputs` (arrays, or shape tuples; scalars as values).

    `options`: a `MappingOptions`, its chain text, a preset name, or "auto": the best options
    the autotuner cached for this function, sizes and device, or else a default chosen from the
    TC's structure (with a TCWarning suggesting tuning); default: the single-thread options,
    `MappingOptions()`. A list gives one set per launch of a kernel sequence, in launch order
    (the first also decides the launches; docs/cuda.md "Kernel sequences").
    `target`: "cuda" (launch with pycuda) or "cuda-emulated" (the same source run on the CPU).
    `out`: the starting values of in/out outputs, as for calls.
    A Halide pipeline (`tc.from_halide(funcs)`) is compiled as `tc.compile(f, *inputs,
    output_shape=...)`: no name, and the shape of each output given.

    `dynamic`: size variables (e.g. `("B",)`) the kernel leaves symbolic: it takes any value
    of them at call time (the grid follows), while the other sizes stay fixed. Loops over
    them are never unrolled, tiles whose size would depend on them are not promoted, and
    index arithmetic is 64-bit.

    Compiling the same function for the same shapes, options and target again returns the same
    Kernel, from an in-process cache (the values of dynamic sizes are not part of the key).
    """
    from tcstage.cuda.runtime import Kernel, check_target

    check_target(target)  # before the work of compiling
    _, fn, inputs = function_of(source, name, inputs, output_shape)
    name = fn.name
    if inputs and isinstance(inputs[0], (MappingOptions, str)):
        raise TCArgumentError(
            f"tc.compile: {str(inputs[0])!r} stands where the first input of '{name}' goes; "
            f"tcstage takes the options by keyword, after the inputs: tc.compile(source, "
            f"'{name}', *inputs, options=...) (TC's order, compile(tc, name, options, "
            "*inputs), is not tcstage's)")
    dynamic = check_dynamic(fn, dynamic)  # before the work of finding options
    auto = isinstance(options, str) and options.strip().lower() == "auto"
    per_launch = listed = compiled = None
    if isinstance(options, (list, tuple)):
        options, per_launch, listed = _options_per_launch(name, options)
    if auto:
        options, per_launch, compiled, said = auto_options(fn, inputs, out, target)
    elif isinstance(options, MappingOptions) and made_as_starting_point(options) and \
            (start := _starting_point(options)):
        warn(f"in '{name}': these options are {start}. tcstage's options are immutable: "
             "o.tile(32) returns new options and leaves o as it was (TC's change o in place), "
             "so a chain whose result was not kept is lost; pass the name as text (options="
             "\"naive\") to mean a starting point as it is")
    options = as_options(options)
    binding = fn.bind(inputs, out, shapes_only=True)
    fixed = tuple(sorted((k, v) for k, v in binding.sizes.items() if k not in dynamic))
    key = (_source_key(fn), name, fixed, dynamic,
           binding.specialization(fn), tuple(str(t.type) for t in fn.checked.inputs),
           str(options), target)
    # auto's structural default gives each launch of a sequence its own options: the same
    # kernel as these options alone where there is one launch
    own_key = key + ("options per launch",) if per_launch is not None else key
    if listed is not None:
        own_key = key = key + tuple(map(str, listed))
    with _kernels_lock:
        kernel = _kernels.get(own_key)
        if kernel is None and per_launch is not None and key in _kernels \
                and len(_kernels[key].launches) == 1:
            kernel = _kernels[key]
        if kernel is not None:
            _kernels.move_to_end(own_key if own_key in _kernels else key)
            return kernel
    if compiled is not None and not dynamic:  # (auto compiled it to weigh it)
        say_again(said)
    elif auto and per_launch is None:
        # Tuned options from the cache: what in them had no effect is the tuner's affair, not
        # the caller's (a warm start is kept as written); kernel.explain() still lists it.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", f"in '{re.escape(name)}', option", TCWarning)
            warnings.filterwarnings("ignore", f"in '{re.escape(name)}', options that never "
                                    "act", TCWarning)
            compiled = compile_cuda(fn, inputs, out, options, dynamic, per_launch)
    else:
        compiled = compile_cuda(fn, inputs, out, options, dynamic, per_launch)
    if listed is not None and len(listed) != len(compiled.parts):
        runs = "; ".join(f"launch {k}: {', '.join(sorted({s.tensor for s in p.scop.statements}))}"
                         for k, p in enumerate(compiled.parts))
        raise TCError(f"tc.compile('{name}'): {len(listed)} sets of options were given, one per "
                      f"launch, but under the first set '{name}' runs as "
                      f"{len(compiled.parts)} launch(es) ({runs}): give one set per launch, in "
                      "this order (kernel.launches lists them)")
    kernel = Kernel(compiled, target)
    with _kernels_lock:
        _kernels[own_key] = kernel
        if len(kernel.launches) == 1:
            _kernels[key] = kernel
        while len(_kernels) > COMPILED_KERNELS:
            _kernels.popitem(last=False)
    return kernel


def _options_per_launch(name: str, given) -> tuple:
    """A list of options, one per launch of a kernel sequence: (the first, which decides the
    launches and maps the first, the function giving launch k the k-th, the list)."""
    if not given:
        raise TCArgumentError(f"tc.compile('{name}'): options=[] gives no options: give one "
                              "set per launch, or one MappingOptions for them all")
    listed = []
    for k, one in enumerate(given):
        if isinstance(one, str) and one.strip().lower() == "auto":
            raise TCArgumentError(f"tc.compile('{name}'): options[{k}] is 'auto', which chooses "
                                  "every launch's options itself: pass options='auto' alone")
        try:
            listed.append(as_options(one))
        except TCError as e:
            raise TCArgumentError(f"tc.compile('{name}'): options[{k}]: {e.message}") from None
    if len(listed) > 1 and any(o.overlapped_tiles for o in listed):
        raise TCArgumentError(
            f"tc.compile('{name}'): overlappedTiles(True) plans its launches from one set of "
            "options, so it cannot come in a list of options per launch: give one set")
    listed = tuple(listed)
    return listed[0], lambda position, _statements: listed[min(position, len(listed) - 1)], \
        listed


def _starting_point(options: MappingOptions) -> str:
    """What options equal to a starting point are, in words ('' for any others)."""
    if options == MappingOptions():
        return "MappingOptions(), the single-thread options: one thread in one block runs " \
            "the whole kernel"
    for name in PRESETS:
        if options == MappingOptions.named(name):
            return f"exactly the {name!r} starting point, MappingOptions({name!r})"
    return ""


def clear_kernel_cache() -> None:
    """Forgets the kernels `compile` keeps (for tests that change the compiler underneath)."""
    with _kernels_lock:
        _kernels.clear()


def _source_key(fn) -> str:
    from tcstage.tune.cache import tc_hash
    return tc_hash(fn)


def auto_options(fn: TCFunction, inputs, out, target: str):
    """options="auto": the cached best for this call on this device (a GPU's measurement
    first, then the cost model's), else the structural default with a TCWarning; with the
    latter, the function giving each launch of a kernel sequence its own (None with the
    former): (options, launch options, their compilation or None, the warnings it gave:
    where the cost model chose between candidates, the winner is compiled already)."""
    from tcstage.tune.cache import CacheError
    from tcstage.tune.heuristic import structural_default
    from tcstage.tune.model import H100
    from tcstage.tune.tuner import detect_gpu, tuned_options
    binding = fn.bind(inputs, out, shapes_only=True)
    devices = ([detect_gpu()] if target == "cuda" else []) + [f"model:{H100.name}"]
    for device in filter(None, devices):
        try:
            found = tuned_options(fn, binding, device)
        except CacheError as e:
            warn(f"options='auto' could not read the tuning cache: {e.message}")
            break
        if found is not None:
            return found, None, None, []
    options, per_launch, compiled, said = structural_default(fn, inputs, out)
    sizes = ", ".join(f"{k}={v}" for k, v in sorted(binding.sizes.items()))
    warn(f"options='auto': no tuned options for '{fn.name}' at {sizes} in the cache; using a "
         f"default from the TC's structure: {options}. tc.autotune(...) or `tcstage tune` "
         "finds better ones and caches them")
    return options, per_launch, compiled, said
