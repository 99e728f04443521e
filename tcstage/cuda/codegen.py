"""CUDA source from a scheduled scop.

isl prints the loops of the mapped schedule tree (`isl_ast` to C), with the block and thread ids
as the parameters `b0..b2`, `t0..t2` bound to `blockIdx` and `threadIdx` at the top of the
kernel; each statement is a macro built from its Func definition's value tree, so the loops and
the statements stay independent of each other. With `MappingOptions()` (no tiling, one thread)
this is the paper's naive kernel: one thread runs the whole schedule in order.

Row-major layout: a read `T(a0, ..., an)` becomes `T[((a0 - min0) * e1 + (a1 - min1)) * e2 + ...]`
with the tensor's inferred extents `e_k`. Integer `/` and `%` keep Halide's (and TC's)
semantics through `tc::div` / `tc::mod`: the remainder is never negative, and x / 0 = x % 0 = 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import attrs
import islpy as isl

from tcstage.errors import TCError, warn
from tcstage.halide.lower import Lowered
from tcstage.halide.solver import Tree, inline_lets
from tcstage.lang.checked import statement_text
from tcstage.lang.types import ScalarType
from tcstage.poly import budget
from tcstage.poly.budget import WorkLimitExceeded, bounded
from tcstage.cuda.reduction import PRELUDE as REDUCTION_PRELUDE
from tcstage.cuda.reduction import reduction_code
from tcstage.cuda.tensorcore import tensor_core_code
from tcstage.poly.tensorcore import MMA
from tcstage.poly.mapping import (BLOCK_IDS, REDUCTION_COMBINE, REDUCTION_INIT, SYNC, THREAD_IDS,
                                  Mapped)
from tcstage.poly.promotion import Promoted, Promotion
from tcstage.poly.scop import Scop

PRELUDE = r"""#include <cstdint>
#include <cstring>

namespace tc {  // (kernels are named tc_<function>, so no kernel clashes with these)
// Integer division and remainder as in Halide and TC (Euclidean): the remainder is never
// negative, so the quotient rounds down for a positive divisor and up for a negative one;
// dividing by zero gives 0, and the most negative value divided by -1 wraps to itself (C's
// division is undefined in both cases, and traps on x86, where the emulator runs).
template <typename T> __device__ __forceinline__ T div(T a, T b) {
  if (b == 0) return 0;
  if (T(-1) < T(0) && b == T(-1)) return T(0ULL - (unsigned long long)a);
  T q = a / b; return a % b < 0 ? (b > 0 ? q - 1 : q + 1) : q;
}
template <typename T> __device__ __forceinline__ T mod(T a, T b) {
  if (b == 0 || (T(-1) < T(0) && b == T(-1))) return 0;
  T r = a % b; return r < 0 ? (b > 0 ? r + b : r - b) : r;
}
// Floating-point remainder as in Halide: a - b * floor(a / b), of the divisor's sign (C's fmod
// takes the dividend's)
__device__ __forceinline__ float fmod(float a, float b) { return a - b * floorf(a / b); }
__device__ __forceinline__ double fmod(double a, double b) { return a - b * ::floor(a / b); }
// min and max for half, which has no overloads of its own, and for mixed integer widths
template <typename T> __device__ __forceinline__ T min(T a, T b) { return b < a ? b : a; }
template <typename T> __device__ __forceinline__ T max(T a, T b) { return a < b ? b : a; }
// C's fmax and fmin for every float type (a NaN operand is ignored): the select chain they
// lower to names each operand twice, so printed as nested text it doubles with every level
template <typename T> __device__ __forceinline__ T fmax_c(T a, T b) {
  return isnan((float)a) ? b : isnan((float)b) ? a : max(a, b);
}
template <typename T> __device__ __forceinline__ T fmin_c(T a, T b) {
  return isnan((float)a) ? b : isnan((float)b) ? a : min(a, b);
}
// |x| behind a call: GCC folds nested fabs calls in time exponential in their depth (24 deep:
// 15 s, even at -O0)
__device__ __forceinline__ float fabs(float x) { return fabsf(x); }
__device__ __forceinline__ double fabs(double x) { return ::fabs(x); }
// Halide's reinterpret: the same bits read as another type of their width
template <typename To, typename From> __device__ __forceinline__ To bits(From x) {
  static_assert(sizeof(To) == sizeof(From), "a reinterpretation keeps the width");
  To y; memcpy(&y, &x, sizeof y); return y;
}
}  // namespace tc
#define floord(n, d) tc::div<decltype((n) + (d))>((n), (d))
"""
# Flat indices and loop values are `int` (faster) unless a tensor or a size is too large for it:
# loop values mix a few iterators and sizes, hence the margin on sizes.
INT_ELEMENTS = 2**31
INT_SIZE = 2**29

_C_TYPES = {"float16": "half", "bfloat16": "__nv_bfloat16", "float32": "float",
            "float64": "double", "bool": "bool",
            **{f"int{b}": f"int{b}_t" for b in (8, 16, 32, 64)},
            **{f"uint{b}": f"uint{b}_t" for b in (8, 16, 32, 64)}}
_BINARY = {"add": "+", "sub": "-", "mul": "*", "eq": "==", "ne": "!=", "lt": "<", "le": "<=",
           "gt": ">", "ge": ">=", "and": "&&", "or": "||"}
# Halide's float math calls are named <fn>_f32 / <fn>_f64.
_MATH = {"exp", "log", "sqrt", "tanh", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
         "cosh", "atan2", "pow", "floor", "ceil", "round", "trunc", "erf"}


_KEYWORDS = """alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t
char16_t char32_t class compl concept const consteval constexpr constinit const_cast continue
co_await co_return co_yield decltype default delete do double dynamic_cast else enum explicit
export extern false float for friend goto if inline int long mutable namespace new noexcept not
not_eq nullptr operator or or_eq private protected public register reinterpret_cast requires
return short signed sizeof static static_assert static_cast struct switch template this
thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
wchar_t while xor xor_eq main""".split()
# Names CUDA, its headers, the emulator's runtime or the generated code declare: a tensor of
# that name would shadow or redefine them.
_LIBRARY = """threadIdx blockIdx blockDim gridDim warpSize half nv_bfloat16 size_t ptrdiff_t
int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t intptr_t uintptr_t std cuda
printf malloc free memcpy memset abort exit assert clock clock64 abs labs llabs min max umin
umax llmin llmax ullmin ullmax floord atomicAdd atomicSub atomicExch atomicMin atomicMax
atomicInc atomicDec atomicCAS atomicAnd atomicOr atomicXor fdividef hexp hlog hsqrt hrsqrt
sincos sincosf""".split()
# lower-case macros of the C library and the compilers (GNU mode defines linux and unix)
_MACROS = """errno stdin stdout stderr math_errhandling linux unix sched_priority""".split()
_MATH_LIBRARY = """acos acosh asin asinh atan atan2 atanh cbrt ceil copysign cos cosh cospi
cyl_bessel_i0 cyl_bessel_i1 erf erfc erfcinv erfcx erfinv exp exp10 exp2 expm1 fabs fdim floor fma
fmax fmin fmod frexp hypot ilogb isfinite isinf isnan j0 j1 jn ldexp lgamma llrint llround log
log10 log1p log2 logb lrint lround modf nan nearbyint nextafter norm norm3d norm4d normcdf
normcdfinv pow rcbrt remainder remquo rhypot rint rnorm rnorm3d rnorm4d round rsqrt scalbln
scalbn signbit sin sinh sinpi sqrt tan tanh tgamma trunc y0 y1 yn""".split()
_RESERVED = frozenset(_KEYWORDS + _LIBRARY + _MACROS + _MATH_LIBRARY
                      + [f + "f" for f in _MATH_LIBRARY])
# generated names (loops c0.., ids b0.. t0.., statements S0.., buffers), CUDA's vector types,
# macros, which headers name in capitals (NULL, NAN, INFINITY, M_PI, INT_MAX) or with a
# capital and an underscore (M_PIf, L_tmpnam), CUDA's runtime (cudaStreamDefault) and
# signal.h's field macros (si_pid, sa_handler), which the emulator includes
_GENERATED = re.compile(r"[bctS]\d+|(shared|private)_\w+|tc_\w*|_\w*"
                        r"|u?(char|short|int|long|longlong)[1-4]|(float|double)[1-4]|dim3|half2"
                        r"|[A-Z][A-Z0-9]*(_[A-Z0-9]+)+|[A-Z][A-Z0-9]{2,}|[A-Z]_\w*"
                        r"|cuda\w*|(sa|si|sigev)_\w+")


POOL = "_shared_pool"  # the shared array overlapped tiles' intermediates live in


def c_name(name: str) -> str:
    """A TC tensor or scalar name as a C identifier: the name itself unless it clashes with
    C++, CUDA or the generated code, else `tc_` + name. (Names starting with `tc_` get the
    prefix too, so that no two names map to one.)"""
    name = re.sub(r"\W", "_", name)
    clash = name in _RESERVED or _GENERATED.fullmatch(name) or name[0].isdigit()
    return f"tc_{name}" if clash else name


def kernel_name(function: str) -> str:
    """The C name of the kernel of a TC function: always `tc_` + its name. The kernel is
    `extern "C"`, and the headers that CUDA and the emulator include declare hundreds of C
    functions (time, index, rand, cudaFree, ...) that any other name could redeclare."""
    return "tc_" + re.sub(r"\W", "_", function)


@attrs.frozen
class Parameter:
    name: str
    c_decl: str  # e.g. 'float* __restrict__ C'
    kind: str  # 'output', 'temp', 'input', 'scalar', 'size' or 'scratch'
    source: str  # tensor, scalar input or TC size symbol it carries (scratch: its name)
    dtype: str  # element type of an array, or the scalar's type
    shape: tuple[int, ...] = ()  # a scratch array's: the runtime allocates it zeroed


@attrs.frozen
class CudaKernel:
    name: str
    source: str
    parameters: tuple[Parameter, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    # the source in parts, for a kernel sequence's one source (module_source): the includes
    # and helpers it needs, each once, and the kernel function with its comment
    prelude: tuple[str, ...] = ()
    function: str = ""


def c_type(t: str | ScalarType) -> str:
    return _C_TYPES[t if isinstance(t, str) else t.name]


def generate(lowered: Lowered, scop: Scop, mapped: Mapped, promoted: Promoted,
             options_text: str = "", read_only_cache: bool = False,
             tensor_tiles: tuple = (), name: str | None = None,
             scratch_prefix: str = "", pool: tuple[dict, int] = ({}, 0)) -> CudaKernel:
    """The CUDA kernel running `promoted.schedule`: a schedule of `scop` mapped to blocks and
    threads (`mapped`), with its promoted array tiles (and contraction tiles on tensor cores,
    poly/tensorcore.py). `name`: the kernel's (default: the function's, `kernel_name`); a
    launch of a kernel sequence has its own, and `scratch_prefix` for its scratch arrays.
    `pool`: (shared buffer -> byte offset, bytes): buffers that live in one shared array, at
    those offsets (overlapped tiles' intermediates, which share bytes where their lifetimes
    do not overlap)."""
    fn = lowered.fn
    index = index_type(scop)
    printer = _ValuePrinter(lowered, scop, promoted.promotions, read_only_cache, index)
    declarations, macros, printer.accumulators, scratch = reduction_code(
        mapped.reductions, mapped.block, printer.element_of, c_type, _float_literal,
        lambda tensor: _elements(scop.tensor_extents[tensor]), scratch_prefix)
    tc_declarations, tc_macros, tc_prelude = tensor_core_code(
        tensor_tiles, scop, printer, c_type, lambda text: _index_text(text, index), _c_of,
        math.prod(mapped.block))
    declarations += tc_declarations
    offsets, pool_bytes = pool
    if offsets:
        # (8-byte words: aligned for every element type; `__align__` on a char array is
        # ignored by the host compiler that runs the emulator)
        declarations.append(f"__shared__ long long {POOL}[{-(-pool_bytes // 8)}];")
    for p in promoted.promotions:
        dims = "".join(f"[{d}]" for d in p.padded) or "[1]"
        space = "__shared__ " if p.memory == "shared" else ""
        if p.buffer in offsets:  # a view of the pool's bytes
            declarations.append(f"{c_type(p.dtype)} (&{p.buffer}){dims} = *reinterpret_cast<"
                                f"{c_type(p.dtype)} (*){dims}>(reinterpret_cast<unsigned char*>"
                                f"({POOL}) + {offsets[p.buffer]});")
            continue
        declarations.append(f"{space}{c_type(p.dtype)} {p.buffer}{dims};")
        for copy, inward in ((p.copy_in, True), (p.copy_out, False)):
            if copy:
                macros.append(f"// {'copy-in to' if inward else 'copy-out from'} {p.memory} "
                              f"memory: {p.tensor}")
                macros.append(printer.copy(copy, p, inward))
    on_tensor_cores = {t.contraction.statement: t.index for t in tensor_tiles}
    for s in scop.statements:
        # (a contraction on tensor cores keeps its loops, empty: its _mma statement runs it)
        body = printer.statement(s) if s.name not in on_tensor_cores else ""
        args = ", ".join(s.iterators)
        tc_statement = fn.statements[s.tc_statement]
        text = statement_text(tc_statement)  # (an inlined one in its function's names)
        # `+=!` makes two statements: the reduction's identity first, then the update
        first_of_two = any(o.tc_statement == s.tc_statement and o.definition > s.definition
                           for o in scop.statements)
        macros.append(f"// {s.name}: {'identity for ' if first_of_two else ''}{text}")
        macros.append(f"#define {s.name}({args}) {body}" if body else f"#define {s.name}({args})")
    ast = _ast(promoted.schedule, mapped.context, fn.name)
    loops = _index_text(ast.to_C_str().rstrip(), index)
    syncs = sorted(set(re.findall(rf"\b({SYNC}\d*)\(\);", loops)))
    extensions = sorted(set(re.findall(
        rf"\b((?:{REDUCTION_INIT}|{REDUCTION_COMBINE}|{MMA})\d+)\(", loops)))
    macros += tc_macros
    macros = [f"#define {b}() __syncthreads()" for b in syncs or [SYNC]] + macros
    params = printer.parameters() + [
        Parameter(a.name, f"{c_type(a.dtype)}* {a.name}", "scratch", a.name,  # (see parameters)
                  a.dtype, a.shape) for a in scratch]
    name = name or kernel_name(fn.name)
    header = ", ".join(p.c_decl for p in params)
    text = fn.span.text() if fn.span is not None else fn.name  # the TC, as a comment
    comment = "\n".join(f"// {line}" for line in text.splitlines() if line.strip())
    if options_text:
        comment += f"\n// options: {options_text}"
    dynamic = [scop.param_sizes[p] for p in _free_params(scop)]
    comment += f"\n// grid {_dim3(mapped.grid)}, block {_dim3(mapped.block)}" if not dynamic else \
        (f"\n// grid at most {_dim3(mapped.grid)} (computed at launch from the dynamic sizes "
         f"{', '.join(dynamic)}), block {_dim3(mapped.block)}")
    ids = [f"const int {b} = blockIdx.{x};" for b, x, g in zip(BLOCK_IDS, "xyz", mapped.grid)
           if g > 1]
    ids += [f"const int {t} = threadIdx.{x};" for t, x, n in zip(THREAD_IDS, "xyz", mapped.block)
            if n > 1]
    body = "\n".join("  " + line for line in ids + declarations + loops.splitlines())
    copies = [n for p in promoted.promotions for n in (p.copy_in, p.copy_out) if n]
    undef = "\n".join(f"#undef {m}" for m in (syncs or [SYNC]) + copies + extensions
                       + [s.name for s in scop.statements])
    threads = math.prod(mapped.block)
    parts = [PRELUDE, REDUCTION_PRELUDE if mapped.reductions else "", tc_prelude]
    if any(t.type.name == "float16" for t in fn.tensors.values()) or "half" in "".join(macros):
        parts.insert(0, "#include <cuda_fp16.h>\n")
    if any(t.type.name == "bfloat16" for t in fn.tensors.values()) \
            or "__nv_bfloat16" in "".join(macros):
        parts.insert(0, "#include <cuda_bf16.h>\n")
    prelude = tuple(p for p in parts if p)
    function = (f"{comment}\nextern \"C\" __global__ void __launch_bounds__({threads}) "
                f"{name}({header}) {{\n" + "\n".join(macros) + "\n" + body + "\n" + undef +
                "\n}\n")
    return CudaKernel(name, "".join(prelude) + "\n" + function, tuple(params), mapped.grid,
                      mapped.block, prelude, function)


def module_source(kernels: Sequence[CudaKernel]) -> str:
    """One CUDA source holding the kernels of a sequence: every prelude part any of them needs,
    once (includes first), then their functions in launch order."""
    parts = list(dict.fromkeys(p for k in kernels for p in k.prelude))
    parts.sort(key=lambda p: not p.startswith("#include"))  # (a stable sort: order kept)
    return "".join(parts) + "\n" + "\n".join(k.function for k in kernels)


def _elements(extent: isl.Set) -> int | None:
    """The number of elements of a tensor (None where a size is not fixed)."""
    n = 1
    for k in range(extent.dim(isl.dim_type.set)):
        lo, hi = extent.dim_min_val(k), extent.dim_max_val(k)
        if not (lo.is_int() and hi.is_int()):
            return None
        n *= max(hi.to_python() - lo.to_python() + 1, 0)
    return int(n)


def _ast(schedule: isl.Schedule, context: isl.Set, function: str) -> isl.AstNode:
    """isl's AST of the schedule, within a budget. Past it (many statements under one band:
    isl compares their domains pairwise to give each its own loops, a minute for 60 under
    thread mapping), again with coscheduled instances grouped in one loop nest, which skips
    that; the code may then test more conditions inside loops."""
    ctx = isl.DEFAULT_CONTEXT
    try:
        with bounded(budget.AST, "isl's code generation"):
            return _ast_node(schedule, context)
    except WorkLimitExceeded as exceeded:
        warn(f"in '{function}', {exceeded.message}: it groups statement instances that run at "
             "the same point of the schedule instead")
    ctx.set_ast_build_group_coscheduled(1)
    try:
        with bounded(budget.GROUPED_AST, "isl's code generation"):
            return _ast_node(schedule, context)
    finally:
        ctx.set_ast_build_group_coscheduled(0)


def _ast_node(schedule: isl.Schedule, context: isl.Set) -> isl.AstNode:
    """isl's AST; where isl's coalescing fails an internal check ("original tableau does not
    correspond to original basic map", Halide fuzz seed 952043), again without the bounded
    wrapping that coalescing step tries (the code may test a few more conditions)."""
    try:
        return isl.AstBuild.from_context(context).node_from_schedule(schedule)
    except isl.Error as e:
        if "tableau" not in str(e):
            raise
    ctx = isl.DEFAULT_CONTEXT
    before = ctx.get_coalesce_bounded_wrapping()
    ctx.set_coalesce_bounded_wrapping(0)
    try:
        return isl.AstBuild.from_context(context).node_from_schedule(schedule)
    finally:
        ctx.set_coalesce_bounded_wrapping(before)


def index_type(scop: Scop) -> str:
    """The C type of sizes, loop values and flat indices: `int` where every tensor has fewer
    than INT_ELEMENTS elements and every size is below INT_SIZE, else `int64_t`.

    A size left free (a dynamic size) has no upper bound, so a tensor it shapes may reach
    INT_ELEMENTS at some call: such kernels always index in 64 bits. (A bound on the dynamic
    sizes would allow `int`; the launch would then have to check it. Not done: the 64-bit
    arithmetic costs a few registers, a wrong index costs a wrong result.)"""
    context = scop.context
    if _free_params(scop):
        return "int64_t"
    sizes = [context.plain_get_val_if_fixed(isl.dim_type.param, k)
             for k in range(context.dim(isl.dim_type.param))]
    if not all(v.is_int() for v in sizes) or any(v.to_python() >= INT_SIZE for v in sizes):
        return "int64_t"
    for extent in scop.tensor_extents.values():
        elements = _elements(extent)
        if elements is None or elements >= INT_ELEMENTS:
            return "int64_t"
    return "int"


def _free_params(scop: Scop) -> list[str]:
    """The scop's parameters that its context leaves free (dynamic sizes), in order."""
    context = scop.context
    free = {context.get_dim_name(isl.dim_type.param, k)
            for k in range(context.dim(isl.dim_type.param))
            if not context.plain_get_val_if_fixed(isl.dim_type.param, k).is_int()}
    return [p for p in scop.params if p in free]


def _index_text(text: str, index: str) -> str:
    """isl's C text (loops, tile offsets) with `index` loop variables and integer min/max
    (CUDA has no min(int, int64_t))."""
    if index == "int":
        return text
    text = re.sub(r"\bfor \(int ", f"for ({index} ", text)
    return re.sub(r"\b(min|max)\(", rf"tc::\1<{index}>(", text)


def _dim3(d) -> str:
    return "(" + ", ".join(str(v) for v in d) + ")"


class _ValuePrinter:
    """Prints statement bodies: Halide value trees as typed C expressions."""

    def __init__(self, lowered: Lowered, scop: Scop, promotions=(), read_only_cache=False,
                 index: str = "int"):
        self.lowered, self.scop, self.fn = lowered, scop, lowered.fn
        self.index = index  # C type of sizes and flat indices
        self.index_dtype = "int32" if index == "int" else "int64"  # of loop values and sizes
        self.promoted = {ref: p for p in promotions for ref in p.references}
        self.statement_iterators = {s.name: s.iterators for s in scop.statements}
        self.tc_statement = {s.name: s.tc_statement for s in scop.statements}
        self.current: str | None = None  # the statement being printed
        self._offsets: dict[tuple[str, str], list[str]] = {}  # (statement, buffer) -> C text
        self.read_only = {t.name for t in self.fn.inputs if t.rank and t.type.name != "bool"} \
            if read_only_cache else set()
        self.halide_names = lowered.halide_names()
        params = {t: p for p, t in scop.param_sizes.items()}  # TC size -> isl (and C) name
        self.size_names = {h: params.get(t, t) for h, t in lowered.size_symbols().items()}
        self.size_names.update(params)
        self.iterators = {s.name: dict(zip(s.halide_iterators, s.iterators))
                          for s in scop.statements}
        self.scalars = {t.name: t for t in self.fn.inputs if t.rank == 0}
        # statement -> (tensor, C variable): a parallel reduction's per-thread accumulator,
        # which stands for every access the statement makes to the tensor it reduces into
        self.accumulators: dict[str, tuple[str, str]] = {}

    def c(self, name: str) -> str:
        return c_name(name)

    # -- the kernel's parameters -------------------------------------------------------------
    def parameters(self) -> list[Parameter]:
        """The kernel's parameters. Only the inputs, which no thread writes, are `__restrict__`:
        a restricted pointer that one thread writes and another reads after a barrier lets
        nvcc keep a value loaded before the barrier (alias analysis decides the barrier cannot
        write through it). On an H200 the softmax's threads kept Mx(n) = -inf from before the
        block's max was stored, and E came out inf everywhere; the emulator cannot see this."""
        fn, out = self.fn, []
        for name in fn.outputs:
            t = fn.tensors[name]
            out.append(Parameter(name, f"{c_type(t.type)}* {self.c(name)}", "output", name,
                                 t.type.name))
        for name, t in fn.tensors.items():
            if t.kind == "temp":
                out.append(Parameter(name, f"{c_type(t.type)}* {self.c(name)}", "temp", name,
                                     t.type.name))
        for t in fn.inputs:
            if t.rank:
                out.append(Parameter(t.name, f"const {c_type(t.type)}* __restrict__ {self.c(t.name)}",
                                     "input", t.name, t.type.name))
            else:
                out.append(Parameter(t.name, f"{c_type(t.type)} {self.c(t.name)}", "scalar", t.name,
                                     t.type.name))
        for p, size in self.scop.param_sizes.items():
            out.append(Parameter(p, f"{self.index} {p}", "size", size, self.index_dtype))
        return out

    # -- statements ------------------------------------------------------------------------------
    def statement(self, s) -> str:
        tensor = self.fn.tensors[s.tensor]
        value = s.value
        if tensor.inout and value[0] == "read" and self.halide_names.get(value[1]) == s.tensor:
            return ""  # `C = C_in`: the kernel updates the caller's C in place
        local = {h: f"({v})" for h, v in self.iterators[s.name].items()}  # macro arguments
        self.current = s.name
        try:
            target = self.element(s.tensor, s.lhs, local, write=True)
            text = f"{target} = {self.expr(value, local)[0]};"
        except TCError as e:
            raise TCError(f"{e.message}, in the definition of {s.tensor} ({s.name})") from None
        self.current = None
        return text

    def copy(self, name: str, p: Promotion, inward: bool) -> str:
        """The macro of a copy statement `name(prefix..., element...)` between global memory
        and p's buffer."""
        rank = len(p.sizes)
        args = [f"_{k}" for k in range(p.prefix_dims + rank)]
        element = args[p.prefix_dims:]
        local = {a: f"({a})" for a in element}
        subscripts = [("var", a) for a in element]
        if p.gather is not None:  # the buffer's dimensions index the index tensors
            subscripts = p.gather.tensor_subscripts(subscripts)
        halide_args = tuple(reversed(subscripts))
        outside = self.element(p.tensor, halide_args, local, write=not inward, promoted=False)
        offsets = [_index_text(_c_of(o, args[:p.prefix_dims]), self.index)
                   for o in p.copy_offsets]
        inside = _buffer_element(p, [f"({a})" for a in element], offsets)
        target, source = (inside, outside) if inward else (outside, inside)
        return f"#define {name}({', '.join(args)}) {target} = {source};"

    def element(self, tensor: str, halide_args: tuple, local, write=False, promoted=True) -> str:
        """`T[flat]` for a read or write with Halide-ordered subscripts (or the promoted
        buffer's element)."""
        bounds = self.lowered.ranges.tensors[tensor]
        args = list(reversed(halide_args))
        if self.current in self.accumulators and self.accumulators[self.current][0] == tensor:
            return self.accumulators[self.current][1]
        if promoted and self.current is not None:
            text = self.lowered.reference_text(self.tc_statement[self.current], tensor, args)
            p = self.promoted.get((self.current, text))
            if p is not None:
                if p.gather is not None:
                    args = p.gather.buffer_subscripts(args)
                return _buffer_element(p, [self.expr(a, local)[0] for a in args],
                                       self._tile_offsets(p))
        if not args:
            return self._global(tensor, "0", write)
        flat = None
        for a, lo, extent in zip(args, bounds.mins, bounds.extents):
            index = self.expr(a, local)[0]
            lo_text = self.size_expr(lo)
            term = index if lo_text == "0" else f"({index} - {lo_text})"
            if flat is None and self.index != "int":  # the products that follow in 64 bits
                term = f"(({self.index})({term}))"
            flat = term if flat is None else \
                f"{_parenthesized(flat)} * {_parenthesized(self.size_expr(extent))} + {term}"
        return self._global(tensor, flat, write)

    def element_of(self, tensor: str, element: isl.PwMultiAff, names) -> str:
        """The global element of tensor that `element` gives as a function of C values named
        `names` (a reduction's combine, outside every statement)."""
        local = {f"_e{d}": f"({_index_text(_c_of(element.get_pw_aff(d), names), self.index)})"
                 for d in range(element.dim(isl.dim_type.out))}
        current, self.current = self.current, None
        try:
            return self.element(tensor, tuple(reversed([("var", v) for v in local])), local,
                                write=True, promoted=False)
        finally:
            self.current = current

    def element_at(self, statement: str, access, local, write: bool) -> str:
        """An element statement reads or writes (access: ("lhs", its Halide arguments) or
        ("read", Access)) at the C values `local` gives its Halide iterators, promoted or not,
        never through __ldg (the caller takes its address)."""
        kind, what = access
        tensor = next(s.tensor for s in self.scop.statements if s.name == statement) \
            if kind == "lhs" else what.tensor
        args = what if kind == "lhs" else tuple(reversed(what.subscripts))
        saved = self.current, self.read_only
        self.current, self.read_only = statement, set()
        try:
            return self.element(tensor, args, local, write=write)
        finally:
            self.current, self.read_only = saved

    def _tile_offsets(self, p: Promotion) -> list[str]:
        """The offsets of p's tile in the current statement, printed once per statement."""
        key = (self.current, p.buffer)
        if key not in self._offsets:
            names = self.statement_iterators[self.current]
            self._offsets[key] = [_index_text(_c_of(o, names), self.index)
                                  for o in p.offsets[self.current]]
        return self._offsets[key]

    def _global(self, tensor: str, flat: str, write: bool) -> str:
        if not write and tensor in self.read_only:  # through the read-only data cache
            return f"__ldg(&{self.c(tensor)}[{flat}])"
        return f"{self.c(tensor)}[{flat}]"

    def size_expr(self, tree: Tree) -> str:
        """A size expression (over TC size symbols) as C."""
        return self.expr(tree, {})[0]

    # -- typed expressions -----------------------------------------------------------------------
    def expr(self, t: Tree, local: Mapping[str, str]) -> tuple[str, str]:
        """(C text, type name)."""
        tag = t[0]
        if tag == "int":
            if isinstance(t[1], bool):
                return ("true" if t[1] else "false"), "bool"
            # (C reads -2147483648 as the negation of a long: write int32's least value so)
            return ("(-2147483647 - 1)" if int(t[1]) == -2 ** 31 else str(int(t[1]))), "int32"
        if tag == "float":
            return _float_literal(t[1], "float32"), "float32"
        if tag == "var":
            name = t[1]
            if name in local:
                return local[name], self.index_dtype
            if name in self.size_names:
                return self.size_names[name], self.index_dtype
            if name in self.scalars:
                return self.c(name), self.scalars[name].type.name
            raise TCError(f"the CUDA printer met an unknown variable '{name}'")
        if tag == "cast":
            ty = t[1]
            if t[2][0] in ("int", "float"):  # a typed constant
                v = t[2][1]
                return (_float_literal(v, ty) if _is_float(ty)
                        else f"(({c_type(ty)}){int(v)}{'ULL' if ty.startswith('uint') else 'LL'})"), ty
            pow_ = t[2]  # halide/exprs.py's float pow through double: CUDA's powf is right
            if ty == "float32" and pow_[0] == "call" and pow_[1] == "pow_f64" and all(
                    a[0] == "cast" and a[1] == "float64" for a in pow_[2]):
                (x, tx), (y, ty_) = (self.expr(a[2], local) for a in pow_[2])
                if tx == ty_ == "float32":
                    return f"powf({x}, {y})", ty
            inner, ti = self.expr(t[2], local)
            return _cast(inner, ti, ty), ty
        if tag == "read":
            tensor = self.halide_names.get(t[1])
            if tensor is None:
                raise TCError(f"the CUDA printer met a read of unknown '{t[1]}'")
            return self.element(tensor, t[2], local), self.fn.tensors[tensor].type.name
        if tag in _BINARY:
            (a, ta), (b, tb) = self.expr(t[1], local), self.expr(t[2], local)
            ty = "bool" if tag in ("eq", "ne", "lt", "le", "gt", "ge", "and", "or") else \
                _common(ta, tb)
            if ty in _NARROW_INTS and tag in ("add", "sub", "mul"):
                # C computes 8- and 16-bit integers in int; Halide wraps them in their type,
                # so a sum a comparison or min/max reads must be wrapped first (in unsigned
                # arithmetic: a 16-bit product can pass int's range)
                return f"(({c_type(ty)})((uint32_t)({a}) {_BINARY[tag]} (uint32_t)({b})))", ty
            return f"({a} {_BINARY[tag]} {b})", ty
        if tag in ("div", "mod"):
            (a, ta), (b, tb) = self.expr(t[1], local), self.expr(t[2], local)
            ta = _common(ta, tb)
            if _is_float(ta):
                if tag == "div":
                    return f"({a} / {b})", ta
                if ta in _NARROW:
                    return f"(({c_type(ta)})tc::fmod((float)({a}), (float)({b})))", ta
                return f"tc::fmod({a}, {b})", ta
            return f"tc::{tag}<{c_type(ta)}>({a}, {b})", ta
        if tag in ("min", "max"):
            (a, ta), (b, tb) = self.expr(t[1], local), self.expr(t[2], local)
            if ta == tb and ta not in _NARROW:
                return f"{tag}({a}, {b})", ta
            ty = _common(ta, tb)  # (CUDA has no min(half, half), nor min(int, int64_t))
            return f"tc::{tag}<{c_type(ty)}>({a}, {b})", ty
        if tag == "not":
            return f"(!{self.expr(t[1], local)[0]})", "bool"
        if tag == "select":
            extremum = _c_extremum(t)
            if extremum is not None:
                kind, a, b = extremum
                (a, ta), (b, tb) = self.expr(a, local), self.expr(b, local)
                ty = _common(ta, tb)
                return f"tc::f{kind}_c<{c_type(ty)}>({a}, {b})", ty
            guarded = _guarded_call(t)
            if guarded is not None:
                return self.expr(guarded, local)
            c = self.expr(t[1], local)[0]
            (a, ta), (b, _) = self.expr(t[2], local), self.expr(t[3], local)
            return f"({c} ? {a} : {b})", ta
        if tag == "call":
            return self.call(t[1], [self.expr(a, local) for a in t[2]])
        if tag == "let":  # C has no let-expression (scop extraction inlines them already)
            return self.expr(inline_lets(t), local)
        raise TCError(f"the CUDA printer cannot print a '{tag}' node")

    def call(self, name: str, args: list[tuple[str, str]]) -> tuple[str, str]:
        base, _, suffix = name.rpartition("_")
        types = {"f16": "float16", "f32": "float32", "f64": "float64"}
        if base in _MATH and suffix in types:
            return _math(base, [a for a, _ in args], types[suffix])
        if name == "erf":  # (double erf: a call of the C library's function, exprs._erf)
            text, ty = args[0]
            return _math("erf", [text], ty)
        if base == "is_nan" and suffix in types:
            text, ty = args[0]
            return f"isnan({'(float)' if ty in _NARROW else ''}({text}))", "bool"
        if name in _STRICT:  # strict_float's IEEE operations: rounded each, never fused
            return _strict(name, *args)
        if name == "round":  # Halide rounds halfway cases to even, as rint does
            return _math("rint", [args[0][0]], args[0][1])
        if name == "abs":
            text, ty = args[0]
            return _math("fabs", [text], ty) if _is_float(ty) else (f"abs({text})", ty)
        if name.startswith("reinterpret_") and name[len("reinterpret_"):] in _C_TYPES:
            to = name[len("reinterpret_"):]
            return f"tc::bits<{c_type(to)}>({args[0][0]})", to
        if name in ("likely", "likely_if_innermost", "promise_clamped", "unsafe_promise_clamped"):
            return args[0]
        if name in _BITWISE:  # (C promotes narrow integers to int: cast back)
            texts, ty = [a for a, _ in args], args[0][1]
            ops = _LOGICAL if ty == "bool" else _BITWISE  # ~true is -2 in C, true in Halide
            text = f"({ops[name]}{texts[0]})" if name == "bitwise_not" else \
                f"({texts[0]} {ops[name]} {texts[1]})"
            return f"(({c_type(ty)}){text})", ty
        if name in ("shift_left", "shift_right"):
            return _shift(name, *args)
        if name == "absd":  # |a - b| in the unsigned type of a's width (float: a float)
            (a, ty), (b, _) = args
            if _is_float(ty):
                return _math("fabs", [f"({a} - {b})"], ty)
            u = "u" + ty.lstrip("u")
            return f"({a} < {b} ? ({c_type(u)})(({c_type(u)})({b}) - ({c_type(u)})({a})) : " \
                   f"({c_type(u)})(({c_type(u)})({a}) - ({c_type(u)})({b})))", u
        if name == "lerp" and _is_float(args[0][1]) and _is_float(args[2][1]):
            (a, ty), (b, _), (w, _) = args  # Halide's float lerp: a * (1 - w) + b * w
            return f"({a} * (({c_type(ty)})1 - ({c_type(ty)})({w})) + {b} * " \
                   f"({c_type(ty)})({w}))", ty
        raise TCError(f"the CUDA back end does not support Halide's '{name}' "
                      f"({', '.join(t for _, t in args)}) yet")


def _c_extremum(t: Tree) -> tuple[str, Tree, Tree] | None:
    """("max" or "min", a, b) where t is C's fmax or fmin of floats a and b as halide/exprs.py
    lowers it: select(is_nan(a), b, select(is_nan(b), a, max(a, b))), each operand one node
    (a let bound it, inline_lets shared it), so the tests are `is`, not walks of a DAG."""
    def same(x, y):  # (`is` first: a bound operand is one object wherever it is used)
        return x is y or x == y

    def nan_test(c, x):
        return c[0] == "call" and c[1].startswith("is_nan_") and same(c[2][0], x)
    inner = t[3]
    if inner[0] != "select" or inner[3][0] not in ("max", "min"):
        return None
    a, b = inner[2], t[2]
    if not (same(inner[3][1], a) and same(inner[3][2], b) and nan_test(inner[1], b)
            and nan_test(t[1], a)):
        return None
    return inner[3][0], a, b


def _guarded_call(t: Tree) -> Tree | None:
    """X of select(is_nan(a), a, select(c, K, X)), halide/exprs.py's guard of Halide's float
    polynomials at NaN and infinity (X computes fn(a)): CUDA's own functions are right there,
    and printed whole, `a` would be printed three times a level."""
    inner = t[3]
    if not (t[1][0] == "call" and t[1][1].startswith("is_nan_") and inner[0] == "select"
            and inner[2][0] in ("float", "cast") and t[1][2][0] == t[2]):
        return None
    return inner[3]


_BITWISE = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^", "bitwise_not": "~"}
# Halide's strict_float intrinsics (is_nan and strict_float() make them; apps/resize uses the
# latter): arithmetic through CUDA's _rn functions, which nvcc never contracts into an fma
_STRICT = {"strict_add": "add", "strict_sub": "sub", "strict_mul": "mul", "strict_div": "div",
           "strict_min": "min", "strict_max": "max", "strict_lt": "<", "strict_le": "<=",
           "strict_eq": "=="}


def _strict(name: str, a: tuple[str, str], b: tuple[str, str]) -> tuple[str, str]:
    (x, tx), (y, ty) = a, b
    t = _common(tx, ty)
    op = _STRICT[name]
    if op in ("<", "<=", "=="):
        return f"({x} {op} {y})", "bool"
    if op in ("min", "max"):
        return f"tc::{op}<{c_type(t)}>({x}, {y})", t
    if t == "float64":
        return f"__d{op}_rn({x}, {y})", t
    if t == "float32":
        return f"__f{op}_rn({x}, {y})", t
    return f"(({c_type(t)})__f{op}_rn((float)({x}), (float)({y})))", t  # half, bfloat16


_LOGICAL = {"bitwise_and": "&&", "bitwise_or": "||", "bitwise_xor": "!=", "bitwise_not": "!"}


def _shift(name: str, a: tuple[str, str], b: tuple[str, str]) -> tuple[str, str]:
    """Halide's shifts: a negative signed amount shifts the other way; a left shift wraps
    (done in the unsigned type, where C defines it)."""
    (x, ty), (k, tk) = a, b
    u = c_type("u" + ty.lstrip("u")) if not _is_float(ty) else c_type(ty)

    def left(n):
        return f"(({c_type(ty)})(({u})({x}) << ({n})))"

    def right(n):
        return f"(({c_type(ty)})({x} >> ({n})))"

    first, other = (left, right) if name == "shift_left" else (right, left)
    if tk.startswith("uint"):
        return first(k), ty
    return f"(({k}) >= 0 ? {first(k)} : {other(f'-({k})')})", ty


def _math(fn: str, args: list[str], ty: str) -> tuple[str, str]:
    """A call of the C math function fn on values of type ty: `expf` for float32, `exp` for
    float64, and through float32 for half and bfloat16, which CUDA's math library does not
    take."""
    if fn == "fabs":  # (overloaded for float and double)
        return _math_call("tc::fabs", "tc::fabs", args, ty)
    return _math_call(f"{fn}f", fn, args, ty)


def _math_call(single: str, double: str, args: list[str], ty: str) -> tuple[str, str]:
    if ty in _NARROW:
        return f"(({c_type(ty)}){single}({', '.join(f'(float)({a})' for a in args)}))", ty
    return f"{single if ty == 'float32' else double}({', '.join(args)})", ty


# half and bfloat16: converted through float (their conversions among themselves and to other
# types are ambiguous or missing in cuda_fp16.h / cuda_bf16.h), which is also how Halide's CPU
# code converts them, so both back ends round alike.
_NARROW = ("float16", "bfloat16")
_NARROW_INTS = ("int8", "int16", "uint8", "uint16")


def _is_float(ty: str) -> bool:
    return ty.startswith(("float", "bfloat"))


def _cast(text: str, source: str, to: str) -> str:
    if source != to and (source in _NARROW or to in _NARROW) and "float32" not in (source, to):
        text = f"(float)({text})"
    return f"(({c_type(to)})({text}))"


def _common(ta: str, tb: str) -> str:
    """The type of an integer operation on the two: Halide gives both operands one type, but
    loop values and sizes (int64 in a kernel with 64-bit indices) meet int32 constants."""
    return "int64" if "int64" in (ta, tb) and ta.startswith("int") and tb.startswith("int") \
        else ta


def _buffer_element(p: Promotion, subscripts, offsets) -> str:
    """buffer[(s0 - o0) / k0][s1 - o1]..., the tile-relative element of a promoted tensor (k:
    the tile's strides, which divide the distances exactly)."""
    if not subscripts:
        return f"{p.buffer}[0]"
    out = []
    for s, o, k in zip(subscripts, offsets, p.strides):
        index = f"{s} - {_parenthesized(o)}" if o != "0" else s
        out.append(f"[({index}) / {k}]" if k > 1 else f"[{index}]")
    return p.buffer + "".join(out)


def _c_of(pa: isl.PwAff, names) -> str:
    """A piecewise quasi-affine function of a statement's (or copy's) instance as C, its
    variables named `names` (macro arguments, parenthesized in the text)."""
    n_in = pa.dim(isl.dim_type.in_)
    first = pa.dim(isl.dim_type.param)
    pa = pa.move_dims(isl.dim_type.param, first, isl.dim_type.in_, 0, n_in)
    for k, name in enumerate(names):
        pa = pa.set_dim_id(isl.dim_type.param, first + k, isl.Id(name))
    text = isl.AstBuild.from_context(pa.domain()).expr_from_pw_aff(pa).to_C_str()
    if not names:
        return text
    return re.sub(r"\b(" + "|".join(map(re.escape, names)) + r")\b", r"(\1)", text)


def _parenthesized(text: str) -> str:
    """text in parentheses, unless it is a name, a number or one parenthesized group."""
    if re.fullmatch(r"\w+", text):
        return text
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and i < len(text) - 1 or i == 0 and ch != "(":
            return f"({text})"
    return text


def _float_literal(value: float, ty: str) -> str:
    text = repr(float(value))
    if text in ("inf", "-inf", "nan"):
        macro = {"inf": "INFINITY", "-inf": "(-INFINITY)", "nan": "NAN"}[text]
        return macro if ty not in _NARROW else f"(({c_type(ty)}){macro})"
    if "e" not in text and "." not in text:
        text += ".0"
    return {"float32": f"{text}f", "float64": text}.get(ty, f"(({c_type(ty)}){text}f)")

