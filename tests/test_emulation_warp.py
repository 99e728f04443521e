"""The emulator's bfloat16, half and floating-point atomics, and its warp collectives (shuffles,
votes, __syncwarp), against numpy, ml_dtypes and exact rational arithmetic."""

import math
from fractions import Fraction

import numpy as np
import pytest

from tcstage.cuda import emulate as emu
from tcstage.cuda.emulate import EmulationError, EmulationRaceError, emulate
from tcstage.cuda.nvcc import compile_check, nvcc_path
from tcstage.errors import TCError

import nvcc_batches  # tests/

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng(15)


def bf16_exact(x) -> float:
    """x (an int, float or Fraction) rounded once to bfloat16, to nearest with ties to even,
    computed exactly; ml_dtypes rounds a float64 through float32 (twice)."""
    if isinstance(x, float) and math.isnan(x):
        return math.nan
    if isinstance(x, float) and math.isinf(x):
        return x
    m = abs(Fraction(x))
    if m == 0:
        return math.copysign(0.0, x) if isinstance(x, float) else 0.0
    e = m.numerator.bit_length() - m.denominator.bit_length()
    while Fraction(2) ** e > m:
        e -= 1
    while Fraction(2) ** (e + 1) <= m:
        e += 1
    ulp = Fraction(2) ** (max(e, -126) - 7)  # 8 significant bits; subnormals below 2^-126
    q = m / ulp
    n = math.floor(q)
    if q - n > Fraction(1, 2) or (q - n == Fraction(1, 2) and n % 2):
        n += 1
    v = n * ulp
    r = math.inf if v >= Fraction(2) ** 128 else float(v)
    return -r if x < 0 else r


def same_bf16(got: np.ndarray, want: np.ndarray) -> bool:
    """Bit-equal, except that any NaN equals any NaN."""
    g, w = got.astype(np.float32), np.asarray(want).astype(BF16).astype(np.float32)
    nan = np.isnan(g) & np.isnan(w)
    return bool(np.all(nan | (g.view(np.uint32) == w.view(np.uint32))))


def special_bf16(n: int) -> np.ndarray:
    """Random bf16 values with NaN, infinities, zeros, the largest and subnormal values mixed
    in."""
    x = RNG.standard_normal(n).astype(np.float32) * np.float32(2.0) ** RNG.integers(-8, 8, n)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3.3895e38, -3.3895e38, 1e-39,
                         -9.2e-41, 1.0, 2.0 ** -133], np.float32)
    x[:specials.size] = specials
    return RNG.permutation(x).astype(BF16)


# --- bfloat16 -----------------------------------------------------------------------------------

BF16_ARITH = r"""
#include <cuda_bf16.h>
__global__ void bf16_arith(__nv_bfloat16* __restrict__ out, bool* __restrict__ cmp,
                           const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ b,
                           const __nv_bfloat16* __restrict__ c, __nv_bfloat16 s, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    __nv_bfloat16 x = a[i], y = b[i];
    __nv_bfloat16* o = out + 10 * i;
    o[0] = x + y;
    o[1] = x - y;
    o[2] = x * y;
    o[3] = x / y;
    o[4] = -x;
    o[5] = __hfma(x, y, c[i]);
    __nv_bfloat16 t = x;
    t += y;
    t *= s;
    o[6] = t;
    t = x;
    t -= y;
    t /= s;
    o[7] = t;
    o[8] = __hmax(x, y);
    o[9] = __float2bfloat16((float)x * (float)y);  // float arithmetic, then one rounding
    bool* q = cmp + 6 * i;
    q[0] = x < y; q[1] = x <= y; q[2] = x > y; q[3] = x >= y; q[4] = x == y; q[5] = x != y;
  }
}
"""


def test_bf16_arithmetic_rounds_like_ml_dtypes():
    n = 600
    a, b, c = special_bf16(n), special_bf16(n), special_bf16(n)
    out = np.zeros(10 * n, BF16)
    cmp = np.zeros(6 * n, bool)
    emulate(BF16_ARITH, "bf16_arith", 3, 64, [out, cmp, a, b, c, 0.75, n])
    out = out.reshape(n, 10)
    A, B, S = a.astype(np.float32), b.astype(np.float32), np.float32(0.75)
    with np.errstate(all="ignore"):
        r = lambda v: np.asarray(v, np.float32).astype(BF16).astype(np.float32)  # noqa: E731
        want = [r(A + B), r(A - B), r(A * B), r(A / B), -A, None, r(r(A + B) * S),
                r(r(A - B) / S), np.fmax(A, B), r(A * B)]
    for k, w in enumerate(want):
        if w is not None:
            assert same_bf16(out[:, k], w), k
    fma = [bf16_exact(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
           if all(map(math.isfinite, (float(x), float(y), float(z)))) else
           float(np.float64(x) * np.float64(y) + np.float64(z))
           for x, y, z in zip(A, B, c.astype(np.float32))]
    finite = np.isfinite(np.array(fma))
    assert same_bf16(out[finite, 5], np.array(fma)[finite])
    with np.errstate(invalid="ignore"):
        cmps = [A < B, A <= B, A > B, A >= B, A == B, A != B]
    np.testing.assert_array_equal(cmp.reshape(n, 6), np.stack(cmps, axis=1))


def test_bf16_fma_rounds_once():
    """1.0625 * 1.0625 = 1 + 2^-3 + 2^-8 is a bf16 tie; adding +-2^-40, which float cannot hold
    next to 1, decides the direction. Rounding to float first would land on the tie and go to
    even (1.125) both times."""
    src = r"""
#include <cuda_bf16.h>
__global__ void fma1(__nv_bfloat16* out, const __nv_bfloat16* a, const __nv_bfloat16* b,
                     const __nv_bfloat16* c) {
  out[threadIdx.x] = __hfma(a[threadIdx.x], b[threadIdx.x], c[threadIdx.x]);
}
"""
    a = np.array([1.0625, 1.0625, -1.0625, 1.0625, 1.0625], np.float32).astype(BF16)
    # 2^-70 is lost even in double (53 bits) next to 1
    c = np.array([2.0 ** -40, -(2.0 ** -40), -(2.0 ** -40), 2.0 ** -70, -(2.0 ** -70)],
                 np.float32).astype(BF16)
    out = np.zeros(5, BF16)
    emulate(src, "fma1", 1, 5, [out, a, a.copy(), c])
    want = [bf16_exact(Fraction(float(x)) ** 2 + Fraction(float(z)))
            for x, z in zip(a.astype(np.float64), c.astype(np.float64))]
    assert want == [1.125 + 2.0 ** -7, 1.125, 1.125, 1.125 + 2.0 ** -7, 1.125]
    np.testing.assert_array_equal(out.astype(np.float64), want)


BF16_CONVERT = r"""
#include <cuda_bf16.h>
__global__ void bf16_convert(__nv_bfloat16* from_f, const float* f, __nv_bfloat16* from_d,
                             const double* d, __nv_bfloat16* from_ll, const long long* ll,
                             __nv_bfloat16* from_i, const int* iv, int* to_i, unsigned* to_u,
                             long long* to_ll, short* to_s, float* to_f, const __nv_bfloat16* x,
                             int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    from_f[i] = __float2bfloat16(f[i]);
    from_d[i] = d[i];                      // the implicit constructor, as CUDA's
    from_ll[i] = __nv_bfloat16(ll[i]);
    from_i[i] = iv[i];
    to_i[i] = (int)x[i];
    to_u[i] = (unsigned)x[i];
    to_ll[i] = (long long)x[i];
    to_s[i] = x[i];
    to_f[i] = x[i];
  }
}
"""


def near_ties(n: int) -> np.ndarray:
    """float64 values at, just above and just below bf16 ties, and some random ones."""
    base = RNG.standard_normal(n) * 2.0 ** RNG.integers(-30, 30, n)
    b16 = base.astype(np.float32).astype(BF16).astype(np.float64)
    ulp = np.abs(b16) * 2.0 ** -7
    tie = b16 + ulp / 2
    offsets = np.array([0.0, 2.0 ** -30, -(2.0 ** -30), 2.0 ** -45, 0.25])
    return tie * (1 + RNG.choice(offsets, n))


def test_bf16_conversions_round_once_and_saturate():
    n = 400
    d = near_ties(n)
    d[:6] = [np.nan, np.inf, -np.inf, 3.4e38, -3.39e38, 1.5e-40]  # overflow, to inf and back
    f = near_ties(n).astype(np.float32)
    f[:4] = [np.nan, np.inf, 3.3961e38, -0.0]
    ll = RNG.integers(-2 ** 62, 2 ** 62, n, dtype=np.int64)
    ll[:6] = [(257 << 40), (257 << 40) + 1, (259 << 40), -(257 << 40) - 1, 2 ** 63 - 1,
              -2 ** 63]
    iv = RNG.integers(-2 ** 31, 2 ** 31, n, dtype=np.int64).astype(np.int32)
    iv[:3] = [(257 << 20) + 1, 2 ** 31 - 1, -2 ** 31]
    x = special_bf16(n)
    x[-4:] = np.array([3e9, -3e9, 70000, -1e20], np.float32).astype(BF16)
    outs = [np.zeros(n, BF16) for _ in range(4)] + [
        np.zeros(n, t) for t in (np.int32, np.uint32, np.int64, np.int16, np.float32)]
    emulate(BF16_CONVERT, "bf16_convert", 1, 128,
            [outs[0], f, outs[1], d, outs[2], ll, outs[3], iv, *outs[4:], x, n])
    assert same_bf16(outs[0], f.astype(BF16))  # float -> bf16: ml_dtypes rounds once
    assert same_bf16(outs[1], np.array([bf16_exact(float(v)) for v in d]))
    assert same_bf16(outs[2], np.array([bf16_exact(int(v)) for v in ll]))
    assert same_bf16(outs[3], np.array([bf16_exact(int(v)) for v in iv]))
    xf = x.astype(np.float64)

    def saturated(dtype):
        info = np.iinfo(dtype)
        # NaN: 0, but 0x8000000000000000 for 64-bit integers (CUDA's documentation of
        # __bfloat162ll_rz; an H200 gave it where the emulator once gave 0)
        nan = info.min if info.bits == 64 else 0
        return np.array([nan if math.isnan(v) else int(min(max(math.trunc(v) if math.isfinite(v)
                                                               else v, info.min), info.max))
                         for v in xf], dtype)
    for out, t in zip(outs[4:8], (np.int32, np.uint32, np.int64, np.int16)):
        np.testing.assert_array_equal(out, saturated(t), err_msg=str(t))
    np.testing.assert_array_equal(outs[8], x.astype(np.float32))


def test_bf16_scalar_parameter_and_wrong_arrays():
    out, cmp = np.zeros(10, BF16), np.zeros(6, bool)
    one = np.ones(1, BF16)
    emulate(BF16_ARITH, "bf16_arith", 1, 1, [out, cmp, one, one, one, np.float32(3.0), 1])
    assert out[6] == 6.0  # (1 + 1) * 3
    with pytest.raises(TCError, match="needs a numpy array of bfloat16, got one of float16"):
        emulate(BF16_ARITH, "bf16_arith", 1, 1,
                [out, cmp, one.astype(np.float16), one, one, 3.0, 1])
    with pytest.raises(TCError, match=r"needs a bfloat16 scalar"):
        emulate(BF16_ARITH, "bf16_arith", 1, 1, [out, cmp, one, one, one, "3", 1])


def test_bf16_without_ml_dtypes(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_ml_dtypes(name, *args, **kwargs):
        if name == "ml_dtypes":
            raise ImportError("no module named ml_dtypes")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_ml_dtypes)
    with pytest.raises(TCError, match=r"bfloat16 arrays need the ml_dtypes package"):
        emulate(BF16_ARITH, "bf16_arith", 1, 1, [np.zeros(10, np.uint16)] * 2 + [None] * 5)


MIXED = r"""
#include <cuda_bf16.h>
__global__ void mixed(__nv_bfloat16* x, float* f, int* i, double* d) { EXPR; }
"""
# What nvcc 13 accepts and rejects: __nv_bfloat16 converts implicitly to float and to every
# integer type and from all of them, so a bf16 operand mixed with another arithmetic type is
# ambiguous between the bf16 operator and the built-in one.
MIXED_OK = ["x[0] = x[1] + x[2]", "f[0] = (float)x[0] + f[1]", "x[0] = 1.0f", "x[0] += 1.0f",
            "i[0] = x[0]", "d[0] = x[0]", "x[0] = d[0]", "x[0] = i[0]", "i[0] = x[0] < x[1]",
            "f[0] = x[0] ? 1.f : 2.f", "f[0] = expf(x[0])", "x[0] = x[1] * __nv_bfloat16(2)"]
MIXED_AMBIGUOUS = ["f[0] = x[1] + f[1]", "x[0] = x[1] * 2", "i[0] = x[1] < f[1]",
                   "x[0] = x[1] * 2.0"]


def test_mixed_bf16_expressions_are_as_ambiguous_as_in_cuda():
    ok = MIXED.replace("EXPR", "; ".join(MIXED_OK))
    emulate(ok, "mixed", 1, 1, [np.ones(3, BF16), np.ones(2, np.float32), np.ones(1, np.int32),
                                np.ones(1, np.float64)])
    for expr in MIXED_AMBIGUOUS:
        with pytest.raises(TCError, match="could not compile(?s:.*)ambiguous"):
            emu.compile_kernels(MIXED.replace("EXPR", expr))
    if nvcc_path() is not None:  # (the accepted ones: test_kernels_compile_with_nvcc)
        for expr in MIXED_AMBIGUOUS[:2]:
            with pytest.raises(TCError, match="more than one operator"):
                compile_check(MIXED.replace("EXPR", expr))


# --- floating-point atomics ---------------------------------------------------------------------

ATOMICS = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
// max of bfloat16 values through a 16-bit compare-and-swap loop
__device__ void atomic_max_bf16(__nv_bfloat16* p, __nv_bfloat16 v) {
  unsigned short* u = reinterpret_cast<unsigned short*>(p);
  unsigned short old = *u, assumed;
  do {
    assumed = old;
    if (!(v > __ushort_as_bfloat16(assumed))) break;
    old = atomicCAS(u, assumed, __bfloat16_as_ushort(v));
  } while (old != assumed);
}
__global__ void atomics(__nv_bfloat16* sum_bf, half* sum_h, __nv_bfloat16* max_bf,
                        const __nv_bfloat16* x, const half* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  atomicAdd(&sum_bf[i % 4], x[i]);
  atomicAdd(&sum_h[i % 4], y[i]);
  atomic_max_bf16(&max_bf[i % 4], x[i]);
}
"""

CAS_PRODUCT = r"""
// a float product through a 32-bit compare-and-swap loop (CUDA has no atomicMul)
__device__ void atomic_mul(float* p, float v) {
  unsigned* u = reinterpret_cast<unsigned*>(p);
  unsigned old = *u, assumed;
  do {
    assumed = old;
    old = atomicCAS(u, assumed, __float_as_uint(__uint_as_float(assumed) * v));
  } while (old != assumed);
}
__global__ void cas_product(float* prod, const float* z, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomic_mul(&prod[i % 4], z[i]);
}
"""


def test_half_and_bf16_atomics_and_cas_loops():
    """The race check compares results of floating-point atomics with a tolerance: forward and
    reverse orders round the sums differently."""
    n = 512
    x = RNG.uniform(0.5, 1.0, n).astype(BF16)
    y = RNG.uniform(0.5, 1.0, n).astype(np.float16)
    sum_bf, sum_h = np.zeros(4, BF16), np.zeros(4, np.float16)
    max_bf = np.full(4, -np.inf, np.float32).astype(BF16)
    emulate(ATOMICS, "atomics", 4, 128, [sum_bf, sum_h, max_bf, x, y, n])
    xs, ys = (v.astype(np.float64).reshape(-1, 4) for v in (x, y))
    np.testing.assert_allclose(sum_bf.astype(np.float64), xs.sum(0), rtol=0.05)
    np.testing.assert_allclose(sum_h.astype(np.float64), ys.sum(0), rtol=0.01)
    np.testing.assert_array_equal(max_bf.astype(np.float64), xs.max(0))


def test_float_cas_loop_counts_as_a_floating_point_atomic():
    """A product built from atomicCAS rounds differently in each order; that is not a race."""
    n = 512
    z = RNG.uniform(0.9, 1.1, n).astype(np.float32)
    runs = {}
    for order in ("forward", "reverse"):
        runs[order] = np.ones(4, np.float32)
        emulate(CAS_PRODUCT, "cas_product", 4, 128, [runs[order], z, n],
                schedules=(order,), check_races=False)
    assert not np.array_equal(runs["forward"], runs["reverse"])  # the test means something
    prod = np.ones(4, np.float32)
    emulate(CAS_PRODUCT, "cas_product", 4, 128, [prod, z, n])
    np.testing.assert_allclose(prod, z.astype(np.float64).reshape(-1, 4).prod(0), rtol=1e-4)


def test_integer_cas_results_stay_exact():
    """Integer arrays are compared exactly even when CAS loops ran: a racy non-atomic write next
    to a CAS loop is still reported."""
    src = r"""
__global__ void racy(unsigned* counter, int* last) {
  unsigned old = *counter, assumed;
  do { assumed = old; old = atomicCAS(counter, assumed, assumed + 1); } while (old != assumed);
  last[0] = threadIdx.x;  // which thread wrote last depends on the order
}
"""
    counter, last = np.zeros(1, np.uint32), np.zeros(1, np.int32)
    with pytest.raises(EmulationRaceError, match="'last'"):
        emulate(src, "racy", 1, 64, [counter, last])
    emulate(src, "racy", 1, 64, [counter, last], check_races=False)
    assert counter[0] == 64


# --- warp collectives --------------------------------------------------------------------------

FULL = 0xFFFFFFFF


def shuffle_reference(kind: str, x: np.ndarray, arg, width: int) -> np.ndarray:
    """Each lane's result of a full-warp shuffle, by CUDA's description: lanes form groups of
    `width`; a source outside the lane's own group (above it, for xor) gives the lane its own
    value. `arg`: one value for all lanes, or one per lane. x: whole warps, flat."""
    out = x.copy()
    args = np.broadcast_to(arg, x.shape)
    for i in range(x.size):
        lane, base = i % 32, i - i % 32
        group = lane // width * width
        a = int(args[i])
        if kind == "idx":
            src = group + a % width
        elif kind == "up":
            src = lane - a if lane - group >= a else lane
        elif kind == "down":
            src = lane + a if lane - group + a < width else lane
        else:
            src = lane ^ (a & 31)
            src = src if src < group + width else lane
        out[i] = x[base + src]
    return out


def down_tree_reference(x: np.ndarray, op) -> np.ndarray:
    """Every lane's value after `v = op(v, __shfl_down_sync(FULL, v, o))` for o = 16, 8, .., 1."""
    v = x.reshape(-1, 32).copy()
    for o in (16, 8, 4, 2, 1):
        shifted = np.concatenate([v[:, o:], v[:, 32 - o:]], axis=1)  # the last o keep their own
        v = op(v, shifted)
    return v.reshape(-1)


def butterfly_reference(x: np.ndarray, op) -> np.ndarray:
    v = x.reshape(-1, 32).copy()
    for o in (16, 8, 4, 2, 1):
        v = op(v, v[:, np.arange(32) ^ o])
    return v.reshape(-1)


SHUFFLE_TYPES = {"int": np.int32, "unsigned": np.uint32, "long long": np.int64,
                 "unsigned long long": np.uint64, "float": np.float32, "double": np.float64,
                 "half": np.float16, "__nv_bfloat16": BF16}


def typed_shuffles(ctype: str) -> str:
    name = ctype.replace(" ", "_")
    return rf"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
__global__ void shuffles_{name}({ctype}* sum, {ctype}* big, {ctype}* bcast, {ctype}* up,
                                {ctype}* xor8, const {ctype}* x, int src) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  {ctype} v = x[i], s = v, m = v;
  for (int o = 16; o > 0; o >>= 1) s = s + __shfl_down_sync(0xffffffffu, s, o);
  for (int o = 16; o > 0; o >>= 1) {{
    {ctype} other = __shfl_xor_sync(0xffffffffu, m, o);
    m = m < other ? other : m;
  }}
  sum[i] = s;
  big[i] = m;
  bcast[i] = __shfl_sync(0xffffffffu, v, src);
  up[i] = __shfl_up_sync(0xffffffffu, v, 3);
  xor8[i] = __shfl_xor_sync(0xffffffffu, v, 5, 8);
}}
"""


@pytest.mark.parametrize("ctype", list(SHUFFLE_TYPES))
def test_shuffles_of_every_type(ctype):
    """Values are small integers, so every sum is exact in every type (bf16: below 256)."""
    dtype = SHUFFLE_TYPES[ctype]
    signed = not ctype.startswith("unsigned")
    x = RNG.integers(-4 if signed else 0, 4 if signed else 8, 128).astype(np.float64)
    xs = x.astype(dtype)
    outs = [np.zeros(128, dtype) for _ in range(5)]
    emulate(typed_shuffles(ctype), f"shuffles_{ctype.replace(' ', '_')}", 2, 64,
            [*outs, xs, 7])
    got = [o.astype(np.float64) for o in outs]
    np.testing.assert_array_equal(got[0], down_tree_reference(x, np.add))
    np.testing.assert_array_equal(got[1], butterfly_reference(x, np.maximum))
    np.testing.assert_array_equal(got[1], np.repeat(x.reshape(-1, 32).max(1), 32))
    np.testing.assert_array_equal(got[2], np.repeat(x.reshape(-1, 32)[:, 7], 32))
    np.testing.assert_array_equal(got[3], shuffle_reference("up", x, 3, 32))
    np.testing.assert_array_equal(got[4], shuffle_reference("xor", x, 5, 8))


WIDTHS = r"""
__global__ void widths(int* out, const int* x, int width, int delta, int src, int lane_mask) {
  int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32, v = x[i];
  out[4 * i + 0] = __shfl_sync(0xffffffffu, v, lane * 7 + src, width);
  out[4 * i + 1] = __shfl_up_sync(0xffffffffu, v, delta, width);
  out[4 * i + 2] = __shfl_down_sync(0xffffffffu, v, delta, width);
  out[4 * i + 3] = __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
}
"""


@pytest.mark.parametrize("width,delta,src,lane_mask",
                         [(32, 3, 5, 5), (32, 0, -3, 31), (16, 1, 40, 8), (16, 15, 0, 17),
                          (8, 5, 3, 12), (4, 2, -1, 3), (2, 1, 1, 1), (1, 0, 0, 0)])
def test_shuffle_width_subsections(width, delta, src, lane_mask):
    x = np.arange(64, dtype=np.int32) * 10 + 1
    out = np.zeros(4 * 64, np.int32)
    emulate(WIDTHS, "widths", 1, 64, [out, x, width, delta, src, lane_mask])
    out = out.reshape(64, 4)
    lanes = np.arange(64) % 32
    np.testing.assert_array_equal(out[:, 0], shuffle_reference("idx", x, lanes * 7 + src, width))
    np.testing.assert_array_equal(out[:, 1], shuffle_reference("up", x, delta, width))
    np.testing.assert_array_equal(out[:, 2], shuffle_reference("down", x, delta, width))
    np.testing.assert_array_equal(out[:, 3], shuffle_reference("xor", x, lane_mask, width))


VOTES = r"""
__global__ void votes(unsigned* ballot, int* any, int* all, unsigned* halves, unsigned* active,
                      const int* x) {
  int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32;
  ballot[i] = __ballot_sync(0xffffffffu, x[i] > 0);
  any[i] = __any_sync(0xffffffffu, x[i] > 2);
  all[i] = __all_sync(0xffffffffu, x[i] > -3);
  // two collectives at two call sites with disjoint masks: legal
  if (lane < 16) halves[i] = __ballot_sync(0x0000ffffu, x[i] > 0);
  else halves[i] = __ballot_sync(0xffff0000u, x[i] < 0);
  active[i] = lane % 3 == 1 ? __activemask() : 0u;
}
"""


def test_votes_and_activemask_in_a_partial_warp_free_block():
    x = RNG.integers(-3, 4, 96).astype(np.int32)
    x[64:96] = 1  # a warp whose votes are unanimous
    outs = [np.zeros(96, t) for t in (np.uint32, np.int32, np.int32, np.uint32, np.uint32)]
    emulate(VOTES, "votes", 1, 96, [*outs, x], schedules=("forward", "reverse", "shuffle"))
    bits = lambda p: np.array([sum(1 << j for j in range(32) if p[w * 32 + j])  # noqa: E731
                               for w in range(3)], np.uint32)
    np.testing.assert_array_equal(outs[0], np.repeat(bits(x > 0), 32))
    np.testing.assert_array_equal(outs[1] != 0, np.repeat((x > 2).reshape(3, 32).any(1), 32))
    np.testing.assert_array_equal(outs[2] != 0, np.repeat((x > -3).reshape(3, 32).all(1), 32))
    lanes = np.arange(96) % 32
    lo, hi = bits((x > 0) & (lanes < 16)), bits((x < 0) & (lanes >= 16))
    np.testing.assert_array_equal(outs[3], np.where(lanes < 16, np.repeat(lo, 32),
                                                    np.repeat(hi, 32)))
    ones = sum(1 << j for j in range(32) if j % 3 == 1)
    np.testing.assert_array_equal(outs[4], np.where(lanes % 3 == 1, ones, 0))


REDUCES = r"""
__global__ void reduces(int* out, unsigned* uout, const int* x) {
  int i = threadIdx.x;
  unsigned u = (unsigned)x[i];
  out[4 * i + 0] = __reduce_add_sync(0xffffffffu, x[i]);
  out[4 * i + 1] = __reduce_min_sync(0xffffffffu, x[i]);
  out[4 * i + 2] = __reduce_max_sync(0xffffffffu, x[i]);
  out[4 * i + 3] = __reduce_max_sync(0xffffffffu, u);   // unsigned: -1 is the largest
  uout[3 * i + 0] = __reduce_and_sync(0xffffffffu, u | 0x100u);
  uout[3 * i + 1] = __reduce_or_sync(0xffffffffu, u & 0xffu);
  uout[3 * i + 2] = __reduce_xor_sync(0xffffffffu, u);
}
"""


def test_warp_reduce_intrinsics():
    x = RNG.integers(-1000, 1000, 32).astype(np.int32)
    out, uout = np.zeros(4 * 32, np.int32), np.zeros(3 * 32, np.uint32)
    emulate(REDUCES, "reduces", 1, 32, [out, uout, x])
    u = x.view(np.uint32)
    np.testing.assert_array_equal(out.reshape(32, 4), np.tile(
        [x.sum(), x.min(), x.max(), np.int32(u.max().astype(np.uint32)).item()
         if u.max() < 2**31 else np.uint32(u.max()).view(np.int32)], (32, 1)))
    np.testing.assert_array_equal(uout.reshape(32, 3), np.tile(
        [np.bitwise_and.reduce(u | 0x100), np.bitwise_or.reduce(u & 0xff),
         np.bitwise_xor.reduce(u)], (32, 1)))


BLOCK_SUM = r"""
// A block-wide sum: warp trees, one partial per warp through shared memory, a last warp tree.
__global__ void block_sum(float* out, const float* x, int n) {
  __shared__ float partial[32];
  int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32,
      warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  float v = i < n ? x[i] : 0.0f;
  unsigned mask = __activemask();   // the whole warp, or the lanes of a partial last warp
  for (int o = 16; o > 0; o >>= 1) {
    float other = __shfl_down_sync(mask, v, o);
    if (lane + o < 32 && (mask >> (lane + o) & 1)) v += other;  // a lane that exists
  }
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? partial[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
    if (lane == 0) out[blockIdx.x] = v;
  }
}
"""


@pytest.mark.parametrize("block", [256, 48, 96, 32])
def test_block_sum_with_warp_trees_and_a_barrier(block):
    """48 threads: the second warp has 16 lanes, __activemask() names them, and the tree adds
    only values from lanes that exist."""
    n = 5 * block
    x = RNG.standard_normal(n).astype(np.float32)
    out = np.zeros(5, np.float32)
    emulate(BLOCK_SUM, "block_sum", 5, block, [out, x, n],
            schedules=("forward", "reverse", "shuffle"))
    np.testing.assert_allclose(out, x.astype(np.float64).reshape(5, block).sum(1), rtol=1e-5,
                               atol=1e-5)


def test_partial_warp_reads_zero_past_the_block():
    """16 lanes in the last warp with their mask: a shuffle from a lane past the block's threads
    (undefined in CUDA) gives 0, as on an H200 (the emulator once gave the caller's own value,
    and --real-gpu found the difference); past the width it is the caller's own value, as CUDA
    documents."""
    src = r"""
__global__ void partial(int* out, const int* x) {
  int i = threadIdx.x;
  unsigned mask = i < 32 ? 0xffffffffu : 0x0000ffffu;
  out[i] = __shfl_down_sync(mask, x[i], 8);
}
"""
    x = np.arange(48, dtype=np.int32) + 100
    out = np.zeros(48, np.int32)
    emulate(src, "partial", 1, 48, [out, x])
    want = np.concatenate([shuffle_reference("down", x[:32], 8, 32),
                           [x[32 + j + 8] if j + 8 < 16 else 0 for j in range(16)]])
    np.testing.assert_array_equal(out, want)


def test_warps_are_linear_thread_ids():
    """In a (8, 6) block, lane = (y * 8 + x) % 32: warp 0 is rows 0-3, warp 1 rows 4-5."""
    src = r"""
__global__ void linear(int* out) {
  int id = threadIdx.y * blockDim.x + threadIdx.x;
  out[id] = __shfl_sync(__activemask(), id, 0) * 1000 + __popc(__activemask());
}
"""
    out = np.zeros(48, np.int32)
    emulate(src, "linear", 1, (8, 6), [out])
    np.testing.assert_array_equal(out, np.where(np.arange(48) < 32, 32, 32 * 1000 + 16))


SYNCWARP = r"""
__global__ void rotate(int* out, const int* x) {
  __shared__ int s[64];
  int i = threadIdx.x, lane = i % 32;
  s[i] = x[i];
  SYNC
  out[i] = s[i - lane + (lane + 1) % 32];
}
"""


def test_syncwarp_orders_shared_memory_within_a_warp():
    x = np.arange(64, dtype=np.int32)
    out = np.zeros(64, np.int32)
    emulate(SYNCWARP.replace("SYNC", "__syncwarp();"), "rotate", 1, 64, [out, x])
    np.testing.assert_array_equal(out, (x - x % 32) + (x % 32 + 1) % 32)
    with pytest.raises(EmulationRaceError, match="'out'"):
        emulate(SYNCWARP.replace("SYNC", ""), "rotate", 1, 64, [out, x])


RACE_BETWEEN_WARPS = r"""
__global__ void warp_race(float* out, const float* x) {
  __shared__ float last;
  float v = x[threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) last = v;   // every warp writes it: which one wins?
  __syncthreads();
  out[threadIdx.x] = last;
}
"""


def test_race_between_warps_is_still_reported():
    x = np.arange(64, dtype=np.float32)
    with pytest.raises(EmulationRaceError, match=r"kernel 'warp_race'.*argument 'out'"):
        emulate(RACE_BETWEEN_WARPS, "warp_race", 1, 64, [np.zeros(64, np.float32), x])
    out = np.zeros(64, np.float32)
    emulate(RACE_BETWEEN_WARPS, "warp_race", 1, 64, [out, x], check_races=False)
    assert out[0] in (x[:32].sum(), x[32:].sum())


@pytest.mark.parametrize("body,message", [
    ("if (lane < 16) v = __shfl_down_sync(FULL, v, 1); else v = __shfl_down_sync(FULL, v, 2);",
     r"divergent warp collective in block \(0,0,0\): thread \(0,0,0\) waits at the "
     r"__shfl_down_sync\(\) on line \d+ with mask 0xffffffff, while lane 16 of its warp, thread "
     r"\(16,0,0\), waits at the __shfl_down_sync\(\) on line \d+"),
    ("if (lane < 8) v = __shfl_sync(FULL, v, 0); else v = __ballot_sync(FULL, v > 0);",
     r"divergent warp collective.*__shfl_sync\(\).*__ballot_sync\(\)"),
    ("if (lane == 5) return; v = __shfl_sync(FULL, v, 0);",
     r"waits for a thread that has returned.*names lane 5, thread \(5,0,0\)"),
    ("if (lane != 3) v = __shfl_xor_sync(FULL, v, 1); __syncthreads();",
     r"divergent warp collective.*lane 3 of its warp, thread \(3,0,0\), waits at the "
     r"__syncthreads\(\)"),
    ("v = __shfl_sync(0x0000fffe, v, 1);",
     r"__shfl_sync\(\) on line \d+ in block \(0,0,0\), thread \(0,0,0\): its mask 0x0000fffe "
     r"does not name the calling lane 0"),
    ("v = __shfl_sync(FULL, v, 1, 12);", r"width 12 is not a power of 2"),
    ("if (lane < 16) v = __shfl_sync(FULL, v, 0); else __syncwarp();",
     r"divergent warp collective.*__shfl_sync\(\).*__syncwarp\(\)"),
    # lanes 0-15 meet at their __syncwarp(0xffff), then return; the others wait for them
    ("__syncwarp(lane < 16 ? 0xffffu : FULL);",
     r"thread \(16,0,0\) waits at the __syncwarp\(\) on line \d+ with mask 0xffffffff, which "
     r"names lane 0, thread \(0,0,0\), which has returned"),
])
def test_divergent_warp_collectives(body, message):
    src = r"""
#define FULL 0xffffffffu
__global__ void divergent(float* out, const float* x) {
  int lane = threadIdx.x % 32;
  float v = x[threadIdx.x];
  BODY
  out[threadIdx.x] = v;
}
""".replace("BODY", body)
    with pytest.raises(EmulationError, match=rf"kernel 'divergent': (?s:.*){message}"):
        emulate(src, "divergent", 1, 64, [np.zeros(64, np.float32), np.ones(64, np.float32)])


def test_full_mask_in_a_partial_warp_is_an_error():
    with pytest.raises(EmulationError, match=r"kernel 'shuffles_int'.*mask 0xffffffff names lanes "
                                             r"past the block's 48 threads \(warp 1 has lanes "
                                             r"0x0000ffff\)"):
        emulate(typed_shuffles("int"), "shuffles_int", 1, 48,
                [np.zeros(48, np.int32)] * 5 + [np.zeros(48, np.int32), 0])


def test_syncwarp_from_two_call_sites_meets():
    """bar.warp.sync needs the same mask, not the same instruction (CUDA: sm_70 and later)."""
    src = r"""
__global__ void two_sites(int* out) {
  __shared__ int s[32];
  int lane = threadIdx.x;
  s[lane] = lane;
  if (lane % 2) __syncwarp(); else __syncwarp();
  out[lane] = s[31 - lane];
}
"""
    out = np.zeros(32, np.int32)
    emulate(src, "two_sites", 1, 32, [out])
    np.testing.assert_array_equal(out, 31 - np.arange(32))


def test_many_shuffles_stay_cheap():
    """256 blocks of 256 threads, 10 shuffles each, under two orders: about 0.1 s here."""
    import time
    n = 256 * 256
    x = RNG.standard_normal(n).astype(np.float32)
    out = np.zeros(n // 256, np.float32)
    emulate(BLOCK_SUM, "block_sum", 256, 256, [out, x, n])  # compiled (and cached) first
    start = time.perf_counter()
    emulate(BLOCK_SUM, "block_sum", 256, 256, [out, x, n])
    assert time.perf_counter() - start < 5.0
    np.testing.assert_allclose(out, x.astype(np.float64).reshape(-1, 256).sum(1), rtol=1e-4,
                               atol=1e-4)


# --- nvcc ---------------------------------------------------------------------------------------


def all_kernels() -> list[str]:
    fixed = [v for k, v in globals().items() if k.isupper() and isinstance(v, str)
             and "__global__" in v and "EXPR" not in v and "SYNC\n" not in v]
    return fixed + [typed_shuffles(t) for t in SHUFFLE_TYPES] + [
        SYNCWARP.replace("SYNC", "__syncwarp();"), MIXED.replace("EXPR", "; ".join(MIXED_OK))]


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")
def test_kernels_compile_with_nvcc():
    rejected = nvcc_batches.check_all(all_kernels())
    assert rejected == {}, rejected
