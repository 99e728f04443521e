"""The persistent tuning cache (tcstage/tune/cache.py): round trips, the canonical TC hash, the
nearest-size order for warm starts, concurrent writers, SIGKILL mid-run, and damaged or foreign
files. Expectations are computed by hand (sizes, minima of the times the writers drew)."""

import math
import multiprocessing
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import tcstage as tc
from tcstage.tune.cache import (Cache, CacheError, Entry, Key, cpu_device, default_path,
                                gpu_device, tc_hash)

ROOT = Path(__file__).parent.parent

MATMUL = """
def mm(float(M,K) A, float(K,N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
}
"""


def key(n=64, device="dev-a", function="f", h="0" * 64, target="cuda", **more) -> Key:
    return Key(h, function, ("float32",), {"N": n, **more}, target, device)


def entry(k: Key, time: float, options=None, measured="gpu") -> Entry:
    options = options if options is not None else tc.MappingOptions().tile(32, 8).mapToThreads(8, 32)
    return Entry(k, options, time, measured, tc.__version__, "2024-01-01T00:00:00+00:00", 7)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TCSTAGE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# -- round trip -----------------------------------------------------------------------------------
def test_round_trip_keeps_the_best_time(cache_dir):
    prog = tc.define(MATMUL)
    options = tc.MappingOptions().tile(32, 32, 8).mapToThreads(32, 4).mapToBlocks(64, 8) \
        .useSharedMemory(True).unroll(4)
    k = Key.for_call(prog.mm, {"M": 128, "K": 64, "N": 256}, "cuda", gpu_device("GPU X", (9, 0)))
    assert k.sizes == (("K", 64), ("M", 128), ("N", 256)) and k.dtypes == ("float32", "float32")
    assert k.device == "GPU X (sm_90)"
    stored = Entry.new(k, options, 2.5e-4, "gpu", candidates=120)
    with Cache() as cache:
        assert cache.path == cache_dir / "tune.sqlite"
        assert cache.get(k) is None
        assert cache.put(stored)
        assert cache.get(k) == stored
        assert not cache.put(entry(k, 3e-4))  # slower: not stored
        assert not cache.put(entry(k, 2.5e-4))  # as fast: the first stays
        assert cache.get(k) == stored
    with Cache() as cache:  # another connection reads what was committed
        got = cache.get(k)
        assert got == stored
        assert got.mapping_options() == options
        assert tc.MappingOptions.parse(got.options) == options
        faster = entry(k, 1e-4, tc.MappingOptions().tile(16))
        assert cache.put(faster)  # faster: replaces
        assert cache.get(k) == faster
        assert cache.entries() == [faster]


def test_each_way_of_measuring_keeps_its_own_best(cache_dir):
    k = key()
    with Cache() as cache:
        assert cache.put(entry(k, 5.0, measured="model"))
        assert cache.put(entry(k, 9.0, measured="gpu"))  # another kind: kept beside the model's
        assert not cache.put(entry(k, 6.0, measured="model"))
        assert cache.get(k).measured == "gpu"  # a timing is preferred to a prediction
        assert cache.get(k, measured="model").time == 5.0
        assert sorted(e.measured for e in cache.entries()) == ["gpu", "model"]
        assert cache.remove(k) == 2 and cache.get(k) is None


def test_put_refuses_invalid_entries(cache_dir):
    with Cache() as cache:
        with pytest.raises(tc.TCError, match="unknown starting point"):
            cache.put(entry(key(), 1.0, options="__import__('os')"))
        with pytest.raises(tc.TCError, match="finite"):
            cache.put(entry(key(), math.nan))
        with pytest.raises(tc.TCError, match="measured"):
            cache.put(entry(key(), 1.0, measured="guess"))
        assert cache.entries() == []


# -- the hash -------------------------------------------------------------------------------------
def test_tc_hash_ignores_layout_and_sees_meaning():
    base = tc_hash(tc.define(MATMUL).mm)
    assert len(base) == 64 and int(base, 16) >= 0
    same = ["def mm(float(M,K) A,float(K,N) B)->(C){C(m,n)+=!A(m,k)*B(k,n)}",
            "# a comment\ndef mm(float(M,K) A, # the left\n float(K,N) B) -> (C)\n{\n"
            "  C(m, n) +=! A(m, k)   *   B(k, n)   # product\n}\n",
            "def other(float(N) X) -> (Y) { Y(i) = X(i) }\n" + MATMUL
            + "def third(float(N) X) -> (Y) { Y(i) = X(i) * 2 }"]
    for source in same:
        assert tc_hash(tc.define(source).mm) == base, source
    changed = [MATMUL.replace("B", "Bt"),  # a tensor renamed
               MATMUL.replace("A(m, k) * B", "A(m, k) + B"),  # * -> +
               MATMUL.replace("float(M,K) A", "double(M,K) A"),
               MATMUL.replace("+=!", "max=!"),
               MATMUL.replace("def mm", "def mm2")]
    hashes = {tc_hash(next(iter(tc.define(s)))) for s in changed}
    assert len(hashes) == len(changed) and base not in hashes
    plus = "def f(float(N) A) -> (B) { B(i) = A(i) + 1 }"
    assert tc_hash(tc.define(plus).f) != tc_hash(tc.define(plus.replace("+ 1", "* 1")).f)
    assert tc_hash(tc.define(plus).f) != tc_hash(tc.define(plus.replace("1", "2")).f)


# -- nearest --------------------------------------------------------------------------------------
def test_nearest_orders_by_size_then_device(cache_dir):
    with Cache() as cache:
        for n in (4096, 64, 256):
            cache.put(entry(key(n), n / 1000))
        cache.put(entry(key(256, device="dev-b"), 1.0))
        cache.put(entry(key(200), 0.5))  # the exact key: left out
        cache.put(entry(key(200, h="1" * 64), 0.5))  # another TC
        cache.put(entry(key(200, function="g"), 0.5))  # another function
        cache.put(entry(key(200, target="cpu"), 0.5, measured="cpu"))  # another target
        near = cache.nearest(key(200))
        assert [(e.key.device, dict(e.key.sizes)["N"]) for e in near] == \
            [("dev-a", 256), ("dev-a", 64), ("dev-a", 4096), ("dev-b", 256)]
        assert [e.key.device for e in cache.nearest(key(200), limit=2)] == ["dev-a", "dev-a"]


# -- the default path -----------------------------------------------------------------------------
def test_default_path_honours_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TCSTAGE_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_path() == tmp_path / "home" / ".cache" / "tcstage" / "tune.sqlite"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "tcstage" / "tune.sqlite"
    monkeypatch.setenv("TCSTAGE_CACHE_DIR", str(tmp_path / "own"))
    assert default_path() == tmp_path / "own" / "tune.sqlite"
    with Cache() as cache:  # creates the directories
        cache.put(entry(key(), 1.0))
    assert (tmp_path / "own" / "tune.sqlite").is_file()


def test_cpu_device_is_stable():
    assert cpu_device() == cpu_device() and cpu_device().startswith("cpu:")


# -- concurrency ----------------------------------------------------------------------------------
def _writer(path: str, worker: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    shared, times = key(1, device="shared"), []
    with Cache(path) as cache:
        for i in range(50):
            cache.put(entry(key(i, device=f"worker{worker}"), rng.random()))
            times.append(rng.uniform(1.0, 2.0))
            cache.put(entry(shared, times[-1]))
    return times


def test_concurrent_writers_lose_nothing(tmp_path):
    path = str(tmp_path / "tune.sqlite")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        drawn = pool.starmap(_writer, [(path, w, 1000 + w) for w in range(4)])
    with Cache(path) as cache:
        for w in range(4):
            for i in range(50):
                assert cache.get(key(i, device=f"worker{w}")) is not None, (w, i)
        assert cache.get(key(1, device="shared")).time == min(min(t) for t in drawn)
        assert len(cache.entries()) == 4 * 50 + 1


# -- SIGKILL --------------------------------------------------------------------------------------
_CHILD = textwrap.dedent("""
    import sys
    import tcstage as tc
    from tcstage.tune.cache import Cache, Entry, Key
    cache = Cache(sys.argv[1])
    for i in range(1_000_000):
        k = Key("0" * 64, "f", ("float32",), {"N": i}, "cuda", "dev")
        cache.put(Entry.new(k, tc.MappingOptions().tile(i + 1), 1.0 + i, "gpu"))
        print(i, flush=True)
""")


def test_sigkill_loses_no_committed_entry(tmp_path):
    path = tmp_path / "tune.sqlite"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE,
                             text=True, cwd=ROOT)
    printed = []
    try:
        for line in child.stdout:
            printed.append(int(line))
            if len(printed) == 40:
                child.send_signal(signal.SIGKILL)
                break
        printed += [int(line) for line in child.stdout]  # printed before the kill landed
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either: the file is intact
        with Cache(path) as cache:
            stored = {dict(e.key.sizes)["N"]: e for e in cache.entries()}
    for i in printed:
        assert i in stored and stored[i].options == f"MappingOptions().tile({i + 1})", i
    assert len(stored) in (len(printed), len(printed) + 1)  # the last may commit unprinted


# -- damaged and foreign files --------------------------------------------------------------------
def _random_bytes(path: Path) -> None:
    path.write_bytes(random.Random(5).randbytes(10_000))


def _truncated(path: Path) -> None:
    with Cache(path) as cache:
        for i in range(300):
            cache.put(entry(key(i), 1.0, tc.MappingOptions().tile(i + 1, 4)))
        cache._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    os.truncate(path, path.stat().st_size // 2)


def _foreign(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO photos VALUES (1, 'cat.jpg')")
    conn.close()


def _newer(path: Path) -> None:
    with Cache(path) as cache:
        cache.put(entry(key(), 1.0))
        cache._conn.execute("UPDATE meta SET value = '99' WHERE name = 'schema'")


BAD_FILES = {"random bytes": (_random_bytes, "not an SQLite database"),
             "truncated": (_truncated, "damaged database"),
             "foreign": (_foreign, "another program.*photos"),
             "newer schema": (_newer, "newer tcstage .schema 99")}


@pytest.mark.parametrize("kind", BAD_FILES)
def test_bad_file_at_an_explicit_path_is_a_clear_error(tmp_path, kind):
    make, problem = BAD_FILES[kind]
    path = tmp_path / "mine.sqlite"
    make(path)
    before = path.read_bytes()
    with pytest.raises(CacheError, match=problem) as error:
        Cache(path)
    assert str(path) in str(error.value)
    assert path.read_bytes() == before  # the user's file is left as it was


@pytest.mark.parametrize("kind", ["random bytes", "truncated", "foreign"])
def test_bad_file_at_the_default_path_is_moved_aside(cache_dir, kind):
    make, problem = BAD_FILES[kind]
    path = cache_dir / "tune.sqlite"
    cache_dir.mkdir()
    make(path)
    before = path.read_bytes()
    with pytest.warns(tc.TCWarning, match=problem + ".*moved it to tune.sqlite.corrupt-"):
        cache = Cache()
    with cache:
        assert cache.entries() == []
        assert cache.put(entry(key(), 1.0)) and cache.get(key()).time == 1.0
    aside = [p for p in cache_dir.iterdir() if p.name.startswith("tune.sqlite.corrupt-")]
    assert [p.read_bytes() for p in aside if not p.name.endswith(("-wal", "-shm"))] == [before]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Cache() as again:  # the new file is fine
            assert again.get(key()).time == 1.0


def test_newer_cache_at_the_default_path_is_left_alone(cache_dir):
    path = cache_dir / "tune.sqlite"
    cache_dir.mkdir()
    _newer(path)
    before = path.read_bytes()
    with pytest.warns(tc.TCWarning, match="newer tcstage.*in memory"):
        cache = Cache()
    with cache:
        assert not cache.persistent
        assert cache.put(entry(key(8), 1.0)) and cache.get(key(8)).time == 1.0
    assert path.read_bytes() == before


def test_garbage_options_text_is_skipped_never_evaluated(cache_dir, tmp_path):
    marker = tmp_path / "evaluated"
    with Cache() as cache:
        cache.put(entry(key(1), 1.0))
        cache.put(entry(key(2), 2.0))
    with sqlite3.connect(cache_dir / "tune.sqlite") as conn:
        conn.execute("UPDATE entries SET options = ?, time = 0 WHERE sizes = '[[\"N\",2]]'",
                     (f"__import__('pathlib').Path({str(marker)!r}).touch()",))
        conn.execute("UPDATE entries SET sizes = 'not json' WHERE sizes = '[[\"N\",1]]'")
        conn.execute("INSERT INTO entries VALUES ('0', 'f', '[]', '[]', 'cuda', 'd', 'gpu', "
                     "'MappingOptions().tile(', 1, 'v', 'd', 0, '')")
    conn.close()
    with Cache() as cache:
        with pytest.warns(tc.TCWarning, match="skipped an entry for 'f'.*unknown starting point"):
            assert cache.get(key(2)) is None
        with pytest.warns(tc.TCWarning) as caught:
            assert cache.entries() == []
        assert len(caught) == 3 and all("skipped an entry" in str(w.message) for w in caught)
        with pytest.warns(tc.TCWarning):
            assert cache.nearest(key(3)) == []
        # A valid entry replaces the invalid one, however fast the garbage claimed to be.
        with pytest.warns(tc.TCWarning):
            assert cache.put(entry(key(2), 5.0))
        assert cache.get(key(2)).time == 5.0
    assert not marker.exists()


def test_an_entry_that_is_not_utf8_is_skipped_not_fatal(cache_dir):
    """Issue 28: one entry whose text held an invalid UTF-8 byte made sqlite3 fail the whole
    query, so every later tune of that kernel failed. It is skipped with a TCWarning, and the
    other entries are read as before."""
    with Cache() as cache:
        cache.put(entry(key(1), 1.0))
        cache.put(entry(key(2), 2.0))
    with sqlite3.connect(cache_dir / "tune.sqlite") as conn:
        conn.execute("UPDATE entries SET options = CAST(X'80FF' AS TEXT) "
                     "WHERE sizes = '[[\"N\",2]]'")
    conn.close()
    with Cache() as cache:
        with pytest.warns(tc.TCWarning, match="skipped an entry for 'f'.*options is not UTF-8"):
            assert cache.get(key(2)) is None
        assert cache.get(key(1)).time == 1.0
        with pytest.warns(tc.TCWarning):
            assert [e.time for e in cache.entries()] == [1.0]
        # a valid entry replaces it
        with pytest.warns(tc.TCWarning):
            assert cache.put(entry(key(2), 3.0))
        assert cache.get(key(2)).time == 3.0


def test_sqlite_errors_in_use_are_cache_errors(tmp_path):
    path = tmp_path / "tune.sqlite"
    cache = Cache(path)
    cache._conn.execute("DROP TABLE entries")  # the file changed under a running tuner
    with pytest.raises(CacheError, match=f"{path}.*no such table"):
        cache.get(key())
    cache.close()
    with pytest.raises(CacheError, match="after close"):
        cache.get(key())
