"""The persistent tuning cache: the best MappingOptions found per kernel, in one SQLite file.

    cache = Cache()                                   # $TCSTAGE_CACHE_DIR/tune.sqlite, or the
    key = Key.for_call(prog.mm, binding, "cuda", dev) # user's cache directory
    cache.put(Entry.new(key, options, time=1.2e-4, measured="gpu", candidates=200))
    best = cache.get(key)                             # Entry or None
    seeds = cache.nearest(key)                        # same TC at other sizes, then other devices

A key is the TC function's canonical hash (its tokens: whitespace, comments and the file's other
functions do not count), its name, input dtypes, sizes, target and device. Per key and per way of
measuring ('gpu', 'cpu', 'model': a model's prediction is not comparable with a timing) the cache
keeps the entry with the lowest time. Options are stored as their chain text and read back with
`MappingOptions.parse`, so the file is data: nothing in it is ever unpickled or evaluated.

Concurrency: WAL mode, a 30 s busy timeout and `BEGIN IMMEDIATE` around put's read-compare-write,
so tuners sharing the file never lose the best entry, and each put is committed before it returns
(a tuner killed with SIGKILL loses nothing it stored). Opening takes an advisory lock on
`<file>.lock`, so that only one process at a time checks, creates or moves aside the file.

A file that is not a usable cache (random bytes, a damaged database, another program's SQLite
database) opened at an explicitly given path raises `CacheError` naming the file and the problem.
At the default path it is renamed to `tune.sqlite.corrupt-<time>` with a `TCWarning` and a new
cache starts; a cache written by a newer tcstage (a newer schema) is left alone there and this
process uses a cache in memory, with a warning. An entry whose options text does not parse is
skipped with a warning.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import pathlib
import platform
import sqlite3
import threading
import time as _time
from collections.abc import Mapping

import attrs

from tcstage.errors import Source, TCArgumentError, TCError, warn

SCHEMA_VERSION = 2  # 2: entries say how they were checked; every evaluated candidate is a record
APPLICATION = "tcstage-tune"
APPLICATION_ID = int.from_bytes(b"TCst", "big")  # PRAGMA application_id: marks the file as ours
BUSY_TIMEOUT = 30.0  # seconds a writer waits for another's transaction
TARGETS = ("cuda", "cpu")
MEASURED = ("gpu", "cpu", "model")
# get/nearest prefer a timing over a model's prediction when a key has both.
_TRUST = {"gpu": 0, "cpu": 0, "model": 1}
_SQLITE_HEADER = b"SQLite format 3\x00"


class CacheError(TCError):
    """The tuning cache file cannot be used; the message names the file and what is wrong."""


# -- the key -------------------------------------------------------------------------------------
def tc_hash(fn) -> str:
    """Hex sha256 of the TC function's tokens (kind and spelling), so whitespace, comments and
    the other functions of its file do not change it, and any change of meaning does.
    `fn`: a `TCFunction` (`prog[name]`) or a checked function."""
    import hashlib

    from tcstage.lang.lexer import tokenize

    if hasattr(fn, "fingerprint"):  # a Halide pipeline: its definitions and output shapes
        return fn.fingerprint
    checked = getattr(fn, "checked", fn)
    span = getattr(checked, "span", None)
    if span is not None:
        def tokens(span):
            return [(t.kind, t.text) for t in tokenize(Source(span.text())) if t.kind != "eof"]
        key = ["tc-tokens-1", tokens(span)]
        # the functions its calls inlined (their source is elsewhere): a change there is one here
        key += [tokens(c.span) for c in _inlined(checked) if c.span is not None]
        if checked is not getattr(fn, "written", checked):  # half/bfloat16 sums accumulating
            key.append("float32-accumulators")          # in float32 (lang/accumulate.py)
        text = json.dumps(key, separators=(",", ":"))
    else:  # built without source (no span): the typed IR's repr, which leaves spans out
        text = json.dumps(["tc-ir-1", repr(checked)])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _inlined(fn) -> list:
    """The functions inlined into fn by its calls, directly or not, each once, in call order."""
    out, seen = [], set()

    def visit(f):
        for c in getattr(f, "callees", ()):
            if c.name not in seen:
                seen.add(c.name)
                out.append(c)
                visit(c)

    visit(fn)
    return out


def default_path() -> pathlib.Path:
    """$TCSTAGE_CACHE_DIR/tune.sqlite, else $XDG_CACHE_HOME/tcstage/tune.sqlite, else
    ~/.cache/tcstage/tune.sqlite (%LOCALAPPDATA%\\tcstage on Windows)."""
    own = os.environ.get("TCSTAGE_CACHE_DIR")
    if own:
        return pathlib.Path(own).expanduser() / "tune.sqlite"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec: relative values are ignored
        return pathlib.Path(xdg) / "tcstage" / "tune.sqlite"
    if os.name == "nt" and os.environ.get("LOCALAPPDATA"):
        return pathlib.Path(os.environ["LOCALAPPDATA"]) / "tcstage" / "tune.sqlite"
    return pathlib.Path.home() / ".cache" / "tcstage" / "tune.sqlite"


def cpu_device() -> str:
    """The CPU as a device name, `cpu:<machine>:<best vector ISA>` (e.g. 'cpu:x86_64:avx2'):
    what decides which Halide schedules run fast, stable per machine."""
    machine = platform.machine().lower() or "unknown"
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip().lower() in ("flags", "features"):
                    flags = set(value.split())
                    break
    except OSError:
        pass
    ladder = {
        "x86_64": (("avx512f", "avx512"), ("avx2", "avx2"), ("avx", "avx"), ("sse4_2", "sse4.2")),
        "aarch64": (("sve2", "sve2"), ("sve", "sve"), ("asimd", "neon")),
    }.get(machine, ())
    isa = next((name for flag, name in ladder if flag in flags), None)
    if isa is None and machine == "aarch64":
        isa = "neon"  # every AArch64 CPU has it, including those without /proc/cpuinfo
    return f"cpu:{machine}:{isa}" if isa else f"cpu:{machine}"


def gpu_device(name: str, capability: tuple[int, int]) -> str:
    """A GPU as a device name: 'NVIDIA H100 80GB HBM3 (sm_90)'."""
    return f"{name} (sm_{capability[0]}{capability[1]})"


def _sorted_sizes(sizes) -> tuple[tuple[str, int], ...]:
    items = sizes.items() if isinstance(sizes, Mapping) else sizes
    return tuple(sorted((str(k), int(v)) for k, v in items))


@attrs.frozen
class Key:
    tc_hash: str
    function: str
    dtypes: tuple[str, ...] = attrs.field(converter=lambda d: tuple(str(x) for x in d))
    sizes: tuple[tuple[str, int], ...] = attrs.field(converter=_sorted_sizes)  # sorted by name
    target: str  # 'cuda' or 'cpu'
    device: str  # e.g. 'NVIDIA H100 80GB HBM3 (sm_90)', 'model:H100 (sm_90)', cpu_device()

    @classmethod
    def for_call(cls, fn, binding_or_sizes, target: str, device: str) -> "Key":
        """The key of a call: `fn` a TCFunction; sizes from a `Binding` (its sizes and the
        scalar inputs the function specialises on) or a mapping / pairs of size -> int."""
        checked = getattr(fn, "checked", fn)
        b = binding_or_sizes
        if hasattr(b, "sizes") and hasattr(b, "scalars"):  # a program.Binding
            spec = b.specialization(fn) if hasattr(fn, "specialized_scalars") else ()
            sizes = {**b.sizes, **dict(spec)}
        else:
            sizes = b
        return cls(tc_hash(fn), checked.name, tuple(str(t.type) for t in checked.inputs),
                   sizes, target, device)

    def size_distance(self, other: "Key") -> float:
        """Sum over the sizes of |log2(a / b)|; a size only one side has counts 64."""
        mine, theirs = dict(self.sizes), dict(other.sizes)
        total = 0.0
        for name in mine.keys() | theirs.keys():
            if name not in mine or name not in theirs:
                total += 64.0
                continue
            a, b = mine[name], theirs[name]
            if a != b:
                total += abs(math.log2(max(a, 1)) - math.log2(max(b, 1))) + (a <= 0 or b <= 0)
        return total


def _options_text(value) -> str:
    return value if isinstance(value, str) else str(value)  # a MappingOptions prints its chain


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@attrs.frozen
class Entry:
    key: Key
    options: str = attrs.field(converter=_options_text)  # chain text; MappingOptions.parse reads it
    time: float  # seconds (measured) or the model's estimate
    measured: str  # 'gpu', 'model' or 'cpu'
    version: str  # tcstage.__version__ that found it
    date: str  # ISO date-time, UTC
    candidates: int = 0  # how many candidates were evaluated to find it
    checked: str = ""  # how its result was checked ("gpu", "emulated", "sampled (...)", "cpu");
    #                    "" where it was not (too large to check here)

    @classmethod
    def new(cls, key: Key, options, time: float, measured: str, candidates: int = 0,
            checked: str = "") -> "Entry":
        """An entry stamped with this tcstage's version and the current time."""
        import tcstage

        return cls(key, options, float(time), measured, tcstage.__version__, _now(), candidates,
                   checked)

    def mapping_options(self):
        """The options as a `MappingOptions` (parsed from the stored text)."""
        from tcstage.options import MappingOptions

        return MappingOptions.parse(self.options)


# -- the database --------------------------------------------------------------------------------
_KEY_COLUMNS = ("tc_hash", "function", "dtypes", "sizes", "target", "device")
_COLUMNS = (*_KEY_COLUMNS, "measured", "options", "time", "version", "date", "candidates",
            "checked")
# one row per evaluated candidate of every run: what `tcstage cache export` writes
RECORD_COLUMNS = (*_KEY_COLUMNS, "run", "position", "options", "status", "time", "predicted",
                  "checked", "detail", "source", "measured", "version", "date")
_RECORDS = """
CREATE TABLE records (
    tc_hash TEXT NOT NULL, function TEXT NOT NULL, dtypes TEXT NOT NULL, sizes TEXT NOT NULL,
    target TEXT NOT NULL, device TEXT NOT NULL, run TEXT NOT NULL, position INTEGER NOT NULL,
    options TEXT NOT NULL, status TEXT NOT NULL, time REAL, predicted REAL,
    checked TEXT NOT NULL, detail TEXT NOT NULL, source TEXT NOT NULL, measured TEXT NOT NULL,
    version TEXT NOT NULL, date TEXT NOT NULL, PRIMARY KEY (run, position));
CREATE INDEX records_by_tc ON records (tc_hash, function, dtypes, target)
"""
_SCHEMA = f"""
CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE entries (
    tc_hash TEXT NOT NULL, function TEXT NOT NULL, dtypes TEXT NOT NULL, sizes TEXT NOT NULL,
    target TEXT NOT NULL, device TEXT NOT NULL, measured TEXT NOT NULL,
    options TEXT NOT NULL, time REAL NOT NULL, version TEXT NOT NULL, date TEXT NOT NULL,
    candidates INTEGER NOT NULL DEFAULT 0, checked TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (tc_hash, function, dtypes, sizes, target, device, measured));
CREATE INDEX entries_by_tc ON entries (tc_hash, function, dtypes, target);
{_RECORDS};
INSERT INTO meta VALUES ('application', '{APPLICATION}'), ('schema', '{SCHEMA_VERSION}');
PRAGMA application_id = {APPLICATION_ID};
"""


def _json(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def _key_row(key: Key) -> tuple:
    return (key.tc_hash, key.function, _json(list(key.dtypes)), _json([list(p) for p in key.sizes]),
            key.target, key.device)


class _Unusable(Exception):
    """The file is not a cache this version can use. kind: 'corrupt', 'foreign' or 'newer'."""

    def __init__(self, kind: str, problem: str):
        super().__init__(problem)
        self.kind, self.problem = kind, problem


@contextlib.contextmanager
def _open_lock(path: pathlib.Path):
    """An advisory lock on <file>.lock while a process checks, creates or moves aside the
    database (where the platform or the directory does not allow one, none)."""
    try:
        import fcntl
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


class Cache:
    """The tuning cache at `path` (None: `default_path()`). See the module's docstring."""

    def __init__(self, path=None):
        self.explicit = path is not None
        self.path = pathlib.Path(path) if self.explicit else default_path()
        self.persistent = True  # False when a newer tcstage's file forced a cache in memory
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._inherited: list[sqlite3.Connection] = []  # connections of a parent before fork
        self._target = str(self.path)  # what a forked child connects to
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CacheError(f"tuning cache {self.path}: cannot create its directory: "
                             f"{e.strerror or e}") from None
        if self.path.is_dir():
            raise CacheError(f"tuning cache {self.path}: is a directory, not a database file")
        self.readonly = not _writable(self.path)
        if self.readonly:  # read, never written (a shared or archived cache)
            self._conn = self._open_readonly()
            self._pid = os.getpid()
            return
        with _open_lock(self.path):
            try:
                self._conn = self._open()
            except _Unusable as bad:
                if self.explicit:
                    raise CacheError(f"tuning cache {self.path}: {bad.problem}", notes=(
                        "move or delete the file, or pass another path",)) from None
                self._recover(bad)
        self._pid = os.getpid()

    # -- opening -----------------------------------------------------------------------------
    def _open_readonly(self) -> sqlite3.Connection:
        """A cache this process may not write: read as it is (immutable: no lock, no journal),
        with a warning once that nothing will be stored; where it cannot be read as a cache
        of this version, a cache in memory instead."""
        why = f"tuning cache {self.path}: cannot be written (a read-only file or directory)"
        if self.path.exists():
            try:
                self._target = f"{self.path.resolve().as_uri()}?mode=ro&immutable=1"
                conn = self._connect(self._target)
                tables = {r[0] for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'")}
                self._check_ours(conn, tables, conn.execute("PRAGMA application_id").fetchone()[0],
                                 upgrade=False)
                warn(f"{why}; it is read, and this process's tuning results are not stored")
                return conn
            except (sqlite3.Error, _Unusable) as e:
                problem = e.problem if isinstance(e, _Unusable) else f"damaged database ({e})"
                if self.explicit:
                    raise CacheError(f"{why}, and it cannot be read: {problem}") from None
                why += f", and it cannot be read as it is ({problem})"
        warn(f"{why}; this process keeps its tuning results in memory only")
        self.persistent, self.readonly = False, False
        conn = self._connect(":memory:")
        self._check(conn)
        return conn

    def _connect(self, target) -> sqlite3.Connection:
        conn = sqlite3.connect(target, timeout=BUSY_TIMEOUT, isolation_level=None,
                               check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")
        # (text that is not UTF-8 is read, not refused: sqlite3's strict decoding failed the
        # whole query, so one such row broke every later tune of its kernel; `_entry` skips it)
        conn.text_factory = lambda raw: raw.decode("utf-8", "surrogateescape")
        return conn

    def _open(self) -> sqlite3.Connection:
        """A connection to a checked (or newly created) cache; raises _Unusable."""
        try:
            with open(self.path, "rb") as f:
                head = f.read(len(_SQLITE_HEADER))
        except FileNotFoundError:
            head = b""
        except OSError as e:
            raise CacheError(f"tuning cache {self.path}: cannot read it: {e.strerror or e}") from None
        if head and head != _SQLITE_HEADER:
            raise _Unusable("corrupt", "not an SQLite database (its first bytes are not "
                                       "SQLite's header)")
        try:
            conn = self._connect(str(self.path))
        except sqlite3.Error as e:
            raise CacheError(f"tuning cache {self.path}: cannot open it: {e}") from None
        try:
            self._check(conn)
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                conn.execute("PRAGMA journal_mode = WAL")  # persistent: once per file
        except _Unusable:
            conn.close()
            raise
        except sqlite3.DatabaseError as e:
            conn.close()
            if isinstance(e, sqlite3.OperationalError) and "locked" in str(e):
                raise CacheError(f"tuning cache {self.path}: locked by another process for "
                                 f"over {BUSY_TIMEOUT:g} s") from None
            raise _Unusable("corrupt", f"damaged database ({e})") from None
        return conn

    def _check(self, conn: sqlite3.Connection) -> None:
        """Raises _Unusable unless the database is ours and intact; creates an empty one."""
        check = conn.execute("PRAGMA quick_check").fetchall()
        if check != [("ok",)]:
            raise _Unusable("corrupt", "damaged database (SQLite's quick_check: "
                                       f"{'; '.join(str(r[0]) for r in check[:3])})")
        with _immediate(conn):
            tables = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            if not tables and app_id == 0:
                # Statement by statement: executescript would commit the BEGIN first.
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    conn.execute(statement)
            else:
                self._check_ours(conn, tables, app_id)

    def _check_ours(self, conn, tables: set[str], app_id: int, upgrade: bool = True) -> None:
        meta = {}
        if "meta" in tables:
            try:
                meta = dict(conn.execute("SELECT name, value FROM meta"))
            except sqlite3.OperationalError:
                meta = {}
        if app_id not in (0, APPLICATION_ID) or meta.get("application") != APPLICATION:
            shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
            raise _Unusable("foreign", "an SQLite database of another program, not a tcstage "
                                       f"tuning cache (its tables: {shown or 'none'})")
        try:
            schema = int(meta.get("schema", ""))
        except ValueError:
            raise _Unusable("corrupt", f"its schema version {meta.get('schema')!r} is not a "
                                       "number") from None
        if schema > SCHEMA_VERSION:
            raise _Unusable("newer", f"written by a newer tcstage (schema {schema}; this "
                                     f"version reads up to {SCHEMA_VERSION})")
        columns = {r[1] for r in conn.execute("PRAGMA table_info(entries)")}
        if not columns:
            raise _Unusable("corrupt", "it has no entries table")
        if schema < SCHEMA_VERSION and not upgrade:
            raise _Unusable("older", f"written by an earlier tcstage (schema {schema}), which "
                                     "this version upgrades when it may write the file")
        if schema == 1 and "checked" not in columns:  # an earlier tcstage's cache: upgraded
            # (its entries did not record a check: they read as unchecked)
            conn.execute("ALTER TABLE entries ADD COLUMN checked TEXT NOT NULL DEFAULT ''")
            columns.add("checked")
        if schema == 1:
            if "records" not in tables:
                for statement in filter(str.strip, _RECORDS.split(";")):
                    conn.execute(statement)
            conn.execute("UPDATE meta SET value = ? WHERE name = 'schema'", (str(SCHEMA_VERSION),))
        if not set(_COLUMNS) <= columns:
            raise _Unusable("corrupt", "its entries table lacks columns "
                                       f"{', '.join(sorted(set(_COLUMNS) - columns))}")

    def _recover(self, bad: _Unusable) -> None:
        """At the default path: a newer tcstage's file is left alone (this process keeps a cache
        in memory); anything else is moved aside and a new cache starts."""
        if bad.kind == "newer":
            warn(f"tuning cache {self.path}: {bad.problem}; it is left as it is and this "
                 "process keeps its tuning results in memory only")
            self._conn = self._connect(":memory:")
            self._check(self._conn)
            self.persistent = False
            return
        aside = self.path.with_name(
            f"{self.path.name}.corrupt-{_time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        try:
            # A WAL left beside a new database would be replayed into it: it goes too.
            for suffix in ("-wal", "-shm", ""):
                if os.path.exists(f"{self.path}{suffix}"):
                    os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
        except OSError as e:
            raise CacheError(f"tuning cache {self.path}: {bad.problem}, and moving it aside "
                             f"failed: {e.strerror or e}") from None
        warn(f"tuning cache {self.path}: {bad.problem}; moved it to {aside.name} and started a "
             "new cache")
        try:
            self._conn = self._open()
        except _Unusable as again:
            raise CacheError(f"tuning cache {self.path}: {again.problem}") from None

    # -- use -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _db(self, what: str):
        """The connection (a new one in a forked child: SQLite connections do not survive
        fork), with SQLite's errors turned into CacheError naming the file."""
        with self._lock:
            if self._conn is None:
                raise CacheError(f"tuning cache {self.path}: used after close()")
            if os.getpid() != self._pid and self.persistent:
                # The parent's connection is kept, unused and unclosed: closing it here could
                # checkpoint or unlock the parent's file.
                self._inherited.append(self._conn)
                self._conn = self._connect(self._target)
                self._pid = os.getpid()
            try:
                yield self._conn
            except sqlite3.Error as e:
                if self._conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.execute("ROLLBACK")
                if isinstance(e, sqlite3.OperationalError) and "locked" in str(e):
                    raise CacheError(f"tuning cache {self.path}: {what}: locked by another "
                                     f"process for over {BUSY_TIMEOUT:g} s") from None
                raise CacheError(f"tuning cache {self.path}: {what}: {e}") from None

    def _rows(self, sql: str, params: tuple, what: str) -> list[tuple]:
        with self._db(what) as conn:
            return conn.execute(sql, params).fetchall()

    def _entry(self, row: tuple) -> Entry | None:
        """An entry from a row, or None (with a warning) when the row does not hold valid data:
        options text is only ever parsed, never evaluated."""
        from tcstage.options import MappingOptions

        values = dict(zip(_COLUMNS, row))
        try:
            for column, value in values.items():
                if isinstance(value, str) and not value.isascii():
                    try:  # (the bytes text_factory kept as they were do not encode)
                        value.encode("utf-8")
                    except UnicodeEncodeError:
                        raise ValueError(f"its {column} is not UTF-8 text") from None
            key = Key(values["tc_hash"], values["function"], json.loads(values["dtypes"]),
                      json.loads(values["sizes"]), values["target"], values["device"])
            entry = Entry(key, values["options"], float(values["time"]), values["measured"],
                          str(values["version"]), str(values["date"]), int(values["candidates"]),
                          str(values["checked"]))
            if not isinstance(entry.options, str):
                raise TypeError("options are not text")
            MappingOptions.parse(entry.options)
        except Exception as e:  # any malformed row: skipped, whatever it holds
            reason = e.message if isinstance(e, TCError) else f"{type(e).__name__}: {e}"
            warn(f"tuning cache {self.path}: skipped an entry for "
                 f"'{values.get('function')}' on {values.get('device')} whose data is invalid: "
                 f"{reason.splitlines()[0] if reason else ''}")
            return None
        return entry

    def _select(self, where: str, params: tuple, what: str) -> list[Entry]:
        rows = self._rows(f"SELECT {', '.join(_COLUMNS)} FROM entries {where}", params, what)
        return [e for e in map(self._entry, rows) if e is not None]

    def get(self, key: Key, measured: str | None = None) -> Entry | None:
        """The entry stored for exactly `key`: of the given way of measuring, or (None) the
        timed one ('gpu', 'cpu') where there is one, else the model's."""
        where = " AND ".join(f"{c} = ?" for c in _KEY_COLUMNS)
        params = _key_row(key)
        if measured is not None:
            where, params = where + " AND measured = ?", (*params, measured)
        found = self._select(f"WHERE {where}", params, "reading an entry")
        return min(found, key=_preference, default=None)

    def put(self, entry: Entry) -> bool:
        """Stores `entry` unless the cache holds one at least as fast for its key and way of
        measuring; returns whether it was stored. Committed before it returns. A read-only
        cache stores nothing (it said so when opened)."""
        _validate(entry)
        if self.readonly:
            return False
        row = (*_key_row(entry.key), entry.measured, entry.options, float(entry.time),
               entry.version, entry.date, int(entry.candidates), entry.checked)
        where = " AND ".join(f"{c} = ?" for c in (*_KEY_COLUMNS, "measured"))
        with self._db("storing an entry") as conn:
            # IMMEDIATE takes the write lock before reading, so no other writer can slip a
            # better entry in between the comparison and the write.
            with _immediate(conn):
                old = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM entries WHERE {where}",
                                   row[:7]).fetchone()
                old = old and self._entry(old)  # an invalid stored row counts as none
                # a checked entry is never displaced by an unchecked one; a NaN stored is
                better = old is None or _rank(entry) < _rank(old) or not (old.time == old.time)
                if better:
                    conn.execute(f"INSERT OR REPLACE INTO entries ({', '.join(_COLUMNS)}) "
                                 f"VALUES ({', '.join('?' * len(_COLUMNS))})", row)
        return better

    def nearest(self, key: Key, limit: int = 10) -> list[Entry]:
        """Entries of the same TC (hash, function, dtypes, target) at other sizes or devices,
        one per key (the preferred way of measuring), for seeding a search: those of `key`'s
        device first, then the others', each ordered by `Key.size_distance`. The exact key is
        left out."""
        found = self._select("WHERE tc_hash = ? AND function = ? AND dtypes = ? AND target = ?",
                             _key_row(key)[:3] + (key.target,), "reading entries")
        best: dict[Key, Entry] = {}
        for e in found:
            if e.key != key and (e.key not in best or _preference(e) < _preference(best[e.key])):
                best[e.key] = e
        ranked = sorted(best.values(), key=lambda e: (
            e.key.device != key.device, key.size_distance(e.key), e.key.device, e.key.sizes))
        return ranked[:max(0, limit)]

    def record(self, key: Key, run: str, candidates, measured: str) -> None:
        """Stores evaluated candidates (`tcstage.tune.result.Candidate`) of tuning run `run`
        for `key`, each once (a candidate already stored is left as it is)."""
        import tcstage

        if self.readonly:
            return
        rows = [(*_key_row(key), run, c.index, c.options, c.status, c.time, c.predicted,
                 c.checked, c.detail, c.source, measured, tcstage.__version__, _now())
                for c in candidates]
        with self._db("storing tuning records") as conn, _immediate(conn):
            conn.executemany(f"INSERT OR IGNORE INTO records ({', '.join(RECORD_COLUMNS)}) "
                             f"VALUES ({', '.join('?' * len(RECORD_COLUMNS))})", rows)

    def records(self) -> list[dict]:
        """Every stored candidate record, oldest run first, as plain data (what `tcstage cache
        export` writes, one JSON object per line)."""
        rows = self._rows(f"SELECT {', '.join(RECORD_COLUMNS)} FROM records ORDER BY date, run, "
                          "position", (), "reading tuning records")
        out = []
        for row in rows:
            r = dict(zip(RECORD_COLUMNS, row))
            try:
                r["dtypes"], r["sizes"] = json.loads(r["dtypes"]), dict(json.loads(r["sizes"]))
                json.dumps(r)  # (text that is not UTF-8 cannot be exported: skipped)
            except (ValueError, TypeError, UnicodeEncodeError):
                warn(f"tuning cache {self.path}: skipped a tuning record of run {r['run']!r} "
                     "whose data is invalid")
                continue
            out.append(r)
        return out

    def entries(self) -> list[Entry]:
        """Every valid entry, in a stable order."""
        return self._select("ORDER BY " + ", ".join((*_KEY_COLUMNS, "measured")), (),
                            "reading entries")

    def remove(self, key: Key | None = None) -> int:
        """Deletes the entries of `key` (every way of measuring), or all with None; returns
        how many were deleted."""
        if self.readonly:
            raise CacheError(f"tuning cache {self.path}: cannot be written (a read-only file "
                             "or directory), so nothing can be deleted from it")
        with self._db("deleting entries") as conn:
            if key is None:
                conn.execute("DELETE FROM records")
                return conn.execute("DELETE FROM entries").rowcount
            where = " AND ".join(f"{c} = ?" for c in _KEY_COLUMNS)
            return conn.execute(f"DELETE FROM entries WHERE {where}", _key_row(key)).rowcount

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                if os.getpid() == self._pid:  # a forked child's copy is the parent's to close
                    self._conn.close()
                self._conn = None

    def __enter__(self) -> "Cache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<tcstage tuning cache {self.path if self.persistent else ':memory:'}>"


def _rank(e: Entry) -> tuple:
    """Within one key and way of measuring: checked before unchecked, then faster."""
    return (not e.checked, e.time)


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection):
    """A write transaction that takes its lock before its first read (BEGIN IMMEDIATE),
    committed at the end and rolled back on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _writable(path: pathlib.Path) -> bool:
    """Whether this process may write the cache at `path` (and its journal beside it)."""
    directory = os.access(path.parent, os.W_OK | os.X_OK)
    return directory and (not path.exists() or os.access(path, os.W_OK))


def _preference(e: Entry) -> tuple:
    return (_TRUST.get(e.measured, 2), *_rank(e))


def _validate(entry: Entry) -> None:
    from tcstage.options import MappingOptions

    k = entry.key
    if k.target not in TARGETS:
        raise TCArgumentError(f"tuning cache key: target {k.target!r} is not one of {TARGETS}")
    if entry.measured not in MEASURED:
        raise TCArgumentError(f"tuning cache entry: measured {entry.measured!r} is not one of "
                              f"{MEASURED}")
    if not (isinstance(entry.time, (int, float)) and math.isfinite(entry.time) and entry.time >= 0):
        raise TCArgumentError(f"tuning cache entry: time {entry.time!r} is not a finite number "
                              ">= 0")
    MappingOptions.parse(entry.options)  # raises TCOptionsError: only valid chains are stored
