"""The CPU kernel cache (tcstage/halide/aot.py): compiled pipelines persist on disk, so a second
process compiles nothing; a damaged library is rebuilt, not loaded; Halide's run-time errors
keep their message; TCSTAGE_CPU_CACHE=0 compiles in-process. Results are checked against numpy.
"""

import os
import subprocess
import sys
import textwrap

import halide as hl
import numpy as np
import pytest

import tcstage as tc
from tcstage.halide import aot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import numpy as np, tcstage as tc
    from tcstage.halide import aot
    f = tc.define("def mv(float(M,K) A, float(K) x) -> (y) { y(m) +=! A(m,k) * x(k) }").mv
    A = np.arange(12, dtype=np.float32).reshape(3, 4); x = np.arange(4, dtype=np.float32)
    assert np.array_equal(f(A, x), A @ x)
    print(aot.builds)
""")


def _run_script(cache: str, **env) -> str:
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       cwd=ROOT, timeout=600,
                       env={**os.environ, "TCSTAGE_CACHE_DIR": cache, **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip()


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cache directory of the test's own (not the session's shared one), and no library
    loaded in this process yet."""
    monkeypatch.setenv("TCSTAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(aot, "_loaded", {})
    monkeypatch.setattr(aot, "_runtimes", {})
    return tmp_path / "cache" / "cpu"


def test_a_second_process_compiles_nothing(tmp_path):
    cache = str(tmp_path / "cache")
    assert int(_run_script(cache)) == 2  # the runtime library and the kernel
    files = sorted(os.listdir(os.path.join(cache, "cpu")))
    assert int(_run_script(cache)) == 0
    assert sorted(os.listdir(os.path.join(cache, "cpu"))) == files


def test_the_runtime_is_compiled_once_per_machine_not_per_version_of_tcstage(monkeypatch,
                                                                           tmp_path):
    """The runtime library's name digests what it is built from, Halide's runtime for the
    target and pool.c, not the rest of tcstage (whose digest names each kernel): a change to
    tcstage's Python leaves it in place (it took 1.3 s of CPU to compile here), a change to
    pool.c builds another."""
    target = aot._aot_target(hl.get_host_target())
    name = aot._runtime_name(target)
    monkeypatch.setattr(aot, "code_digest", lambda: "another tcstage")
    aot._runtime_name_for.cache_clear()
    assert aot._runtime_name(target) == name
    pool = tmp_path / "pool.c"
    pool.write_bytes(aot.POOL_SOURCE.read_bytes() + b"\n/* changed */\n")
    monkeypatch.setattr(aot, "POOL_SOURCE", pool)
    aot._runtime_name_for.cache_clear()
    try:
        assert aot._runtime_name(target) != name
        assert aot._runtime_name(target.with_feature(hl.TargetFeature.Debug)) != \
            aot._runtime_name(target)
    finally:
        aot._runtime_name_for.cache_clear()


def test_the_cache_can_be_turned_off(tmp_path):
    cache = str(tmp_path / "cache")
    assert int(_run_script(cache, TCSTAGE_CPU_CACHE="0")) == 0
    assert not os.path.exists(os.path.join(cache, "cpu"))


def test_without_a_c_compiler_kernels_compile_in_process(monkeypatch, own_cache):
    monkeypatch.delenv("TCSTAGE_CC", raising=False)
    monkeypatch.setattr(aot.shutil, "which", lambda name: None)
    aot._linker.cache_clear()
    try:
        X = np.arange(3, dtype=np.float32)
        with pytest.warns(tc.TCWarning, match="compiled in each process instead"):
            np.testing.assert_array_equal(_fresh_function()(X), X * X + 1)
        assert not own_cache.exists()
    finally:
        aot._linker.cache_clear()


def _fresh_function():
    return tc.define("def sq(float(N) X) -> (O) { O(i) = X(i) * X(i) + 1 }").sq


def test_a_damaged_library_is_rebuilt_with_a_warning(own_cache, monkeypatch):
    X = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(_fresh_function()(X), X * X + 1)
    (kernel,) = [n for n in os.listdir(own_cache) if n.endswith(".so")
                 and not n.startswith("runtime-")]
    with open(own_cache / kernel, "r+b") as f:  # (a bit flipped in the middle of the library)
        f.seek(os.path.getsize(own_cache / kernel) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))
    monkeypatch.setattr(aot, "_loaded", {})
    with pytest.warns(tc.TCWarning, match="is not the one tcstage built"):
        np.testing.assert_array_equal(_fresh_function()(X), X * X + 1)


def test_an_unwritable_cache_warns_and_compiles_elsewhere(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TCSTAGE_CACHE_DIR", str(blocker))
    monkeypatch.setattr(aot, "_loaded", {})
    monkeypatch.setattr(aot.CACHE, "writable", {})
    X = np.arange(4, dtype=np.float32)
    with pytest.warns(tc.TCWarning, match="cannot write its kernel cache"):
        np.testing.assert_array_equal(_fresh_function()(X), X * X + 1)
    assert blocker.read_text() == "not a directory"


def test_halides_run_time_errors_keep_their_message(own_cache):
    image = hl.ImageParam(hl.Float(32), 1, "image")
    x = hl.Var("x")
    f = hl.Func("f")
    f[x] = image[x] * 2
    run = aot.compile_pipeline(hl.Pipeline(f), [image], hl.get_jit_target_from_environment(),
                               ("test", "halides_run_time_errors"))
    a, out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    run.run([a, out], {})
    np.testing.assert_array_equal(out, a * 2)
    with pytest.raises(RuntimeError, match="image requires a buffer of exactly 1 dimensions"):
        run.run([np.zeros((2, 2), np.float32), out], {})  # the wrong rank


def test_every_scalar_type_reaches_a_cached_kernel():
    """The kernel cache's native calls (`_native.call_argv`, `_native.PreparedCall`) pass each
    scalar in its own width, signed values and values past the signed range of unsigned types
    included, and buffers with their own types, against numpy's arithmetic."""
    if not aot.enabled():
        pytest.skip("the kernel cache is off here")
    f = tc.define("""def f(double(N) X, int8 a, int16 b, int32 c, int64 d, uint8 e, uint16 g,
                          uint32 h, uint64 u, float p, double q, int8(N) Y, uint16(N) Z) -> (O) {
      O(i) = X(i) + a + b + c + d + e + g + h + u + p + q + Y(i) + Z(i)
    }""").f
    X = np.arange(5, dtype=np.float64) / 3
    Y, Z = np.array([-128, -1, 0, 1, 127], np.int8), np.array([0, 1, 2, 40000, 65535], np.uint16)
    scalars = [np.int8(-100), np.int16(-30000), np.int32(-2_000_000_000), np.int64(-(1 << 40)),
               np.uint8(250), np.uint16(65000), np.uint32(4_000_000_000), np.uint64((1 << 63) + 2048),
               np.float32(0.25), np.float64(1e-3)]
    want = X + sum(float(s) for s in scalars) + Y.astype(np.float64) + Z.astype(np.float64)
    np.testing.assert_allclose(f(X, *scalars, Y, Z), want, rtol=1e-15)
    for _ in range(2):  # (the second call of a layout is a PreparedCall's, scalars baked in)
        np.testing.assert_allclose(f(X, *(s.item() for s in scalars), Y, Z), want, rtol=1e-15)
        np.testing.assert_allclose(f(X, *scalars, Y, Z), want, rtol=1e-15)
    assert all(fast.prepared is not None for fast in f._fast_calls.values())


@pytest.mark.parametrize("thread_fails", [False, True])
def test_the_runtime_compiles_on_a_thread_meanwhile(own_cache, monkeypatch, thread_fails):
    """A cache without a runtime gets one compiled on a thread of its own while the first
    pipeline is scheduled and compiled; where that thread fails, the runtime is compiled where
    it is linked. Either way the kernel runs, and no scratch directory is left."""
    if not aot.enabled():
        pytest.skip("the kernel cache is off here")
    import threading
    monkeypatch.setattr(aot, "_runtime_objects", {})
    compiled_on = []
    real = aot._native.compile_runtime

    def compile_runtime(path, target):
        compiled_on.append(threading.current_thread().name)
        if thread_fails and len(compiled_on) == 1:
            raise RuntimeError("Halide error: no runtime today")
        real(path, target)
    monkeypatch.setattr(aot._native, "compile_runtime", compile_runtime)
    X = np.arange(6, dtype=np.float32)
    np.testing.assert_array_equal(_fresh_function()(X), X * X + 1)
    main = threading.current_thread().name
    assert compiled_on == (["tcstage-runtime", main] if thread_fails else ["tcstage-runtime"])
    names = os.listdir(own_cache)
    assert sum(n.startswith("runtime-") and n.endswith(".so") for n in names) == 1
    assert not [n for n in names if n.startswith(".build")]
    assert aot._runtime_objects == {}
    np.testing.assert_array_equal(_fresh_function()(X + 1), (X + 1) * (X + 1) + 1)
    assert len(compiled_on) == (2 if thread_fails else 1)  # (loaded: not compiled again)


def test_threads_compile_one_library_once_and_others_side_by_side(own_cache):
    """Threads asking for the same kernel share one build; different kernels compile at once
    (Halide's compile runs without the GIL). Every result is numpy's."""
    if not aot.enabled():
        pytest.skip("the kernel cache is off here")
    from concurrent.futures import ThreadPoolExecutor
    sources = [f"def f{k}(float(N) X) -> (O) {{ O(i) = X(i) * {k} + {k} }}" for k in range(3)]
    X = np.arange(7, dtype=np.float32)
    before = aot.builds

    def run(k):
        return tc.define(sources[k % 3])[f"f{k % 3}"](X)
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(run, range(6)))
    for k, r in enumerate(results):
        np.testing.assert_array_equal(r, X * (k % 3) + (k % 3))
    assert aot.builds - before == 3 + 1  # (three kernels and the runtime, each built once)


CONV_GRADIENTS = """
def padconv_grad(float(N, C, H, W) I, float(F, C, KH, KW) Wt, float(N, F, H, W) d_O)
    -> (d_I, d_Wt) {
  d_I(n, c, y, x) +=! (d_O(n, f, y - (kh - 1), x - (kw - 1)) ?? 0) * Wt(f, c, kh, kw)
    where n in 0:N, y in 0:H, x in 0:W
  d_Wt(f, c, kh, kw) +=! d_O(n, f, h, w) * (I(n, c, h + kh - 1, w + kw - 1) ?? 0.0)
    where c in 0:C, kh in 0:KH, kw in 0:KW
}
def norm_grad(float(N, C) X, float(N) mean, float(N, C) d_Y) -> (d_X, d_mean) {
  xc(n, c) = X(n, c) - mean(n)
  d_mean(n) +=! -d_Y(n, c) * xc(n, c)
  d_X(n, c) = d_Y(n, c) * xc(n, c) + d_mean(n)
}
"""


def test_outputs_that_share_nothing_compile_as_pipelines_of_their_own(own_cache,
                                                                      monkeypatch):
    """A convolution's gradient computes d_I and d_Wt from nothing they share: each is compiled
    as a pipeline of its own, the two side by side on threads (a layer's first backward waited
    for both in turn: padconv's first forward and backward, 2.4 -> 1.9 s here), and one entry
    point runs both. Outputs that share a Func (d_X reads d_mean) stay one pipeline. The
    values against numpy's."""
    if not aot.enabled():
        pytest.skip("the kernel cache is off here")
    import threading
    compiled = []
    real = aot._native.compile_object

    def compile_object(pipeline, path, arguments, name, target):
        compiled.append((name, threading.current_thread().name))
        real(pipeline, path, arguments, name, target)
    monkeypatch.setattr(aot._native, "compile_object", compile_object)
    rng = np.random.default_rng(5)
    f = tc.define(CONV_GRADIENTS)
    I, Wt = rng.standard_normal((2, 3, 6, 7)), rng.standard_normal((4, 3, 3, 3))
    d_O = rng.standard_normal((2, 4, 6, 7))
    I, Wt, d_O = (a.astype(np.float32) for a in (I, Wt, d_O))
    d_I, d_Wt = f.padconv_grad(I, Wt, d_O)
    assert sorted(n for n, _ in compiled) == [f"{aot.ENTRY}_part0", f"{aot.ENTRY}_part1"]
    assert len({thread for _, thread in compiled}) == 2
    P = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    Q = np.pad(d_O.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want_Wt = np.zeros(Wt.shape)
    for kh in range(3):
        for kw in range(3):
            want_Wt[:, :, kh, kw] = np.einsum("nfhw,nchw->fc", d_O, P[:, :, kh:kh + 6, kw:kw + 7])
    want_I = sum(np.einsum("nfyx,fc->ncyx", Q[:, :, 2 - kh:8 - kh, 2 - kw:9 - kw],
                           Wt[:, :, kh, kw]) for kh in range(3) for kw in range(3))
    np.testing.assert_allclose(d_I, want_I, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(d_Wt, want_Wt, rtol=1e-4, atol=1e-4)
    compiled.clear()
    X, mean, d_Y = (rng.standard_normal(s).astype(np.float32) for s in ((5, 6), (5,), (5, 6)))
    d_X, d_mean = f.norm_grad(X, mean, d_Y)
    assert [n for n, _ in compiled] == [aot.ENTRY]
    xc = X - mean[:, None]
    np.testing.assert_allclose(d_mean, -(d_Y * xc).sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d_X, d_Y * xc + d_mean[:, None], rtol=1e-5, atol=1e-5)


CONV_S2 = """
def conv_s2(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
  O(n,f,h,w) +=! (I(n,c,2*h+kh-1,2*w+kw-1) ?? 0) * Wt(f,c,kh,kw)
    where h in 0:(H+1)/2, w in 0:(W+1)/2
}
"""


def test_a_strided_convolutions_gradients_compile_apart(own_cache, monkeypatch):
    """The forward states its output's range in a where clause, `h in 0:(H+1)/2`; the
    generated weight gradient sums over d_O's own extent, O_2, so range inference sees d_O read
    within its bounds: no padded copy of d_O, which the input gradient (reading d_O at shifted
    places) reads too, and the two gradients compile as pipelines of their own, side by side
    (conv_s2's first forward and backward with the runtime cached: 2.7 -> 1.7 s here). The
    values against numpy's at odd sizes (H=7: the last output row reads one padded row)."""
    if not aot.enabled():
        pytest.skip("the kernel cache is off here")
    compiled = []
    real = aot._native.compile_object

    def compile_object(pipeline, path, arguments, name, target):
        compiled.append(name)
        real(pipeline, path, arguments, name, target)
    monkeypatch.setattr(aot._native, "compile_object", compile_object)
    text = tc.gradient(CONV_S2, "conv_s2")
    assert "d_O(n, f, h, w) *" in text and "h in 0:(H + 1) / 2, w" not in text.split("d_Wt")[-1]
    grad = tc.define(text).conv_s2_grad
    rng = np.random.default_rng(7)
    I, Wt = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((4, 3, 3, 3))
    d_O = rng.standard_normal((2, 4, 4, 3))
    O = np.zeros_like(d_O)  # (the backward does not read the forward's output)
    d_I, d_Wt = grad(*(a.astype(np.float32) for a in (I, Wt, O, d_O)))
    assert sorted(compiled) == [f"{aot.ENTRY}_part0", f"{aot.ENTRY}_part1"]
    P = np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1)))  # (rows -1..7, columns -1..6)
    want_Wt = np.zeros(Wt.shape)
    want_P = np.zeros(P.shape)
    for kh in range(3):
        for kw in range(3):
            window = P[:, :, kh:kh + 7:2, kw:kw + 5:2]  # (2h+kh-1, 2w+kw-1, shifted by the pad)
            want_Wt[:, :, kh, kw] = np.einsum("nfhw,nchw->fc", d_O, window)
            want_P[:, :, kh:kh + 7:2, kw:kw + 5:2] += np.einsum("nfhw,fc->nchw", d_O,
                                                                 Wt[:, :, kh, kw])
    np.testing.assert_allclose(d_Wt, want_Wt, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(d_I, want_P[:, :, 1:8, 1:7], rtol=1e-4, atol=1e-4)
