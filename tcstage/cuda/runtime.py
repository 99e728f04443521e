"""A compiled CUDA kernel as a Python object: its source, launch shape and schedule trees, and
calls that bind arguments to the kernel's parameters, allocate outputs and temporaries, and
launch on a GPU through pycuda (`target="cuda"`) or on the CPU under emulation
(`target="cuda-emulated"`).
"""

from __future__ import annotations

import functools

import attrs
import islpy as isl
import numpy as np

from tcstage.compiler import Compiled
from tcstage.cuda.emulate import emulate
from tcstage.errors import TCArgumentError, TCError
from tcstage.halide.solver import evaluate

TARGETS = ("cuda", "cuda-emulated")


def check_target(target: str) -> None:
    if target not in TARGETS:
        raise TCError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)} "
                      "(the CPU back end is the TC function itself: prog.f(...))")


def schedule_text(schedule: isl.Schedule) -> str:
    """An isl schedule tree in isl's indented (block) YAML form."""
    printer = isl.Printer.to_str(isl.DEFAULT_CONTEXT).set_yaml_style(isl.yaml_style.BLOCK)
    return printer.print_schedule(schedule).get_str()


@attrs.frozen
class Launch:
    """One launch of a Kernel: what runs, on what shape, in which order (`Kernel.launches`)."""

    name: str  # the CUDA kernel's name
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int  # dynamic shared memory per block (tcstage's is all static: 0)
    static_shared_bytes: int  # the promoted tiles' __shared__ buffers per block
    statements: tuple[str, ...]  # the TC statements it runs, as written
    options: object = None  # the MappingOptions that mapped it (each launch's own, see compile)


class Kernel:
    """One TC function compiled to CUDA for fixed shapes, or, for the size variables compiled
    as `dynamic`, for any value of them (the grid follows at launch): one kernel, or a
    sequence of kernels launched in order (`launches`) where a dependence crosses every loop
    around the statements (poly/launches.py).

    `kernel(*inputs, out=...)` runs it (also `kernel.run`); `cuda_source`, `grid`, `block`,
    `schedule_tree` and `describe()` show what the compiler made of the options.
    """

    def __init__(self, compiled: Compiled, target: str):
        check_target(target)
        self.compiled, self.target = compiled, target
        self._launcher = None
        self._checked_sizes: dict = {}  # dynamic size values -> launch grid, once checked

    # -- what was generated -------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.compiled.cuda.name

    @property
    def cuda_source(self) -> str:
        """The CUDA source of every launch (one kernel function each)."""
        return self.compiled.cuda.source

    @property
    def grid(self) -> tuple[int, int, int]:
        """The grid for the sizes compiled with (`launch_grid` for other dynamic values); of
        the first launch of a sequence (`launches` has each one's)."""
        return self.launch_grid(self.compiled.binding.sizes)

    @property
    def block(self) -> tuple[int, int, int]:
        """The block (of the first launch of a sequence)."""
        return self.compiled.cuda.block

    @property
    def launches(self) -> list[Launch]:
        """Every launch in order: a kernel of one launch has one."""
        from tcstage.lang.checked import statement_text
        out = []
        for part in self.compiled.parts:
            indices = sorted({s.tc_statement for s in part.scop.statements})
            fn = part.fn.checked if hasattr(part.fn, "checked") else None
            texts = tuple(statement_text(fn.statements[i]) for i in indices) if fn is not None \
                else tuple(s.tensor for s in part.scop.statements)
            out.append(Launch(part.cuda.name, self._part_grid(part, self.compiled.binding.sizes),
                              part.cuda.block, 0, part.shared_bytes, texts, part.options))
        return out

    @property
    def options(self):
        return self.compiled.options

    @property
    def sizes(self) -> dict:
        """The sizes compiled with (for dynamic sizes, the values of the inputs given then)."""
        return dict(self.compiled.binding.sizes)

    @property
    def dynamic(self) -> tuple[str, ...]:
        """The size variables that any call may choose."""
        return self.compiled.dynamic

    def launch_grid(self, sizes: dict) -> tuple[int, int, int]:
        """The grid for these sizes: the compiled one, or, with dynamic sizes, as many blocks
        along each mapped dimension as the loop on it has work for (ceil(extent / tile) for
        a tile loop), at most the compiled number (the first launch's, for a sequence)."""
        return self._part_grid(self.compiled.parts[0], sizes)

    def _part_grid(self, part, sizes: dict) -> tuple[int, int, int]:
        if not self.dynamic:
            return part.cuda.grid
        key = (part.cuda.name, tuple(int(sizes[d]) for d in self.dynamic))
        grid = self._checked_sizes.get(key)
        if grid is None:
            from tcstage.poly.mapping import launch_grid
            from tcstage.poly.scop import check_bounds, specialize
            values = dict(zip(self.dynamic, key[1]))
            scop = specialize(part.scop, values)
            check_bounds(scop, self.compiled.lowered)  # as a compile for these sizes would
            grid = launch_grid(part.mapped, scop.context)
            self._checked_sizes[key] = grid
        return grid

    @property
    def schedule_tree(self) -> str:
        """The final schedule tree (filters on b0..b2 / t0..t2 are the block and thread
        mapping, `_sync*` the barriers, `_<k>in` / `_<k>out` the copies of promoted tiles)."""
        return schedule_text(self.compiled.promoted.schedule)

    @property
    def timings(self) -> dict:
        return dict(self.compiled.timings)

    def describe(self) -> str:
        """The schedule before and after mapping and a summary of the mapping (per launch of
        a sequence)."""
        if self.compiled.launches:
            return "\n\n".join(f"launch {k} of {len(self.compiled.launches)}:\n" +
                                _describe(self, part)
                                for k, part in enumerate(self.compiled.launches))
        return _describe(self, self.compiled)

    def explain(self, device: str = "H100", ptxas: bool = False) -> str:
        """What each option did: the loops tiled, the loop on each block and thread index,
        promotions, unrolling, why each barrier is there, and the options without effect;
        then each launch's use of `device` (H100 or H200: blocks against its SMs, occupancy,
        bytes moved, the cost model's bound), with ptxas's register and shared-memory figures
        where `ptxas` is true and nvcc is installed (a compile of a few seconds), the cost
        model's estimates otherwise."""
        from tcstage.cuda.nvcc import resources
        from tcstage.poly.explain import explain
        from tcstage.tune.model import device_by_name
        found = resources(self.cuda_source) if ptxas else None
        return explain(self.compiled, device_by_name(device), found)

    def __repr__(self) -> str:
        return (f"<tcstage.Kernel {self.name} target={self.target} grid={self.grid} "
                f"block={self.block}>")

    # -- running -----------------------------------------------------------------------------
    def __call__(self, *inputs, out=None):
        """Runs the kernel. Returns an array, or a tuple for several outputs."""
        return self.prepare(*inputs, out=out)()

    def prepare(self, *inputs, out=None, blocks=None, fill=None) -> "PreparedCall":
        """Checks the arguments and allocates the outputs once; the returned call launches the
        kernel on those same arrays as often as wanted, with no Python-side checking.

        Under emulation only: `blocks`, one list of block indices per launch (None: all of
        that launch's blocks), runs a sample of a kernel too large to emulate whole; `fill`
        (a function of a numpy dtype) starts the outputs and temporaries that are not in/out at
        its value for their dtype instead of 0, so that what the sampled blocks wrote can be
        told from what they did not."""
        binding = self.compiled.fn.bind(inputs, out)
        self._check_shapes(binding)
        parts = self.compiled.parts
        grids = [self._part_grid(p, binding.sizes) for p in parts]
        if self.target == "cuda-emulated":
            runs, finish = self._stage_emulated(binding, fill)
            source = self.cuda_source
            only = list(blocks) if blocks is not None else [None] * len(parts)
            if len(only) != len(parts):
                raise TCError(f"blocks= gives {len(only)} lists for {len(parts)} launches")

            def emulated():
                for part, grid, args, chosen in zip(parts, grids, runs, only):
                    emulate(source, part.cuda.name, grid, part.cuda.block, args, blocks=chosen)
            return PreparedCall(emulated, finish)
        if blocks is not None or fill is not None:
            raise TCError("blocks= and fill= sample a kernel under emulation "
                          "(target='cuda-emulated'); on a GPU every block runs")
        from tcstage.cuda.launch import Launcher, stage_on_gpu
        if self._launcher is None:  # (each launch's function, from the one source)
            self._launcher = [Launcher(attrs.evolve(p.cuda, source=self.cuda_source))
                              for p in parts]
        values, finish = stage_on_gpu(self, binding)
        launchers = self._launcher

        def launch():  # (in order on one stream: each launch sees the last one's results)
            for launcher, part_values, grid in zip(launchers, values, grids):
                launcher(part_values, grid)
        return PreparedCall(launch, finish)

    run = __call__

    def _check_shapes(self, binding) -> None:
        want, fn, dynamic = self.compiled.binding, self.compiled.fn, self.dynamic

        def fixed(b):
            return {k: v for k, v in b.sizes.items() if k not in dynamic}
        if fixed(binding) != fixed(want) or \
                binding.specialization(fn) != want.specialization(fn):
            def show(b):
                items = sorted(fixed(b).items()) + list(b.specialization(fn))
                return ", ".join(f"{k}={v}" for k, v in items) + \
                    "".join(f", {d} any" for d in dynamic if b is want)
            raise TCArgumentError(
                f"this kernel of '{fn.name}' was compiled for {show(want)}; the arguments give "
                f"{show(binding)}", notes=("compile again for these shapes with tc.compile",))
        if dynamic:  # shapes that range inference rejects for these values (a negative extent)
            fn._output_layout(binding)

    @functools.cached_property
    def buffer_shapes(self) -> dict:
        """Output and temporary tensor -> shape, for the sizes compiled with."""
        return self.buffer_shapes_for(self.compiled.binding.sizes)

    def buffer_shapes_for(self, sizes: dict) -> dict:
        """Output and temporary tensor -> shape, for a call's sizes (they differ from the
        compiled ones in dynamic sizes only)."""
        c = self.compiled
        if not self.dynamic:
            sizes = c.binding.sizes
        values = {**c.binding.sizes, **sizes,
                  **{k: int(v) for k, v in c.binding.scalars.items()
                     if isinstance(v, (int, np.integer))}}
        return {name: tuple(evaluate(e, values) for e in c.lowered.ranges.tensors[name].extents)
                for name, t in c.fn.checked.tensors.items() if t.kind != "input"}

    @property
    def scratch(self) -> dict:
        """Scratch array -> (shape, dtype): zeroed arrays the kernel needs besides its tensors
        (a reduction split across blocks keeps its blocks' values and count there, and sets
        the count back to 0 before it ends, so one array serves every launch)."""
        return {p.source: (p.shape, np.dtype(p.dtype)) for part in self.compiled.parts
                for p in part.cuda.parameters if p.kind == "scratch"}

    def launch_values(self, binding, buffers: dict, pointer=lambda a: a) -> list[list]:
        """Each launch's arguments in its parameter order; arrays go through `pointer`."""
        return [self._part_values(part, binding, buffers, pointer)
                for part in self.compiled.parts]

    def _part_values(self, part, binding, buffers: dict, pointer) -> list:
        fn = self.compiled.fn
        sizes = {**self.compiled.binding.sizes, **binding.sizes}  # the call's dynamic sizes
        values = []
        for p in part.cuda.parameters:
            if p.kind in ("output", "temp", "scratch"):
                values.append(pointer(buffers[p.source]))
            elif p.kind == "input":
                values.append(pointer(binding.arrays[p.source]))
            elif p.kind == "scalar":
                t = fn.checked.tensors[p.source].type
                value = t.numpy.type(binding.scalars[p.source])
                # (a bfloat16 as the Python float of its rounded value: numpy has no bfloat16
                # scalar of its own, and ml_dtypes' is no np.floating)
                values.append(float(value) if t.kind == "bfloat" else value)
            else:
                values.append(np.dtype(p.dtype).type(sizes[p.source]))
        return values

    def _stage_emulated(self, binding, fill=None):
        fn = self.compiled.fn
        for name, a in (*binding.arrays.items(), *binding.inout.items()):
            if not isinstance(a, np.ndarray):
                raise TCArgumentError(f"target 'cuda-emulated' runs on the CPU and takes numpy "
                                      f"arrays; {name} is a {type(a).__name__}")
        buffers = {}
        for name, shape in self.buffer_shapes_for(binding.sizes).items():
            start = binding.inout.get(name)
            dtype = fn.checked.tensors[name].type.numpy
            buffers[name] = np.ascontiguousarray(start) if start is not None else \
                np.zeros(shape, dtype) if fill is None else np.full(shape, fill(dtype), dtype)
        for name, (shape, dtype) in self.scratch.items():
            buffers[name] = np.zeros(shape, dtype)
        args = self.launch_values(binding, buffers, pointer=np.ascontiguousarray)

        def finish():
            for name, start in binding.inout.items():  # in/out outputs are updated in place
                if start is not buffers[name]:
                    start[...] = buffers[name]
            results = [binding.inout.get(n, buffers[n]) for n in fn.checked.outputs]
            return results[0] if len(results) == 1 else tuple(results)

        return args, finish


class PreparedCall:
    """A kernel bound to its arrays: `call()` launches and returns the outputs; `launch()` only
    launches (asynchronously on a GPU), `results()` returns the outputs of the last launch."""

    def __init__(self, launch, finish):
        self.launch, self.results = launch, finish

    def __call__(self):
        self.launch()
        return self.results()


def _describe(kernel: "Kernel", c) -> str:
    """Kernel.describe for one launch (`c`: its Compiled)."""
    m = c.mapped
    tiles = ", ".join(f"member {k}: {s}" for k, s in zip(c.tiled.tiled_members,
                                                          c.tiled.tile_sizes)) or "none"
    renamed = f" (TC function '{c.fn.name}')" if c.cuda.name != c.fn.name else ""
    lines = [f"kernel: {c.cuda.name}{renamed}", f"options: {c.options}",
             f"sizes: {', '.join(f'{k}={v}' for k, v in sorted(c.binding.sizes.items()))}"
             + (f" (dynamic: {', '.join(kernel.dynamic)})" if kernel.dynamic else ""),
             "", "schedule (isl scheduler, before tiling and mapping):" if c.overlap is None
             else f"schedule ({c.overlap.describe()}; the tile band, then each statement's "
                  "loops):",
             schedule_text(c.schedule), "", f"tiled: {tiles}",
             f"blocks: grid {m.grid} on {m.block_bands} band(s)",
             f"threads: block {m.block} on {m.thread_bands} band(s); "
             f"{m.syncs} barrier(s); {m.unrolled} loop(s) unrolled",
             c.promoted.describe(), "", "mapped schedule:",
             schedule_text(c.promoted.schedule)]
    return "\n".join(lines)
