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
        return np.array([0 if math.isnan(v) else int(min(max(math.trunc(v) if math.isfinite(v)
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
    if nvcc_path() is not None:
        assert compile_check(ok)
        for expr in MIXED_AMBIGUOUS:
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


# --- nvcc ---------------------------------------------------------------------------------------


def all_kernels() -> list[str]:
    return [v for k, v in globals().items() if k.isupper() and isinstance(v, str)
            and "__global__" in v and "EXPR" not in v]


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")
def test_kernels_compile_with_nvcc():
    rejected = nvcc_batches.check_all(all_kernels())
    assert rejected == {}, rejected
