"""Small half / bfloat16 contractions and reductions on the CUDA path (emulated), against float64
numpy with an error bound derived per kernel: `check(seed)` is deterministic.

Each case picks a kernel shape (tmm, nn and tn matmuls, tbmm, matmul with a bias, an in/out
`+=`, a 1-d convolution, row and full sums, means, sums of squares, row max, softmax, and a
half x bfloat16 mix), awkward sizes (1, 7, 16, 17, 33, ...), inputs drawn from a normal
distribution and rounded to the narrow type, and random MappingOptions that switch tensor cores
on most of the time (half of them shaped for tensor cores: tiles of multiples of 8 and 16, whole
warps). The kernel runs under emulation (and on the CPU, once) and is compared with float64.

Error bounds (u: the unit roundoff of the output type, 2^-11 for half, 2^-8 for bfloat16;
e = 2^-24, float32's): the inputs are exact in float32 and so is each product of two of them
(11 + 11 significant bits for half, 8 + 8 for bfloat16), so a sum of n such terms accumulated in
float32 in any order (threads, blocks, tensor-core fragments) errs by at most n e sum|terms|,
and the one rounding into the output type adds u |exact|. Each further narrow operation (adding
a bias, softmax's subtraction, exp and division) adds u of its own result. Bounds are doubled
for safety, and below the least normal value each rounding may err by half the subnormal step
instead (8 steps are allowed). Max and min round nothing and are compared exactly. Now and
then a case is defined with `narrow_accumulation=True`: its sums accumulate in the narrow type,
each product and partial sum rounded, and e becomes u in the bound.
"""

from __future__ import annotations

import random
import traceback
import warnings

import attrs
import ml_dtypes
import numpy as np

import tcstage as tc

from . import mapping

TYPES = {"half": (np.float16, 2.0**-11), "bfloat16": (ml_dtypes.bfloat16, 2.0**-8)}
EPS32 = 2.0**-24
SIZES = (1, 2, 7, 8, 16, 17, 32, 33, 48, 64)
LONG = (100, 257, 1000, 3000)  # a reduced size now and then (Kernel.long)
MAX_WORK = 60_000  # multiply-adds per kernel: emulation stays well under a second


@attrs.frozen
class Kernel:
    name: str
    source: str  # T stands for the narrow type
    sizes: tuple  # size names, in the order `make` takes them
    make: object  # (rng, dtype, sizes) -> inputs (and the in/out start, if any)
    reference: object  # (inputs as float64, sizes) -> [(exact, bound or None for exact)]
    inout: bool = False
    batch: tuple = ()  # loops (in tile order) that tensor cores need tiled by 1
    long: tuple = ()  # reduced sizes that may be long (blocks split a reduction only then)


def _normal(rng, dtype, *shape):
    return rng.standard_normal(shape).astype(dtype)


def _contraction(exact, absolute, n, u, acc):
    """A sum of n products accumulated with unit roundoff acc (float32's, or the narrow type's
    with narrow_accumulation, where each product is rounded too), rounded to the output type."""
    return exact, 2 * (u * np.abs(exact) + (n + 1) * acc * absolute)


def _tmm(x, s, u, acc):
    a, b = x
    return [_contraction(a @ b.T, np.abs(a) @ np.abs(b).T, s["K"], u, acc)]


def _nn(x, s, u, acc):
    a, b = x
    return [_contraction(a @ b, np.abs(a) @ np.abs(b), s["K"], u, acc)]


def _tn(x, s, u, acc):
    a, b = x
    return [_contraction(a.T @ b, np.abs(a).T @ np.abs(b), s["K"], u, acc)]


def _tbmm(x, s, u, acc):
    a, b = x
    return [_contraction(np.einsum("bnm,bkm->bnk", a, b),
                         np.einsum("bnm,bkm->bnk", np.abs(a), np.abs(b)), s["M"], u, acc)]


def _bias(x, s, u, acc):
    i, w, b = x
    total = i @ w.T
    exact = total + b
    # the sum rounded to T, then the bias added in T: a second rounding of the result
    bound = 2 * (u * (np.abs(total) + np.abs(exact)) + (s["M"] + 1) * acc * (np.abs(i) @ np.abs(w).T))
    return [(exact, bound)]


def _inout(x, s, u, acc):
    a, b, c = x
    exact = c + a @ b.T
    # C is copied into the float32 accumulator, the products added, the total rounded once
    return [(exact, 2 * (u * np.abs(exact)
                         + (s["K"] + 2) * acc * (np.abs(c) + np.abs(a) @ np.abs(b).T)))]


def _conv1d(x, s, u, acc):
    i, w = x
    out = s["W"] - s["KW"] + 1
    exact = np.zeros((s["N"], s["F"], out))
    absolute = np.zeros_like(exact)
    for kw in range(s["KW"]):
        window = i[:, :, kw:kw + out]
        exact += np.einsum("ncw,fc->nfw", window, w[:, :, kw])
        absolute += np.einsum("ncw,fc->nfw", np.abs(window), np.abs(w[:, :, kw]))
    return [_contraction(exact, absolute, s["C"] * s["KW"], u, acc)]


def _row_sum(x, s, u, acc):
    (a,) = x
    return [_contraction(a.sum(1), np.abs(a).sum(1), s["C"], u, acc)]


def _full_sum(x, s, u, acc):
    (a,) = x
    return [_contraction(np.array(a.sum()), np.array(np.abs(a).sum()), s["N"], u, acc)]


def _mean(x, s, u, acc):
    (a,) = x
    # each term a / C is computed in float32 (one more rounding of each term)
    return [_contraction(a.sum(1) / s["C"], 2 * np.abs(a).sum(1) / s["C"], s["C"], u, acc)]


def _squares(x, s, u, acc):
    (a,) = x
    return [_contraction((a * a).sum(1), (a * a).sum(1), s["C"], u, acc)]


def _row_max(x, s, u, acc):
    (a,) = x
    return [(a.max(1), None)]


def _softmax(x, s, u, acc):
    (a,) = x
    mx = a.max(1, keepdims=True)
    e = np.exp(a - mx)
    total = e.sum(1, keepdims=True)
    # E: X - Mx rounded (its error grows by |X - Mx| through exp), exp rounded: (|d| + 1) u;
    # S: float32 sum of E, rounded: (|d|max + 2) u relative; Y = E / S rounded: one more u
    d = np.abs(a - mx)
    e_bound = 2 * (d + 2) * u * e
    s_bound = 2 * ((d.max(1, keepdims=True) + 3) * u + (s["C"] + 1) * acc) * total
    y = e / total
    y_bound = 2 * (d + d.max(1, keepdims=True) + 6) * u * y
    return [(mx[:, 0], None), (e, e_bound), (total[:, 0], s_bound[:, 0]), (y, y_bound)]


def _mixed(x, s, u, acc):
    a, b = x
    # half x bfloat16 gives float32: products exact in float32, sums rounded in float32
    exact = a @ b.T
    return [(exact, 2 * (s["K"] + 1) * EPS32 * (np.abs(a) @ np.abs(b).T) + 1e-30)]


KERNELS = (
    Kernel("tmm", "def tmm(T(M, K) A, T(N, K) B) -> (C) { C(m, n) +=! A(m, k) * B(n, k) }",
           ("M", "N", "K"), lambda r, t, s: (_normal(r, t, s["M"], s["K"]),
                                             _normal(r, t, s["N"], s["K"])), _tmm),
    Kernel("nn", "def nn(T(M, K) A, T(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
           ("M", "N", "K"), lambda r, t, s: (_normal(r, t, s["M"], s["K"]),
                                             _normal(r, t, s["K"], s["N"])), _nn),
    Kernel("tn", "def tn(T(K, M) A, T(K, N) B) -> (C) { C(m, n) +=! A(k, m) * B(k, n) }",
           ("M", "N", "K"), lambda r, t, s: (_normal(r, t, s["K"], s["M"]),
                                             _normal(r, t, s["K"], s["N"])), _tn),
    Kernel("tbmm", "def tbmm(T(B, N, M) X, T(B, K, M) Y) -> (Z) "
           "{ Z(b, n, k) +=! X(b, n, m) * Y(b, k, m) }",
           ("B", "N", "K", "M"), lambda r, t, s: (_normal(r, t, s["B"], s["N"], s["M"]),
                                                  _normal(r, t, s["B"], s["K"], s["M"])), _tbmm, batch=(0,)),
    Kernel("bias", "def bias(T(B, M) I, T(N, M) W, T(N) B1) -> (O) {\n"
           "  O(b, n) +=! I(b, m) * W(n, m)\n  O(b, n) = O(b, n) + B1(n)\n}",
           ("B", "N", "M"), lambda r, t, s: (_normal(r, t, s["B"], s["M"]),
                                             _normal(r, t, s["N"], s["M"]),
                                             _normal(r, t, s["N"])), _bias),
    Kernel("inout", "def inout(T(M, K) A, T(N, K) B) -> (C) { C(m, n) += A(m, k) * B(n, k) }",
           ("M", "N", "K"), lambda r, t, s: (_normal(r, t, s["M"], s["K"]),
                                             _normal(r, t, s["N"], s["K"]),
                                             _normal(r, t, s["M"], s["N"])), _inout, inout=True),
    Kernel("conv1d", "def conv1d(T(N, C, W) I, T(F, C, KW) Wt) -> (O) "
           "{ O(n, f, w) +=! I(n, c, w + kw) * Wt(f, c, kw) }",
           ("N", "F", "C", "W", "KW"), lambda r, t, s: (_normal(r, t, s["N"], s["C"], s["W"]),
                                                        _normal(r, t, s["F"], s["C"], s["KW"])),
           _conv1d, batch=(0,)),
    Kernel("row_sum", "def row_sum(T(R, C) A) -> (O) { O(r) +=! A(r, c) }",
           ("R", "C"), lambda r, t, s: (_normal(r, t, s["R"], s["C"]),), _row_sum, long=("C",)),
    Kernel("full_sum", "def full_sum(T(N) A) -> (O) { O() +=! A(i) }",
           ("N",), lambda r, t, s: (_normal(r, t, s["N"]),), _full_sum, long=("N",)),
    Kernel("mean", "def mean(T(R, C) A) -> (O) { O(r) +=! A(r, c) / C }",
           ("R", "C"), lambda r, t, s: (_normal(r, t, s["R"], s["C"]),), _mean, long=("C",)),
    Kernel("squares", "def squares(T(R, C) A) -> (O) { O(r) +=! A(r, c) * A(r, c) }",
           ("R", "C"), lambda r, t, s: (_normal(r, t, s["R"], s["C"]),), _squares, long=("C",)),
    Kernel("row_max", "def row_max(T(R, C) A) -> (O) { O(r) max=! A(r, c) }",
           ("R", "C"), lambda r, t, s: (_normal(r, t, s["R"], s["C"]),), _row_max, long=("C",)),
    Kernel("softmax", "def softmax(T(N, C) X) -> (Mx, E, S, Y) {\n"
           "  Mx(n) max=! X(n, c)\n  E(n, c) = exp(X(n, c) - Mx(n))\n  S(n) +=! E(n, c)\n"
           "  Y(n, c) = E(n, c) / S(n)\n}",
           ("N", "C"), lambda r, t, s: (_normal(r, t, s["N"], s["C"]),), _softmax),
    Kernel("mixed", "def mixed(half(M, K) A, bfloat16(N, K) B) -> (C) "
           "{ C(m, n) +=! A(m, k) * B(n, k) }",
           ("M", "N", "K"), lambda r, t, s: (_normal(r, np.float16, s["M"], s["K"]),
                                             _normal(r, ml_dtypes.bfloat16, s["N"], s["K"])),
           _mixed),
)


def tensor_core_options(rng: random.Random, loops: int, batch=()) -> tc.MappingOptions:
    """Options shaped for tensor cores: tiles of multiples of 8 and 16 (a batch loop by 1 most
    of the time), whole warps, shared memory half the time."""
    tile = [rng.choice((1, 8, 16, 16, 32, 48, 64)) for _ in range(loops)]
    for n in batch:
        if rng.random() < 0.8:
            tile[n] = 1
    o = tc.MappingOptions().tile(*tile)
    warps = rng.choice((1, 1, 2, 4))
    threads = [32 * warps] if rng.random() < 0.5 else [32, warps]
    if rng.random() < 0.2:
        threads = [rng.choice((8, 16)), rng.choice((2, 4))]  # a warp as two dimensions
    o = o.mapToThreads(*threads).mapToBlocks(*[rng.choice((1, 2, 3, 4)) for _ in range(
        rng.randint(1, 3))])
    if rng.random() < 0.5:
        o = o.useSharedMemory(True)
    if rng.random() < 0.3:
        o = o.usePrivateMemory(True)
    if rng.random() < 0.3:
        o = o.unroll(rng.choice((2, 4, 8)))
    if rng.random() < 0.2:
        o = o.parallelReductions(False)
    if rng.random() < 0.2:
        o = o.outerScheduleFusionStrategy(rng.choice(("Max", "Min")))
    return o.useTensorCores(True)


@attrs.frozen
class NarrowCase:
    seed: int
    kernel: Kernel
    type_name: str
    sizes: dict
    inputs: tuple  # the arguments (in/out start last, when the kernel has one)
    options: tuple  # MappingOptions
    narrow_accumulation: bool = False  # tc.define's flag: sums accumulate in the narrow type

    @property
    def source(self) -> str:
        return self.kernel.source.replace("T(", f"{self.type_name}(")


def case(seed: int, n_options: int = 3) -> NarrowCase:
    rng = random.Random(f"narrow/{seed}")
    kernel = rng.choice(KERNELS)
    type_name = rng.choice(tuple(TYPES))
    while True:
        sizes = {s: rng.choice(LONG if s in kernel.long and rng.random() < 0.4 else SIZES)
                 for s in kernel.sizes}
        if "KW" in sizes:
            sizes["KW"] = rng.choice((1, 2, 3))
            sizes["W"] = max(sizes["W"], sizes["KW"])
        if _work(kernel, sizes) <= MAX_WORK:
            break
    values = np.random.default_rng(seed)
    inputs = kernel.make(values, TYPES[type_name][0], sizes)
    loops = len(kernel.sizes)
    options = []
    for _ in range(n_options):
        if rng.random() < 0.6:
            options.append(tensor_core_options(rng, loops, kernel.batch))
        else:
            o = mapping.random_options(rng)
            options.append(o.useTensorCores(True) if rng.random() < 0.7 else o)
    narrow_accumulation = rng.random() < 0.15
    return NarrowCase(seed, kernel, type_name, sizes, inputs, tuple(options),
                      narrow_accumulation)


def _work(kernel: Kernel, sizes: dict) -> int:
    out = 1
    for v in sizes.values():
        out *= v
    return out


def expected(c: NarrowCase) -> list:
    mixed = c.kernel.name == "mixed"  # float32 results
    u = 0.0 if mixed else TYPES[c.type_name][1]
    acc = u if c.narrow_accumulation and not mixed else EPS32
    x = tuple(np.asarray(v, np.float64) for v in c.inputs)
    return c.kernel.reference(x, c.sizes, u, acc)


def compare(c: NarrowCase, got) -> str | None:
    outs = got if isinstance(got, tuple) else (got,)
    refs = expected(c)
    if len(outs) != len(refs):
        return f"{len(outs)} results for {len(refs)} outputs"
    for n, (g, (exact, bound)) in enumerate(zip(outs, refs)):
        g = np.asarray(g)
        if g.shape != np.shape(exact):
            return f"output {n}: shape {g.shape}, expected {np.shape(exact)}"
        value = g.astype(np.float64)
        if bound is None:
            bad = value != exact
        else:
            # (below the least normal value a rounding errs by up to half the subnormal step,
            # not u of the value: half's products reach there, seed 384; four roundings at most,
            # doubled)
            bad = ~(np.abs(value - exact) <= bound + 8 * _subnormal_step(g.dtype))
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            return (f"output {n}{list(at)}: got {value[at]!r}, expected {exact[at]!r}"
                    f"{'' if bound is None else f' within {bound[at]!r}'} "
                    f"({int(bad.sum())} of {bad.size} differ)")
    return None


def _subnormal_step(dtype) -> float:
    return float(ml_dtypes.finfo(dtype).smallest_subnormal)


@attrs.frozen
class Finding:
    seed: int
    kind: str  # 'mismatch', 'crash', 'rejected', 'race'
    stage: str  # 'define', 'cpu', 'compile', 'emulate'
    options: str | None
    error: str
    detail: str

    @property
    def signature(self) -> str:
        import re
        first = self.detail.strip().splitlines()[0] if self.detail.strip() else ""
        first = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", first)
        return f"{self.kind}/{self.stage}/{self.error}: {first[:120]}"


def _error(e: BaseException) -> tuple[str, str, str]:
    name = type(e).__name__
    if isinstance(e, tc.TCError):
        return ("race" if name == "EmulationRaceError" else "rejected"), name, str(e)
    tb = traceback.extract_tb(e.__traceback__)
    where = next((f"{f.filename.split('/tcstage/')[-1]}:{f.lineno} in {f.name}"
                  for f in reversed(tb) if "/tcstage/" in f.filename), "")
    return "crash", name, f"{e} [{where}]"


def check(c: NarrowCase, cpu: bool = True, stats=None) -> list[Finding]:
    """Every finding for c; `stats` (a Counter), if given, counts the kernels compiled, those
    on tensor cores and those with a reduction split over threads (and across blocks)."""
    findings = []

    def stage(name, options, fn):
        try:
            return True, fn()
        except Exception as e:  # noqa: BLE001 - every exception is a finding
            kind, error, detail = _error(e)
            findings.append(Finding(c.seed, kind, name, _text(options), error, detail))
            return False, None

    def result(name, options, got):
        why = compare(c, got)
        if why:
            findings.append(Finding(c.seed, "mismatch", name, _text(options), "mismatch", why))

    args = c.inputs[:-1] if c.kernel.inout else c.inputs
    out = (lambda: np.array(c.inputs[-1])) if c.kernel.inout else (lambda: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ok, prog = stage("define", None, lambda: tc.define(
            c.source, narrow_accumulation=c.narrow_accumulation))
        if not ok:
            return findings
        if cpu:
            ok, got = stage("cpu", None, lambda: prog[c.kernel.name](*args, out=out()))
            if ok:
                result("cpu", None, got)
        for options in c.options:
            ok, k = stage("compile", options, lambda: tc.compile(
                prog, c.kernel.name, *args, out=out(), options=options, target="cuda-emulated"))
            if not ok:
                continue
            if stats is not None:
                stats["kernels"] += 1
                stats["on tensor cores"] += "tc::mma_tile" in k.cuda_source
                stats["split reductions"] += "tc::warp_reduce(_acc" in k.cuda_source
                stats["split across blocks"] += "_part0" in k.cuda_source
            ok, got = stage("emulate", options, lambda: k(*args, out=out()))
            if ok:
                result("emulate", options, got)
    return findings


def _text(options) -> str | None:
    return None if options is None else str(options)


def reproducer(c: NarrowCase, f: Finding) -> str:
    return f'''"""{f.kind} at {f.stage} (narrow fuzz seed {c.seed}): {f.error}: {f.detail.splitlines()[0]}
Regenerate: sys.path.insert(0, 'tests'); from fuzz import narrow; c = narrow.case({c.seed})
sizes {c.sizes}, narrow_accumulation={c.narrow_accumulation}
"""
import sys
sys.path.insert(0, "tests")
import numpy as np
import tcstage as tc
from fuzz import narrow

c = narrow.case({c.seed})
source = """{c.source}"""
options = {f.options!r}
print(narrow.check(c if options is None else
                   __import__("attrs").evolve(c, options=(tc.MappingOptions.parse(options),)),
                   cpu=options is None))
'''
