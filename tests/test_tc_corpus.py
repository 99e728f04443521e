"""The original Tensor Comprehensions project's own benchmark kernels and tuned mapping options,
run through tcstage as TC wrote them (issue 25).

`tests/tc_corpus/*.toml` holds, per TC benchmark, the TC source verbatim, every option set TC
ships for it (the `options_*` chains of `tc/benchmarks/*.h`, tuned on P100 and V100 GPUs) as
text, the sizes TC benchmarked each at, and reduced sizes that the CPU emulator runs quickly.
Each file names the repository path and commit it comes from.

For each (kernel, option set):

- `test_values`: `tc.compile(source, name, *inputs, options=<the verbatim text>,
  target="cuda-emulated")` at the reduced sizes, run, and every output compared with a numpy
  reference written here from the TC's math (float64 einsum / explicit sums), never with
  tcstage's own CPU path. The launch (kernel.grid, kernel.block) is recorded as a test property.
- `test_launch_is_tcs_or_a_documented_difference`: tcstage's launch against the launch TC's
  own mapper would produce (`tc_launch` below, which follows TC's mapped_scop.cc and
  tighten_launch_bounds.cc; its comments name the TC functions each rule comes from). Only
  cases where TC's schedule and launch are certain are compared; where tcstage differs on
  purpose (`DELIBERATE`, docs/cuda.md), the test checks that the difference is that one.

Tolerances (`check`): all inputs are uniform in [0, 1), so every sum these TCs compute adds
non-negative terms. A float32 sum of n non-negative terms in any order (sequential, strided
per thread, tree of warp shuffles) is within (n - 1) * u of the exact sum, relatively
(u = 2**-24), and each product or pointwise operation adds at most a few u. We allow
3 * n * u relative error, and no less than 1e-5 (a few ulp of CUDA's expf/tanhf/rsqrtf and
of the host libm the emulator uses). Where a TC subtracts two such quantities (var = E[x^2]
- mean^2, the normalisations), relative error is not bounded; there the allowed absolute error
is that relative bound applied to the magnitudes of the terms subtracted (propagated through
rsqrt for group normalisation), computed per element in float64.
"""

from __future__ import annotations

import re
import tomllib
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import tcstage as tc

CORPUS = Path(__file__).parent / "tc_corpus"
U32 = 2.0 ** -24


# ---------------------------------------------------------------------------------------------
# The corpus


@dataclass(frozen=True)
class Case:
    file: str        # tc_corpus/<file>
    name: str        # TC's option set name, without "options_"
    function: str    # the TC function
    source: str      # the TC source, verbatim
    text: str        # the option chain, verbatim
    reduced: dict    # sizes run here
    tc_sizes: dict   # sizes TC benchmarked the options at

    @property
    def id(self) -> str:
        return f"{self.file[:-5]}-{self.name}"


def load_corpus() -> list[Case]:
    cases = []
    for path in sorted(CORPUS.glob("*.toml")):
        data = tomllib.loads(path.read_text())
        for o in data["options"]:
            cases.append(Case(path.name, o["name"], o["function"], data["tc"], o["text"],
                              dict(o["reduced"]), dict(o.get("tc_sizes", {}))))
    return cases


CASES = load_corpus()
TUNED = [c for c in CASES if "_autotuned_" in c.name]


def test_corpus_is_complete():
    """84 tuned option sets in TC's tc/benchmarks/*.h, all kept, all read by tcstage's parser;
    every TC function of the corpus has a reference here."""
    assert len(TUNED) == 84
    # the four Moments2_2D_1D sets appear in moments.h and again in group_normalization.h
    assert len({c.name for c in TUNED}) == 80
    assert len({c.id for c in CASES}) == len(CASES)
    for c in CASES:
        tc.MappingOptions.parse(c.text)
        assert c.function in INPUTS and c.function in REFERENCE, c.function


# ---------------------------------------------------------------------------------------------
# Inputs and numpy references, per TC function (float64 math on the float32 inputs)


def _rand(rng, *shape):
    return rng.random(shape, dtype=np.float32)


INPUTS = {
    "tmm": lambda s, r: (_rand(r, s["M"], s["K"]), _rand(r, s["N"], s["K"])),
    "batch_matmul": lambda s, r: (_rand(r, s["B"], s["N"], s["M"]),
                                  _rand(r, s["B"], s["M"], s["K"])),
    "_1LUT": lambda s, r: (_rand(r, s["E1"], s["D"]),
                           r.integers(0, s["E1"], (s["B"], s["L1"])).astype(np.int32)),
    "_2LUT": lambda s, r: (_rand(r, s["E1"], s["D"]),
                           r.integers(0, s["E1"], (s["B"], s["L1"])).astype(np.int32),
                           _rand(r, s["E2"], s["D"]),
                           r.integers(0, s["E2"], (s["B"], s["L2"])).astype(np.int32)),
    "_C3": lambda s, r: (_rand(r, s["B"], s["WX"]), _rand(r, s["WY"], s["WX"])),
    "mlp1": lambda s, r: (_rand(r, s["B"], s["M"]), _rand(r, s["M"], s["N"]), _rand(r, s["N"])),
    "mlp3": lambda s, r: (_rand(r, s["B"], s["N"]), _rand(r, s["O"], s["N"]), _rand(r, s["O"]),
                          _rand(r, s["P"], s["O"]), _rand(r, s["P"]), _rand(r, s["Q"], s["P"]),
                          _rand(r, s["Q"])),
    "group_convolution": lambda s, r: (_rand(r, s["N"], s["G"], s["C"], s["H"], s["W"]),
                                       _rand(r, s["G"], s["F"], s["C"], s["KH"], s["KW"]),
                                       _rand(r, s["G"], s["F"])),
    "convolution": lambda s, r: (_rand(r, s["N"], s["C"], s["H"], s["W"]),
                                 _rand(r, s["F"], s["C"], s["KH"], s["KW"]), _rand(r, s["F"])),
    "group_normalization": lambda s, r: (_rand(r, s["N"], s["G"], s["D"], s["H"], s["W"]),
                                         _rand(r, s["G"], s["D"]), _rand(r, s["G"], s["D"]),
                                         _rand(r, s["N"], s["G"]), _rand(r, s["N"], s["G"])),
    "group_normalization_single_kernel": lambda s, r: (
        _rand(r, s["N"], s["G"], s["D"], s["H"], s["W"]), _rand(r, s["G"], s["D"]),
        _rand(r, s["G"], s["D"])),
    "Kronecker3_1": lambda s, r: (_rand(r, s["D2"], s["N2"]),
                                  _rand(r, s["M"], s["N0"], s["N1"], s["N2"])),
    "Kronecker3_2": lambda s, r: (_rand(r, s["D1"], s["N1"]),
                                  _rand(r, s["M"], s["N0"], s["N1"], s["D2"])),
    "Kronecker3_3": lambda s, r: (_rand(r, s["D0"], s["N0"]),
                                  _rand(r, s["M"], s["N0"], s["D1"], s["D2"])),
    "Kronecker3Full": lambda s, r: (_rand(r, s["D0"], s["N0"]), _rand(r, s["D1"], s["N1"]),
                                    _rand(r, s["D2"], s["N2"]),
                                    _rand(r, s["M"], s["N0"], s["N1"], s["N2"])),
    "sum_2D_1D": lambda s, r: (_rand(r, s["N"], s["K"]),),
    "mean_2D_1D": lambda s, r: (_rand(r, s["N"], s["K"]),),
    "sum_squares_2D_1D": lambda s, r: (_rand(r, s["N"], s["K"]),),
    "var_2D_1D": lambda s, r: (_rand(r, s["N"], s["K"]), _rand(r, s["N"])),
    "sum_and_squares_2D_1D": lambda s, r: (_rand(r, s["N"], s["K"]),),
    "moments2_2D_1D": lambda s, r: (_rand(r, s["N"], s["K"]),),
    "wavenet1": lambda s, r: (_rand(r, s["B"], s["RESIDUAL_C"], s["RECEPTIVE_FIELD"]),
                              _rand(r, s["DILATION_C"], s["RESIDUAL_C"], 2),
                              _rand(r, s["DILATION_C"]),
                              _rand(r, s["DILATION_C"], s["RESIDUAL_C"], 2),
                              _rand(r, s["DILATION_C"]),
                              _rand(r, s["RESIDUAL_C"], s["DILATION_C"]), _rand(r, s["RESIDUAL_C"]),
                              _rand(r, s["SKIP_C"], s["DILATION_C"]), _rand(r, s["SKIP_C"]),
                              _rand(r, s["DILATION_FACTOR"])),
    "tensordot": lambda s, r: (_rand(r, s["N"], s["C1"], s["C2"], s["H"], s["W"]),
                               _rand(r, s["N"], s["C2"], s["C3"], s["H"], s["W"])),
    "blockdiagperm2dfissioned_1": lambda s, r: (_rand(r, s["B"], s["K"], s["NBYK"]),
                                                _rand(r, s["K"], s["NBYK"], s["NBYK"])),
    "blockdiagperm2dfissioned_2": lambda s, r: (_rand(r, s["B"], s["N"]),
                                                r.permutation(s["N"]).astype(np.int32)),
}


def _f(*arrays):
    return [np.asarray(a, dtype=np.float64) if a.dtype.kind == "f" else a for a in arrays]


def _conv(I, W, KH, KW):
    """O(..., f, h, w) = sum_{c, kh, kw} I(..., c, h + kh, w + kw) * W(..., f, c, kh, kw), valid."""
    H, Wd = I.shape[-2] - KH + 1, I.shape[-1] - KW + 1
    out = 0
    for kh in range(KH):
        for kw in range(KW):
            out = out + np.einsum("...chw,...fc->...fhw", I[..., kh:kh + H, kw:kw + Wd],
                                  W[..., kh, kw])
    return out


def _ref_moments(I, K):
    mean = I.sum(1) / K
    s2 = (I * I).sum(1)
    return mean, s2


def _ref_wavenet(s, Data, FW, FB, GW, GB, RW, RB, SW, SB, _dil):
    DF = s["DILATION_FACTOR"]
    shifted = np.zeros_like(Data)
    if DF < Data.shape[2]:
        shifted[:, :, DF:] = Data[:, :, :Data.shape[2] - DF]
    filt = FB[None, :, None] + np.einsum("brt,dr->bdt", Data, FW[:, :, 1]) \
        + np.einsum("brt,dr->bdt", shifted, FW[:, :, 0])
    gate = GB[None, :, None] + np.einsum("brt,dr->bdt", Data, GW[:, :, 1]) \
        + np.einsum("brt,dr->bdt", shifted, GW[:, :, 0])
    nonlin = np.tanh(filt) * (1 / (1 + np.exp(-gate)))
    res = Data + RB[None, :, None] + np.einsum("bdt,rd->brt", nonlin, RW)
    skip = np.einsum("bdt,sd->bst", nonlin, SW) + SB[None, :, None]
    return filt, gate, nonlin, res, skip


REFERENCE = {
    "tmm": lambda s, A, B: (A @ B.T,),
    "batch_matmul": lambda s, X, Y: (np.einsum("bnm,bmk->bnk", X, Y),),
    "_1LUT": lambda s, L, I: (L[I].sum(1),),
    "_2LUT": lambda s, L1, I1, L2, I2: (L1[I1].sum(1), L2[I2].sum(1)),
    "_C3": lambda s, I, W: (I @ W.T,),
    "mlp1": lambda s, I, W1, B1: (np.maximum(I @ W1 + B1, 0),),
    "mlp3": lambda s, I, W2, B2, W3, B3, W4, B4: (
        lambda O2: (lambda O3: (O2, O3, np.maximum(O3 @ W4.T + B4, 0)))(
            np.maximum(O2 @ W3.T + B3, 0)))(np.maximum(I @ W2.T + B2, 0)),
    "group_convolution": lambda s, I, W1, B: (
        _conv(I, W1, s["KH"], s["KW"]) + B[None, :, :, None, None],),
    "convolution": lambda s, I, W1, B: (_conv(I, W1, s["KH"], s["KW"]) + B[None, :, None, None],),
    "group_normalization": lambda s, I, gamma, beta, mean, var: (
        gamma[None, :, :, None, None] * (I - mean[:, :, None, None, None])
        / np.sqrt(var[:, :, None, None, None] + 1e-5) + beta[None, :, :, None, None],),
    "group_normalization_single_kernel": lambda s, I, gamma, beta: (
        lambda S, S2, n: (gamma[None, :, :, None, None] * (I - (S / n)[:, :, None, None, None])
                          / np.sqrt(S2 / n - S * S / n / n + 1e-5)[:, :, None, None, None]
                          + beta[None, :, :, None, None], S, S2))(
        I.sum((2, 3, 4)), (I * I).sum((2, 3, 4)), s["D"] * s["H"] * s["W"]),
    "Kronecker3_1": lambda s, W2, X: (np.einsum("abcr,dr->abcd", X, W2),),
    "Kronecker3_2": lambda s, W1, XW2: (np.einsum("mnrd,er->mned", XW2, W1),),
    "Kronecker3_3": lambda s, W0, XW2W1: (np.einsum("mrde,fr->mfde", XW2W1, W0),),
    "Kronecker3Full": lambda s, W0, W1, W2, X: (
        lambda XW2: (lambda XW2W1: (np.einsum("mrde,fr->mfde", XW2W1, W0), XW2, XW2W1))(
            np.einsum("mnrd,er->mned", XW2, W1)))(np.einsum("abcr,dr->abcd", X, W2)),
    "sum_2D_1D": lambda s, I: (I.sum(1),),
    "mean_2D_1D": lambda s, I: (I.sum(1) / s["K"],),
    "sum_squares_2D_1D": lambda s, I: ((I * I).sum(1),),
    "var_2D_1D": lambda s, I, mean: ((I * I).sum(1) / s["K"] - mean * mean,),
    "sum_and_squares_2D_1D": lambda s, I: (I.sum(1), (I * I).sum(1)),
    "moments2_2D_1D": lambda s, I: (lambda m, s2: (m, s2 / s["K"] - m * m))(
        *_ref_moments(I, s["K"])),
    "wavenet1": _ref_wavenet,
    "tensordot": lambda s, I0, I1: (np.einsum("nachw,ncbhw->nabhw", I0, I1),),
    "blockdiagperm2dfissioned_1": lambda s, I, W: (np.einsum("bki,kij->bkj", I, W),),
    "blockdiagperm2dfissioned_2": lambda s, I, Idx: (I[:, Idx],),
}

# The longest sum feeding any output (for the tolerance).
TERMS = {
    "tmm": "K", "batch_matmul": "M", "_1LUT": "L1", "_2LUT": "max(L1, L2)", "_C3": "WX",
    "mlp1": "M + 1", "mlp3": "N + O + P + 3", "group_convolution": "C * KH * KW + 1",
    "convolution": "C * KH * KW + 1", "group_normalization": "1",
    "group_normalization_single_kernel": "D * H * W", "Kronecker3_1": "N2", "Kronecker3_2": "N1",
    "Kronecker3_3": "N0", "Kronecker3Full": "N0 + N1 + N2", "sum_2D_1D": "K", "mean_2D_1D": "K",
    "sum_squares_2D_1D": "K", "var_2D_1D": "K", "sum_and_squares_2D_1D": "K",
    "moments2_2D_1D": "K", "wavenet1": "2 * RESIDUAL_C + DILATION_C + 1", "tensordot": "C2",
    "blockdiagperm2dfissioned_1": "NBYK", "blockdiagperm2dfissioned_2": "1",
}


def _rtol(case: Case) -> float:
    n = eval(TERMS[case.function], {"max": max}, dict(case.reduced))  # noqa: S307 (our table)
    return max(1e-5, 3 * n * U32)


def _abs_tolerances(case: Case, inputs, ref, rtol):
    """Per-output absolute error allowed where a TC subtracts (None: relative bound only)."""
    s = case.reduced
    fn = case.function
    if fn == "var_2D_1D":
        I, mean = _f(*inputs)
        return [rtol * ((I * I).sum(1) / s["K"] + mean * mean)]
    if fn == "moments2_2D_1D":
        m, s2 = _ref_moments(*_f(inputs[0]), s["K"])
        return [None, rtol * (s2 / s["K"] + m * m)]
    if fn == "group_normalization_single_kernel":
        I, gamma, beta = _f(*inputs)
        n = s["D"] * s["H"] * s["W"]
        S, S2 = I.sum((2, 3, 4)), (I * I).sum((2, 3, 4))
        mu = S / n
        v = S2 / n - mu * mu + 1e-5
        r = 1 / np.sqrt(v)
        dmu = rtol * mu
        dv = rtol * (S2 / n + mu * mu) + 2 * mu * dmu
        dr = 0.5 * r ** 3 * dv
        e = lambda a: a[:, :, None, None, None]  # noqa: E731
        g = gamma[None, :, :, None, None]
        dO = 2 * g * (e(dmu) * e(r) + np.abs(I - e(mu)) * e(dr)) + rtol * np.abs(ref[0])
        return [dO + 1e-6, None, None]
    if fn == "group_normalization":
        # gamma * (I - mean) * rsqrt(var + eps) + beta: I - mean cancels; each operation is
        # within a few u of its operands' magnitudes.
        I, gamma, beta, mean, var = _f(*inputs)
        e = lambda a: a[:, :, None, None, None]  # noqa: E731
        g, b = gamma[None, :, :, None, None], beta[None, :, :, None, None]
        return [rtol * (g * (I + e(mean)) / np.sqrt(e(var) + 1e-5) + b)]
    return [None] * len(ref)


def check(case: Case, inputs, got) -> None:
    ref = REFERENCE[case.function](case.reduced, *_f(*inputs))
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(ref), (len(got), len(ref))
    rtol = _rtol(case)
    atols = _abs_tolerances(case, inputs, ref, rtol)
    for k, (g, r, a) in enumerate(zip(got, ref, atols)):
        g = np.asarray(g, dtype=np.float64)
        assert g.shape == r.shape, (k, g.shape, r.shape)
        allowed = rtol * np.abs(r) + (0 if a is None else a) + 1e-30
        err = np.abs(g - r)
        bad = ~(err <= allowed)  # NaN counts as bad
        if bad.any():
            i = np.unravel_index(np.argmax(np.where(bad, err / allowed, 0)), r.shape)
            pytest.fail(f"output {k}: {int(bad.sum())} of {r.size} elements wrong; worst at "
                        f"{tuple(int(x) for x in i)}: got {g[i]!r}, expected {r[i]!r} "
                        f"(allowed error {allowed[i]:.3g})", pytrace=False)


# ---------------------------------------------------------------------------------------------
# Compile and run


_COMPILED: dict = {}


def _compiled(case: Case):
    """(kernel, inputs) for a case, compiled once per process (the value and launch tests share
    it); any exception is returned, not raised, so that each test reports it."""
    if case.id not in _COMPILED:
        _COMPILED[case.id] = _compile(case)
    return _COMPILED[case.id]


def _compile(case: Case):
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    inputs = INPUTS[case.function](case.reduced, rng)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tc.TCWarning)
            kernel = tc.compile(case.source, case.function, *inputs, options=case.text,
                                target="cuda-emulated")
    except Exception as e:  # noqa: BLE001 (reported by the test)
        return e, inputs
    return kernel, inputs


def _kernel(case: Case):
    kernel, inputs = _compiled(case)
    if isinstance(kernel, Exception):
        raise kernel
    return kernel, inputs


# Cases whose values are wrong or that do not compile or run, with what happens. Every one of
# the 89 cases compiled, ran and matched the references when this file was written.
VALUES_FAIL: dict[str, str] = {}

# The value tests the README's test command runs: every case whose compilation and emulation
# took at most about 1 s on the development machine (2 shared cores), and at least one option
# set of each TC function. The others (up to 9 s each: group convolutions, the single-kernel
# group normalisation, WaveNet) are marked slow.
FAST = {
    "1lut-1LUT_V100_autotuned_B_128_D_64_L1_50_E1_10000000",
    "2lut-2LUT_V100_autotuned_B_128_D_64_L1_50_E1_10000000_L2_50_E2_10000000",
    "batchmatmul-TransposedBatchMatMul_P100_autotuned_B_500_K_26_M_72_N_26",
    "blockdiagperm-blockdiagperm2dfissioned_1_naive",
    "blockdiagperm-blockdiagperm2dfissioned_2_naive",
    "c3-C3_V100_autotuned_B_128_WX_1000_WY_1024",
    "convolution-convolution_naive",
    "group_convolution-GroupConvolution_V100_autotuned_N_32_G_32_C_4_F_4_W_56_H_56_KW_3_KH_3",
    "group_normalization-GroupNormalization_V100_autotuned_N_32_C_512_G_32_H_48_W_48",
    "group_normalization-GroupNormalizationSingleKernel_V100_autotuned_N_32_C_512_G_32_H_48_W_48",
    "kronecker3_1-Kronecker3_1_P100_autotuned_M_256_D0_16_D1_16_D2_16_N0_32_N1_32_N2_32",
    "kronecker3_1-Kronecker3_1_P100_autotuned_M_256_D0_16_D1_16_D2_16_N0_64_N1_128_N2_128",
    "kronecker3_1-Kronecker3_1_V100_autotuned_M_256_D0_16_D1_16_D2_16_N0_32_N1_32_N2_32",
    "kronecker3_1-Kronecker3_1_V100_autotuned_M_256_D0_16_D1_16_D2_16_N0_64_N1_64_N2_64",
    "kronecker3_1-Kronecker3_1_V100_autotuned_M_256_D0_16_D1_16_D2_16_N0_64_N1_128_N2_128",
    "kronecker3_2-Kronecker3_2_P100_autotuned_M_256_D0_16_D1_16_D2_16_N0_64_N1_128_N2_128",
    "kronecker3_2-Kronecker3_2_V100_autotuned_M_256_D0_16_D1_16_D2_16_N0_32_N1_32_N2_32",
    "kronecker3_2-Kronecker3_2_V100_autotuned_M_256_D0_16_D1_16_D2_16_N0_64_N1_128_N2_128",
    "kronecker3_3-Kronecker3_3_P100_autotuned_M_256_D0_16_D1_16_D2_16_N0_32_N1_32_N2_32",
    "kronecker3_3-Kronecker3_3_V100_autotuned_M_256_D0_16_D1_16_D2_16_N0_32_N1_32_N2_32",
    "kronecker3_3-Kronecker3_3_V100_autotuned_M_256_D0_16_D1_16_D2_16_N0_64_N1_64_N2_64",
    "kronecker3_3-Kronecker3_3_V100_autotuned_M_256_D0_16_D1_16_D2_16_N0_64_N1_128_N2_128",
    "kronecker3_full-Kronecker3Full_naive",
    "mlp1-MLP1_P100_autotuned_B_128_M_2000_N_128",
    "mlp1-MLP1_V100_autotuned_B_128_M_2000_N_128",
    "mlp3-MLP3_P100_autotuned_B_128_N_128_O_64_P_32_Q_2",
    "moments-Sum_2D_1D_P100_autotuned_N_128_K_2304",
    "moments-Sum_2D_1D_P100_autotuned_N_1024_K_36864",
    "moments-Mean_2D_1D_P100_autotuned_N_128_K_2304",
    "moments-Var_2D_1D_P100_autotuned_N_128_K_2304",
    "moments-Var_2D_1D_P100_autotuned_N_1024_K_36864",
    "moments-Sum_And_Squares_2D_1D_P100_autotuned_N_1024_K_36864",
    "moments-Moments2_2D_1D_P100_autotuned_N_128_K_2304",
    "moments-Moments2_2D_1D_P100_autotuned_N_1024_K_36864",
    "moments-Mean_2D_1D_V100_autotuned_N_1024_K_36864",
    "moments-Sum_Squares_2D_1D_V100_autotuned_N_128_K_2304",
    "moments-Var_2D_1D_V100_autotuned_N_128_K_2304",
    "moments-Sum_And_Squares_2D_1D_V100_autotuned_N_128_K_2304",
    "moments-Sum_And_Squares_2D_1D_V100_autotuned_N_1024_K_36864",
    "moments-Moments2_2D_1D_V100_autotuned_N_128_K_2304",
    "moments-Moments2_2D_1D_V100_autotuned_N_1024_K_36864",
    "tensordot-tensordot_naive",
    "tmm-TransposedMatMul_P100_autotuned_M_128_N_256_K_32",
    "tmm-TransposedMatMul_P100_autotuned_M_128_N_1024_K_1024",
    "wavenet-WaveNet1_P100_autotuned_B_1_RES_32_DIL_32_SKIP_256_REC_4000_F_32",
}


# (one option set per TC function in the README's test command, the first listed above; the
# others in the slow step: all of them take about 30 s of the 2 cores)
FAST = {next(c for c in sorted(FAST) if c.split("-")[0] == f)
        for f in sorted({c.split("-")[0] for c in FAST})}


def _value_params():
    out = []
    for c in CASES:
        marks = []
        if c.id in VALUES_FAIL:
            marks.append(pytest.mark.xfail(strict=True, reason=VALUES_FAIL[c.id]))
        if c.id not in FAST:
            marks.append(pytest.mark.slow)
        out.append(pytest.param(c, id=c.id, marks=marks))
    return out


@pytest.mark.parametrize("case", _value_params())
def test_values(case: Case, record_property):
    kernel, inputs = _kernel(case)
    record_property("grid", kernel.grid)
    record_property("block", kernel.block)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        got = kernel(*inputs)
    check(case, inputs, got)


# ---------------------------------------------------------------------------------------------
# TC's launch: what TC's mapper (tc/core/polyhedral/cuda/mapped_scop.cc,
# makeWithOuterBlockInnerThreadStrategy, and tighten_launch_bounds.cc) launches.

# TC's starting points (tc/core/cuda/cuda_mapping_options.cc): tile, threads, blocks, unroll.
TC_STARTS = {
    "makeNaiveMappingOptions": ((32, 32, 32), (32, 8), (256, 256), 1),
    "makeSingleThreadMappingOptions": ((1,), (1,), (1,), 1),
    "makePointwiseMappingOptions": ((32, 32, 32), (32, 4, 4), (100, 100, 100), 128),
    "makeMlpMappingOptions": ((1,), (128,), (128,), 1),
    "makeConvolutionMappingOptions": ((4, 8, 8, 8), (4, 16, 4), (256, 256, 256), 1),
    "makeGroupConvolutionMappingOptions": ((1, 1), (4, 16, 4), (256, 256), 1),
}


@dataclass(frozen=True)
class TCOptions:
    """The fields of a TC option chain that decide its launch, as TC reads the chain."""
    tile: tuple
    threads: tuple
    blocks: tuple
    match_library_calls: bool
    use_shared_memory: bool
    rescheduled: bool  # intra-tile scheduler options differ from the outer ones


def _cuda_dim(sizes) -> tuple:
    """TC's CudaDim(x, y, z), which `.mapToThreads(x, y, z)` builds, keeps y and z only up to
    the last one that is not 1 (cuda_mapping_options.cc): mapToThreads(4, 32, 1) has two
    thread dimensions, mapToBlocks(16, 64, 1) two block dimensions. The count matters: TC maps
    as many loops as there are dimensions."""
    sizes = list(sizes)
    while len(sizes) > 1 and sizes[-1] == 1:
        sizes.pop()
    return tuple(sizes)


def tc_options(text: str) -> TCOptions:
    start = re.search(r"(make\w+MappingOptions)\s*\(\s*\)", text)
    tile, threads, blocks, _ = TC_STARTS[start.group(1)]
    rest = text[start.end():]  # the calls after the starting point
    chain = tc.MappingOptions.parse(rest) if rest.strip() else tc.MappingOptions()
    called = lambda m: re.search(rf"\.\s*{m}\s*\(", text) is not None  # noqa: E731
    return TCOptions(
        tile=chain.tile_sizes if called("tile") else tile,
        threads=_cuda_dim(chain.threads if called("mapToThreads") else threads),
        blocks=_cuda_dim(chain.blocks if called("mapToBlocks") else blocks),
        match_library_calls=chain.match_library_calls,
        use_shared_memory=chain.use_shared_memory,
        rescheduled=(chain.outer_schedule_fusion_strategy
                     != chain.intra_tile_schedule_fusion_strategy
                     or chain.outer_schedule_allow_skewing
                     != chain.intra_tile_schedule_allow_skewing
                     or chain.outer_schedule_positive_orthant
                     != chain.intra_tile_schedule_positive_orthant))


# The outermost band of TC's schedule, for the TCs whose schedule is certain: one statement (a
# `+=!` reduction, whose initialisation shares the band, or a pointwise statement), whose loops
# are the left-hand indices in order (coincident), then the reduction indices in the order they
# appear (tc2halide.cc orders the loops so). Each member: (extent as an expression of the sizes,
# coincident). `add` marks a `+` reduction (what TC's reduction detection accepts).
TC_BANDS = {
    "tmm": ([("M", 1), ("N", 1), ("K", 0)], True),
    "batch_matmul": ([("B", 1), ("N", 1), ("K", 1), ("M", 0)], True),
    "_1LUT": ([("B", 1), ("D", 1), ("L1", 0)], True),
    "_C3": ([("B", 1), ("WY", 1), ("WX", 0)], True),
    "Kronecker3_1": ([("M", 1), ("N0", 1), ("N1", 1), ("D2", 1), ("N2", 0)], True),
    "Kronecker3_2": ([("M", 1), ("N0", 1), ("D1", 1), ("D2", 1), ("N1", 0)], True),
    "Kronecker3_3": ([("M", 1), ("D0", 1), ("D1", 1), ("D2", 1), ("N0", 0)], True),
    "sum_2D_1D": ([("N", 1), ("K", 0)], True),
    "sum_squares_2D_1D": ([("N", 1), ("K", 0)], True),
    "group_normalization": ([("N", 1), ("G", 1), ("D", 1), ("H", 1), ("W", 1)], False),
    "tensordot": ([("N", 1), ("C1", 1), ("C3", 1), ("H", 1), ("W", 1), ("C2", 0)], True),
    "blockdiagperm2dfissioned_1": ([("B", 1), ("K", 1), ("NBYK", 1), ("NBYK", 0)], True),
    "blockdiagperm2dfissioned_2": ([("B", 1), ("N", 1)], False),
}


def tc_launch(function: str, text: str, sizes: dict, bands: dict = TC_BANDS):
    """(grid, block) TC launches for `function` with option chain `text` at `sizes`; either is
    None where TC's choice is not certain (see the module docstring and TC_BANDS)."""
    if function not in bands:
        return None, None
    members, add = bands[function]
    o = tc_options(text)
    extents = [eval(e, {}, dict(sizes)) for e, _ in members]  # noqa: S307 (our table)
    n = len(members)
    ncoinc = next((i for i, (_, c) in enumerate(members) if not c), n)
    # Scop::tileOuterBand / bandTile: sizes cut to the band, missing ones 0 (not tiled).
    ts = (list(o.tile) + [0] * n)[:n]
    # mapToBlocksAndScaleBand: the first min(coincident, 3, #blocks) tile loops, in order, to
    # blockIdx.x, .y, .z (block = tile index mod grid size); launch bounds tightened to the
    # largest value + 1.
    grid = [1, 1, 1]
    for i in range(min(ncoinc, 3, len(o.blocks))):
        tiles = (extents[i] - 1) // ts[i] + 1 if ts[i] else 1
        grid[i] = min(tiles, o.blocks[i])
    if o.rescheduled:  # the point band is recomputed by isl (Scop::reschedule): not modelled
        return tuple(grid), None
    # Point loops: i mod T (ShiftPointLoops), with min(T, extent) values; untiled: extent.
    values = [min(t, e) if t else e for t, e in zip(ts, extents)]
    nt = len(o.threads)

    def plain():  # mapToThreads: the innermost min(coincident, #threads) coincident members,
        block = [1, 1, 1]  # innermost to threadIdx.x (mapThreadsBackward), thread = value mod X
        for j, m in enumerate(reversed(range(ncoinc - min(ncoinc, nt), ncoinc))):
            block[j] = min(values[m], o.threads[j])
        return block

    block = plain()
    # detectReductions (matchLibraryCalls): the reduction member goes to threadIdx.x and the
    # coincident members before it to .y, .z, where the tiles of that (x, y, z) box are full
    # (separateReduction); with no full tile, nothing changes; mixed: not modelled.
    if (o.match_library_calls and add and o.threads[0] != 1 and ncoinc >= nt - 1
            and ncoinc < n):
        target = list(range(ncoinc + 1 - nt, ncoinc + 1))   # outermost first; last -> x
        sizes_t = [o.threads[ncoinc - m] for m in target]
        all_full = some_full = True
        for m, s in zip(target, sizes_t):
            e, t = extents[m], ts[m]
            counts = [min(t, e - k * t) for k in range((e - 1) // t + 1)] if t else [e]
            all_full &= all(c % s == 0 for c in counts)
            some_full &= any(c >= s for c in counts)
        if all_full:
            red = [1, 1, 1]
            for m, s in zip(target, sizes_t):
                red[ncoinc - m] = min(values[m], s)
            block = [max(a, b) for a, b in zip(block, red)]  # the initialisation keeps plain()
        elif some_full:
            return tuple(grid), None
    # Shared-memory copies are mapped to threads too (mapCopiesToThreads) and count in the
    # launch bounds: certain only where the compute already uses every thread asked for.
    if o.use_shared_memory and any(block[j] != o.threads[j] for j in range(nt)):
        return tuple(grid), None
    return tuple(grid), tuple(block)


def test_tc_launch_reproduces_tc_unit_test():
    """TC's test_cuda_mapper.cc (Copy1D): O(n) = I(n) with the naive options gets blockIdx.y
    and threadIdx.y of size 1; and tmm with TC's naive options at M = N = K = 64."""
    grid, block = tc_launch("copy1d", "makeNaiveMappingOptions()", {"N": 1000},
                            {"copy1d": ([("N", 1)], False)})
    assert grid[1] == 1 and block[1] == 1
    assert (grid, block) == ((32, 1, 1), (32, 1, 1))
    assert tc_launch("tmm", "makeNaiveMappingOptions()", dict(M=64, N=64, K=64)) == \
        ((2, 2, 1), (32, 8, 1))


# Where tcstage deliberately launches otherwise than TC (docs/cuda.md, "TC's mapping rules and
# where tcstage differs"): case id -> (reason, the check that the difference is that one).
def _reduction_across_blocks(kernel, tc_grid, tc_block) -> bool:
    """A reduction split across blocks on a grid dimension TC leaves at 1: the other
    dimensions are TC's, that one holds the split (few rows: the parallel loops' blocks are
    too few to fill a GPU)."""
    across = [r.across for r in kernel.compiled.mapped.reductions if r.across is not None]
    if len(across) != 1:
        return False
    d = across[0][0]
    return tc_grid[d] == 1 and kernel.grid[d] > 1 and \
        all(g == t for k, (g, t) in enumerate(zip(kernel.grid, tc_grid)) if k != d)


def _without_library_calls(case):
    """The launch TC gives the chain without matchLibraryCalls: what tcstage gives for it."""
    def check(kernel, tc_grid, tc_block) -> bool:
        text = re.sub(r"\.matchLibraryCalls\(\s*(true|True)\s*\)", "", case.text)
        grid, block = tc_launch(case.function, text, case.reduced)
        return tuple(kernel.grid) == grid and (block is None or tuple(kernel.block) == block)
    return check


REDUCTION_ACROSS_BLOCKS = (
    "a reduction split across blocks on a grid dimension the options ask for and the parallel "
    "loops leave free, where those loops give fewer blocks than fill a GPU (parallelReductions "
    "left unset); TC never maps a reduction to blocks")
NO_LIBRARY_CALLS = (
    "matchLibraryCalls(true): TC maps the + reduction loop to threadIdx.x and the coincident "
    "loops before it to .y and .z where those thread tiles are full, and reduces with CUB; "
    "tcstage generates no library calls and launches what TC launches without the option")
DELIBERATE: dict[str, str] = {
    "moments-Sum_Squares_2D_1D_P100_autotuned_N_128_K_2304": REDUCTION_ACROSS_BLOCKS,
    "moments-Sum_2D_1D_V100_autotuned_N_128_K_2304": REDUCTION_ACROSS_BLOCKS,
    "moments-Sum_2D_1D_V100_autotuned_N_1024_K_36864": REDUCTION_ACROSS_BLOCKS,
    "moments-Sum_Squares_2D_1D_V100_autotuned_N_128_K_2304": REDUCTION_ACROSS_BLOCKS,
    "moments-Sum_Squares_2D_1D_V100_autotuned_N_1024_K_36864": REDUCTION_ACROSS_BLOCKS,
    "moments-Sum_Squares_2D_1D_P100_autotuned_N_1024_K_36864": NO_LIBRARY_CALLS,
    "tmm-TransposedMatMul_P100_autotuned_M_128_N_1024_K_1024": NO_LIBRARY_CALLS,
    "tmm-TransposedMatMul_V100_autotuned_M_128_N_1024_K_1024": NO_LIBRARY_CALLS,
}


def _launch_params():
    out = []
    for c in CASES:
        grid, block = tc_launch(c.function, c.text, c.reduced)
        if grid is not None or block is not None:
            slow = [] if c.id in FAST or c.id in DELIBERATE else [pytest.mark.slow]
            out.append(pytest.param(c, grid, block, id=c.id, marks=slow))
    return out


@pytest.mark.parametrize("case, grid, block", _launch_params())
def test_launch_is_tcs_or_a_documented_difference(case: Case, grid, block):
    """tcstage's grid and block are what TC's mapper launches (where that is certain), or
    differ in the way DELIBERATE says and docs/cuda.md documents."""
    kernel, _ = _kernel(case)
    same = (grid is None or tuple(kernel.grid) == grid) and \
        (block is None or tuple(kernel.block) == block)
    reason = DELIBERATE.get(case.id)
    if reason is None:
        assert same, (kernel.grid, kernel.block, "TC:", grid, block)
        return
    check = _reduction_across_blocks if reason == REDUCTION_ACROSS_BLOCKS else \
        _without_library_calls(case)
    assert not same and check(kernel, grid or (1, 1, 1), block), (
        f"expected the documented difference ({reason}); got {kernel.grid} {kernel.block}, "
        f"TC: {grid} {block}")


# ---------------------------------------------------------------------------------------------
# TC's starting points read as TC defines them


@pytest.mark.parametrize("start", sorted(TC_STARTS))
def test_tc_starting_points_mean_what_tc_means(start):
    """TC's option chains start from one of these (tc/core/cuda/cuda_mapping_options.cc); the
    84 tuned sets all start from makeNaiveMappingOptions() and set tile, threads, blocks and
    unroll themselves, so only untuned uses (TC's "Generic" benchmarks, its examples) see the
    starting point's own values."""
    tile, threads, blocks, unroll = TC_STARTS[start]
    opts = tc.MappingOptions.parse(f"tc::CudaMappingOptions::{start}()")
    assert (opts.tile_sizes, opts.threads, opts.blocks, opts.unroll_factor) == \
        (tile, threads, blocks, unroll)
