"""Reliability figures: kills mid-injection, writers and readers at once, backups under load.

    .venv/bin/python bench/bench_reliability.py                      # everything; writes bench/results/
    .venv/bin/python bench/bench_reliability.py --kills 20 --seconds 20

The harnesses are also what tests/test_reliability.py runs and asserts on:

  kill_loop    `kdb inject --jsonl` SIGKILLed at random moments; after each kill the DB is checked against
               what the run reported as committed (integrity, complete rows, nothing lost or doubled)
  Contention   two `kdb inject --jsonl` processes, one process deleting random rows, a compiler-like reader
               (no busy timeout, NNFusion's fetch query), a console-like pager and a WAL-size poller
  backup_under_write  `kdb db backup` while another process injects

Insert latency is the time of one KernelDB.insert (BEGIN IMMEDIATE .. COMMIT, the wait for the write lock
included), measured inside the real CLI processes by a wrapper (`--timed-kdb`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.request import pathname2url

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from shared_data import write_corpus  # noqa: E402

# NNFusion's own fetch (engine/cache/manager.cpp), as the compiler runs it.
FETCH = ("SELECT Key, Identifier, OpType, Attributes, Source, DeviceType, Function, Tags, Miscs FROM KernelCache "
         "WHERE (Identifier = ?) AND (DeviceType = ?)")
FUNCTION_KEYS = {"function_signature", "function_body", "grid_dim", "block_dim", "block_function_body",
                 "shared_memory", "num_syncthreads"}


class CheckFailed(AssertionError):
    """A reliability property did not hold (raised even under python -O)."""


def check(ok: object, message: str) -> None:
    if not ok:
        raise CheckFailed(message)


def kdb_argv(*args: str, timed: Path | None = None) -> list[str]:
    """The real CLI, optionally wrapped so that each KernelDB.insert is timed into `timed`."""
    if timed is None:
        return [sys.executable, "-m", "console.entry", *args]
    return [sys.executable, __file__, "--timed-kdb", str(timed), *args]


def split_corpus(n: int, dests: list[Path]) -> list[Path]:
    """n distinct kernels dealt out, whole files at a time, into len(dests) disjoint corpora."""
    with tempfile.TemporaryDirectory(prefix="kdb-corpus-") as tmp:
        write_corpus(n, Path(tmp))
        for d in dests:
            d.mkdir(parents=True, exist_ok=True)
        for i, part in enumerate(sorted(Path(tmp).glob("*.json"))):
            part.rename(dests[i % len(dests)] / part.name)
    return dests


def read_events(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of a --jsonl log; a torn last line was never reported, so it is dropped."""
    data = path.read_bytes() if path.exists() else b""
    lines = data.split(b"\n")[:-1]  # no newline after the last piece: torn (or empty)
    return [json.loads(line) for line in lines if line.startswith(b"{")]


def row_problems(values: tuple[Any, ...]) -> list[str]:
    """Why a stored row is not a complete kernel (empty: it is one)."""
    from core.kernels.kernel_row import kernel_key

    if len(values) != 9 or any(not isinstance(v, str) for v in values):
        return ["a column is NULL or not text"]
    key, identifier, _, attributes, _, _, function, _, miscs = values
    try:
        json.loads(attributes)
        fn = json.loads(function)
        misc = json.loads(miscs)
    except ValueError as exc:
        return [f"a JSON column does not parse: {exc}"]
    problems = []
    if not isinstance(fn, dict) or not set(fn) >= FUNCTION_KEYS:
        return [f"Function lacks {sorted(FUNCTION_KEYS - set(fn if isinstance(fn, dict) else {}))}"]
    if not isinstance(fn["num_syncthreads"], int):
        problems.append("num_syncthreads is not an int")
    if kernel_key(identifier, tuple(fn["grid_dim"]), tuple(fn["block_dim"]), fn["function_body"]) != key:
        problems.append("Key does not match the stored kernel (columns from different writes?)")
    if "from" not in misc.get("kdb", {}):
        problems.append("Miscs lacks kdb.from")
    return problems


def read_only(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{pathname2url(str(db.resolve()))}?mode=ro", uri=True)


def read_rows(db: Path) -> dict[str, tuple[Any, ...]]:
    """Every kernel's row by Key, after PRAGMA integrity_check, through a read-only connection (as the next start
    finds it). A fused kernel's CUDA twin (its row as DeviceType CUDA, Key + '#CUDA') is written and deleted with
    it in one transaction: checked to be there and equal to its kernel's row, none orphaned, then left out."""
    from core.kernels.kernel_row import twin_key
    from core.kernels.ops import FUSED_OP_TYPES, PATTERN_DEVICE_TYPE

    conn = read_only(db)
    try:
        integrity = [r[0] for r in conn.execute("PRAGMA integrity_check")]
        check(integrity == ["ok"], f"integrity_check of {db}: {integrity[:5]}")
        rows = conn.execute("SELECT Key, Identifier, OpType, Attributes, Source, DeviceType, Function, Tags, Miscs "
                            "FROM KernelCache").fetchall()
    finally:
        conn.close()
    out = {r[0]: tuple(r) for r in rows}
    check(len(out) == len(rows), f"{len(rows) - len(out)} duplicate Keys")
    twins = {key: values for key, values in out.items() if values[5] == PATTERN_DEVICE_TYPE}
    kernels = {key: values for key, values in out.items() if key not in twins}
    expected = {twin_key(key): (twin_key(key), *v[1:5], PATTERN_DEVICE_TYPE, *v[6:])
                for key, v in kernels.items() if v[2] in FUSED_OP_TYPES}
    check(set(twins) == set(expected), f"{len(set(expected) - set(twins))} fused kernels without their CUDA twin, "
                                       f"{len(set(twins) - set(expected))} twins without their kernel")
    check(all(twins[key] == twin for key, twin in expected.items()), "a CUDA twin differs from its kernel's row")
    return kernels


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


# ---------------------------------------------------------------------------------------------
# Kills


@dataclass
class KillStats:
    kernels: int = 0
    kills: int = 0
    startup_kills: int = 0  # kills aimed before the first commit (opening, WAL recovery, look-ups)
    kills_mid_insert: int = 0  # kills that landed after the run had committed kernels of its own
    finished_before_kill: int = 0  # runs that ended before their kill moment (not counted as kills)
    committed_reported: int = 0
    in_flight_unreported: int = 0  # kills after which one committed kernel had not been printed yet
    rows_verified: int = 0  # rows checked after the kills: new ones in full, the others unchanged
    moments: list[float] = field(default_factory=list)  # seconds from the start to each kill
    full_run_s: float = 0.0
    first_commit_s: float = 0.0
    final: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def _start_inject(db: Path, files: list[Path], log: Path) -> subprocess.Popen[bytes]:
    argv = kdb_argv("inject", "--db", str(db), "--jsonl", "--no-compile", "--workers", "2", *map(str, files))
    with log.open("wb") as out, log.with_suffix(".err").open("wb") as err:
        return subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=err, start_new_session=True)


def _first_output(proc: subprocess.Popen[bytes], log: Path, started: float) -> float | None:
    """Seconds from the start to the run's first line (its first commit), or None if it ended first."""
    while proc.poll() is None:
        if log.stat().st_size:
            return time.perf_counter() - started
        time.sleep(0.002)
    return None


def kill_loop(corpus: Path, db: Path, work: Path, *, kills: int = 20, seed: int = 0,
              say: Any = print) -> KillStats:
    """SIGKILL `kdb inject --jsonl --workers 2` at `kills` random moments into one DB, checking after each.

    A measured full run (into a scratch DB) gives every kernel's Key, the time to the first commit and the
    time per kernel. Every 4th kill lands at a random moment before the first commit (opening the DB,
    recovering the WAL the last kill left, looking kernels up); the others at a random moment in the window
    after the run's first commit in which it commits, on average, 1/kills of the corpus, so that every kill
    interrupts commits and the corpus lasts the whole loop.
    """
    began = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    files = sorted(corpus.glob("*.json"))
    stats = KillStats()
    scratch = work / "measure.db"
    started = time.perf_counter()
    proc = _start_inject(scratch, files, work / "measure.jsonl")
    stats.first_commit_s = _first_output(proc, work / "measure.jsonl", started) or 0.0
    proc.wait(timeout=600)
    stats.full_run_s = time.perf_counter() - started
    events = read_events(work / "measure.jsonl")
    check(proc.returncode == 0 and events and events[-1]["event"] == "summary", f"the measured run: {events[-1:]}")
    expected = {e["key"]: (Path(e["file"]).name, e["index"]) for e in events if e["event"] == "committed"}
    for p in (scratch, Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
        p.unlink(missing_ok=True)
    n = stats.kernels = len(expected)
    window_s = 2 * (stats.full_run_s - stats.first_commit_s) / kills
    say(f"  one run: {stats.full_run_s:.1f} s for {n} kernels, first commit at {stats.first_commit_s:.1f} s; "
        f"kills up to {window_s:.2f} s after a run's first commit")

    rng = random.Random(seed)
    before: dict[str, int] = {}  # Key -> hash of the row, as the DB held it when this start began
    attempt = 0
    while stats.kills < kills:
        attempt += 1
        check(attempt <= 2 * kills, "the runs keep finishing before their kill moment")
        order = files[:]
        rng.shuffle(order)  # each run meets the kernels still missing in other places
        startup_kill = stats.kills % 4 == 3
        log = work / f"run{attempt:02d}.jsonl"
        started = time.perf_counter()
        proc = _start_inject(db, order, log)
        if startup_kill:
            moment: float | None = rng.uniform(0.05, stats.first_commit_s)
        else:
            first = _first_output(proc, log, started)
            moment = None if first is None else first + rng.uniform(0, window_s)
        finished = True
        if moment is not None:
            try:
                proc.wait(timeout=max(0.0, started + moment - time.perf_counter()))
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)  # the writer itself, mid-run
                finished = False
        proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its CPU workers, orphaned by the kill
        events = read_events(log)
        reported = {e["key"]: (Path(e["file"]).name, e["index"]) for e in events if e["event"] == "committed"}
        rows = read_rows(db)
        new = set(rows) - set(before)
        check(not set(reported) & set(before), "a kernel already in the DB was committed again")
        for key, where in reported.items():
            check(key in rows, f"reported committed but missing: {key} ({where})")
            check(expected.get(key) == where, f"{key}: reported as {where}, expected {expected.get(key)}")
        unreported = new - set(reported)
        check(len(unreported) <= (0 if finished else 1),
              f"{len(unreported)} rows committed but never reported (at most the kernel in flight may be)")
        for key in new:
            check(key in expected, f"a row that is not in the corpus: {key}")
            problems = row_problems(rows[key])
            check(not problems, f"incomplete row {key} ({expected[key]}): {problems}")
        for key, digest in before.items():
            check(key in rows and hash(rows[key]) == digest, f"a row there before the start changed or vanished: {key}")
        stats.rows_verified += len(rows)
        stats.committed_reported += len(reported)
        if finished:
            stats.finished_before_kill += 1
            check(proc.returncode == 0 and events and events[-1]["event"] == "summary",
                  f"a run that was not killed exited {proc.returncode}")
        else:
            assert moment is not None
            stats.kills += 1
            stats.moments.append(moment)
            stats.startup_kills += startup_kill
            stats.kills_mid_insert += bool(new)
            stats.in_flight_unreported += bool(unreported)
        say(f"  {'finished' if finished else 'killed'} at {moment or 0:5.2f} s: {len(reported):4d} reported, "
            f"{len(unreported)} unreported, {len(rows):4d} rows ok")
        before = {k: hash(v) for k, v in rows.items()}

    proc = _start_inject(db, files, work / "final.jsonl")
    proc.wait(timeout=600)
    stats.final = read_events(work / "final.jsonl")[-1]
    rows = read_rows(db)
    check(stats.final.get("event") == "summary" and stats.final["failed"] == 0
          and stats.final["injected"] + stats.final["unchanged"] == n, f"the final run: {stats.final}")
    check(set(rows) == set(expected), f"{len(rows)} rows, {len(set(rows) ^ set(expected))} differ from the corpus")
    check(all(not row_problems(v) for v in rows.values()), "an incomplete row after the final run")
    stats.rows_verified += len(rows)
    stats.seconds = time.perf_counter() - began
    return stats


# ---------------------------------------------------------------------------------------------
# Contention


@dataclass
class ContentionStats:
    seconds: float = 0.0
    committed: dict[str, int] = field(default_factory=dict)  # Key -> which injector
    deleted: set[str] = field(default_factory=set)
    insert_latencies: list[float] = field(default_factory=list)
    delete_latencies: list[float] = field(default_factory=list)
    max_wal_bytes: int = 0
    reader_queries: int = 0
    reader_rows: int = 0
    reader_busy: int = 0
    reader_errors: list[str] = field(default_factory=list)
    pager_pages: int = 0
    pager_errors: list[str] = field(default_factory=list)
    exit_codes: list[int] = field(default_factory=list)
    interrupted: list[int] = field(default_factory=list)  # injectors sent SIGINT at the deadline
    stderr: list[str] = field(default_factory=list)
    summaries: list[dict[str, Any]] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        ms = [s * 1000 for s in self.insert_latencies]
        dms = [s * 1000 for s in self.delete_latencies]
        return {"seconds": round(self.seconds, 1), "inserts": len(ms), "deletes": len(dms),
                "insert_p50_ms": round(percentile(ms, 50), 2), "insert_p99_ms": round(percentile(ms, 99), 2),
                "insert_max_ms": round(max(ms, default=0), 2), "delete_p50_ms": round(percentile(dms, 50), 2),
                "delete_p99_ms": round(percentile(dms, 99), 2), "max_wal_mb": round(self.max_wal_bytes / 1e6, 2),
                "reader_queries": self.reader_queries, "reader_busy": self.reader_busy,
                "reader_errors": len(self.reader_errors), "pager_pages": self.pager_pages}


class Contention:
    """Writers, a deleter and readers on one DB for a bounded time; use as a context manager.

    The body of the `with` is the foreground (the console under Pilot, or a sleep); on exit the injectors
    still running are interrupted (SIGINT: they stop after the kernel in progress) and everything is collected.
    """

    def __init__(self, db: Path, corpora: list[Path], work: Path, *, seconds: float, pager: bool = False,
                 seed: int = 0) -> None:
        self.db, self.corpora, self.work, self.seconds, self.pager, self.seed = db, corpora, work, seconds, pager, seed
        self.stats = ContentionStats()
        self._stop = threading.Event()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Contention:
        from core.db.kernel_db import KernelDB

        self.work.mkdir(parents=True, exist_ok=True)
        KernelDB.open(self.db, create=True).close()
        self._start = time.perf_counter()
        for i, corpus in enumerate(self.corpora):
            argv = kdb_argv("inject", "--db", str(self.db), "--jsonl", "--no-compile", "--workers", "1", str(corpus),
                            timed=self.work / f"latency{i}.json")
            self._procs.append(self._spawn(argv, f"inject{i}"))
        argv = [sys.executable, __file__, "--deleter", str(self.db), str(self.work / "deleted.jsonl"),
                str(self.seconds), str(self.seed)]
        self._procs.append(self._spawn(argv, "deleter"))
        targets = [self._compiler_reader, self._wal_poller] + ([self._pager] if self.pager else [])
        self._threads = [threading.Thread(target=t, daemon=True) for t in targets]
        for t in self._threads:
            t.start()
        return self

    def _spawn(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        out = (self.work / f"{name}.out").open("wb")
        err = (self.work / f"{name}.err").open("wb")
        return subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=err)

    def remaining(self) -> float:
        return self.seconds - (time.perf_counter() - self._start)

    def __exit__(self, *exc: object) -> None:
        deadline = self._start + self.seconds
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
        for i, proc in enumerate(self._procs[:len(self.corpora)]):  # the deleter stops at its own deadline
            done = any(e["event"] == "summary" for e in read_events(self.work / f"inject{i}.out"))
            if proc.poll() is None and not done:  # past its summary, SIGINT would only hit the exit
                proc.send_signal(signal.SIGINT)
                self.stats.interrupted.append(i)
        for proc in self._procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.stats.seconds = time.perf_counter() - self._start
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        self._collect()

    def _collect(self) -> None:
        s = self.stats
        for i in range(len(self.corpora)):
            for e in read_events(self.work / f"inject{i}.out"):
                if e["event"] == "committed":
                    s.committed[e["key"]] = i
                elif e["event"] == "summary":
                    s.summaries.append(e)
            lat = self.work / f"latency{i}.json"
            s.insert_latencies += json.loads(lat.read_text()) if lat.exists() else []
        for e in read_events(self.work / "deleted.jsonl"):
            s.deleted.update(e["keys"])
            s.delete_latencies.append(e["s"])
        s.exit_codes = [p.returncode for p in self._procs]
        s.stderr = [p.read_text(errors="replace") for p in sorted(self.work.glob("*.err"))]

    # -- the threads ------------------------------------------------------------------------

    def _compiler_reader(self) -> None:
        """NNFusion's view: sqlite3 with no busy handler (timeout=0), its fetch query, a fresh open per 'compile'."""
        s = self.stats
        while not self._stop.is_set():
            try:
                conn = sqlite3.connect(str(self.db), timeout=0)
                try:
                    ids = [r[0] for r in conn.execute("SELECT DISTINCT Identifier FROM KernelCache LIMIT 40")]
                    for ident in ids or ["none"]:
                        s.reader_rows += len(conn.execute(FETCH, (ident, "CUDA_GPU")).fetchall())
                        s.reader_queries += 1
                        time.sleep(0.005)
                finally:
                    conn.close()
            except sqlite3.OperationalError as exc:
                from core.db.engine import is_locked

                if is_locked(exc):
                    s.reader_busy += 1
                else:
                    s.reader_errors.append(str(exc))

    def _wal_poller(self) -> None:
        wal = Path(f"{self.db}-wal")
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.stats.max_wal_bytes = max(self.stats.max_wal_bytes, wal.stat().st_size)
            time.sleep(0.005)

    def _pager(self) -> None:
        """What the Kernels view does per page: open read-only, count, list a page, close."""
        from core.db.browse import KernelFilter, count_kernels, list_kernels
        from core.db.kernel_db import KernelDB

        rng = random.Random(self.seed + 1)
        while not self._stop.is_set():
            try:
                with KernelDB.open(self.db) as db:
                    flt = KernelFilter(text=rng.choice(["", "conv", "dense", "_copy1"]))
                    total = count_kernels(db, flt)
                    list_kernels(db, flt, offset=rng.randrange(max(1, total)) // 100 * 100, limit=100)
                self.stats.pager_pages += 1
            except Exception as exc:  # every failure is a finding: keep it
                self.stats.pager_errors.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.05)


def _timed_kdb(latfile: Path, argv: list[str]) -> int:
    """The real `kdb` with each KernelDB.insert timed (the lock wait included); latencies go to latfile."""
    from console.entry import main
    from core.db.kernel_db import KernelDB

    insert = KernelDB.insert
    latencies: list[float] = []

    def timed(self: KernelDB, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return insert(self, *args, **kwargs)
        finally:
            latencies.append(time.perf_counter() - start)

    KernelDB.insert = timed  # type: ignore[method-assign]
    try:
        return main(argv)
    finally:
        latfile.write_text(json.dumps(latencies))


def _deleter(db_path: Path, out: Path, seconds: float, seed: int) -> int:
    """Delete a few random rows at a time through KernelDB.delete, logging each deletion once it committed."""
    from core.db.kernel_db import KernelDB

    rng = random.Random(seed)
    end = time.monotonic() + seconds
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with KernelDB.open(db_path, write=True) as db, out.open("w") as log:
        raw = db.connection()
        while time.monotonic() < end and not stop.is_set():
            keys = [r[0] for r in raw.execute("SELECT Key FROM KernelCache ORDER BY random() LIMIT ?",
                                              (rng.randint(1, 3),))]
            if keys:
                start = time.perf_counter()
                gone = db.delete(keys)
                log.write(json.dumps({"keys": [r.key for r in gone], "s": time.perf_counter() - start}) + "\n")
                log.flush()
            time.sleep(0.1)
    return 0


# ---------------------------------------------------------------------------------------------
# Backups


@dataclass
class BackupStats:
    rows_before: int = 0  # committed before the backup began
    rows_in_backup: int = 0
    rows_after: int = 0  # in the DB once the writer was done
    backup_s: float = 0.0
    integrity: list[str] = field(default_factory=list)
    missing: int = 0  # committed before the backup began, yet not in it
    incomplete: int = 0


def backup_under_write(corpus: Path, db: Path, work: Path, *, head_start: int = 200) -> BackupStats:
    """`kdb db backup` while `kdb inject` writes: a consistent copy holding every row committed before it began."""
    work.mkdir(parents=True, exist_ok=True)
    log = work / "writer.jsonl"
    stats = BackupStats()
    with log.open("wb") as out:
        writer = subprocess.Popen(kdb_argv("inject", "--db", str(db), "--jsonl", "--no-compile", "--workers", "1",
                                           str(corpus)), cwd=REPO, stdout=out, stderr=subprocess.DEVNULL)
        try:
            while sum(e["event"] == "committed" for e in read_events(log)) < head_start:
                check(writer.poll() is None, "the writer ended before the backup could start")
                time.sleep(0.05)
            before = {e["key"] for e in read_events(log) if e["event"] == "committed"}
            dest = work / "backup.db"
            start = time.perf_counter()
            proc = subprocess.run(kdb_argv("db", "backup", "--db", str(db), str(dest)), cwd=REPO,
                                  capture_output=True, text=True, timeout=300)
            stats.backup_s = time.perf_counter() - start
            check(proc.returncode == 0, f"kdb db backup: {proc.stderr}")
            check(writer.poll() is None, "the writer ended before the backup did: nothing was written meanwhile")
        finally:
            writer.wait(timeout=600)
    conn = read_only(dest)
    try:
        stats.integrity = [r[0] for r in conn.execute("PRAGMA integrity_check")]
    finally:
        conn.close()
    rows = read_rows(dest)  # the kernels, each fused one's twin checked beside it
    stats.rows_before, stats.rows_in_backup = len(before), len(rows)
    stats.missing = len(before - set(rows))
    stats.incomplete = sum(bool(row_problems(v)) for v in rows.values())
    stats.rows_after = len(read_rows(db))
    return stats


# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def isolated_state(tmp: Path) -> Iterator[None]:
    """Keep the benchmark's runs, failures and backups out of the user's state dir."""
    saved = {k: os.environ.get(k) for k in ("KDB_STATE_DIR", "KDB_CONFIG")}
    os.environ["KDB_STATE_DIR"], os.environ["KDB_CONFIG"] = str(tmp / "state"), str(tmp / "settings.toml")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--kernels", type=int, default=2000, help="corpus of the kill loop")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of the contention run")
    ap.add_argument("--per-injector", type=int, default=2500, help="kernels each contending injector has")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
                               "python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version}
    with tempfile.TemporaryDirectory(prefix="kdb-rel-") as tmp_name, isolated_state(Path(tmp_name)):
        tmp = Path(tmp_name)
        print(f"kill loop: {args.kills} SIGKILLs of `kdb inject --jsonl --workers 2` on {args.kernels} kernels")
        write_corpus(args.kernels, tmp / "corpus")
        kills = kill_loop(tmp / "corpus", tmp / "kill.db", tmp / "kill", kills=args.kills, seed=args.seed)
        results["kills"] = {k: v for k, v in asdict(kills).items() if k != "moments"} | {
            "moments_s": [round(m, 2) for m in sorted(kills.moments)]}

        print(f"\ncontention: 2 injectors x {args.per_injector} kernels, 1 deleter, a compiler-like reader "
              f"(timeout=0), a console-like pager, {args.seconds:g} s")
        corpora = split_corpus(2 * args.per_injector, [tmp / "a", tmp / "b"])
        with Contention(tmp / "busy.db", corpora, tmp / "busy", seconds=args.seconds, pager=True,
                        seed=args.seed) as run:
            time.sleep(max(0.0, run.remaining()))
        c = run.stats
        rows = read_rows(tmp / "busy.db")
        lost = set(c.committed) - c.deleted - set(rows)
        resurrected = c.deleted & set(rows)
        results["contention"] = c.figures() | {
            "committed": len(c.committed), "deleted": len(c.deleted), "rows": len(rows), "lost_writes": len(lost),
            "db_mb": round((tmp / "busy.db").stat().st_size / 1e6, 1),
            "deleted_but_present": len(resurrected), "locked_in_stderr": sum("locked" in e for e in c.stderr),
            "exit_codes": c.exit_codes, "pager_errors": c.pager_errors[:5], "reader_errors": c.reader_errors[:5]}

        print("\nbackup: `kdb db backup` while `kdb inject` writes")
        write_corpus(1000, tmp / "bcorpus")
        b = backup_under_write(tmp / "bcorpus", tmp / "backed.db", tmp / "backup")
        results["backup"] = asdict(b)

    k, c2, b2 = results["kills"], results["contention"], results["backup"]
    print(f"\n{'figure':<52}{'value':>16}")
    for label, value in [
        ("kills survived (SIGKILL mid-run)", f"{k['kills']}"),
        ("  aimed before a first commit / landed after commits", f"{k['startup_kills']} / {k['kills_mid_insert']}"),
        ("  kill moments (s from start)", f"{min(k['moments_s']):.2f}..{max(k['moments_s']):.2f}"),
        ("  committed but unreported at a kill (<= 1 each)", f"{k['in_flight_unreported']}"),
        ("rows verified after the kills", f"{k['rows_verified']:,}"),
        ("final run: injected + unchanged", f"{k['final']['injected']} + {k['final']['unchanged']}"),
        ("kill loop wall time", f"{k['seconds']:.0f} s"),
        ("insert p50 / p99 under contention", f"{c2['insert_p50_ms']:.1f} / {c2['insert_p99_ms']:.1f} ms"),
        ("insert max under contention", f"{c2['insert_max_ms']:.1f} ms"),
        ("delete p50 / p99 under contention", f"{c2['delete_p50_ms']:.1f} / {c2['delete_p99_ms']:.1f} ms"),
        ("inserts / deletes in the contention run", f"{c2['inserts']:,} / {c2['deletes']:,}"),
        ("largest -wal file (the DB file at the end)", f"{c2['max_wal_mb']:.0f} MB ({c2['db_mb']:.0f} MB)"),
        ("compiler-reader queries / SQLITE_BUSY", f"{c2['reader_queries']:,} / {c2['reader_busy']}"),
        ("console-like pages read / errors", f"{c2['pager_pages']} / {len(c2['pager_errors'])}"),
        ("lost writes / deleted rows back / 'locked' in stderr",
         f"{c2['lost_writes']} / {c2['deleted_but_present']} / {c2['locked_in_stderr']}"),
        ("backup under write: integrity", "; ".join(b2["integrity"])),
        ("  rows committed before / in backup / after",
         f"{b2['rows_before']} / {b2['rows_in_backup']} / {b2['rows_after']}"),
        ("  missing from backup / incomplete rows", f"{b2['missing']} / {b2['incomplete']}"),
        ("  backup time", f"{b2['backup_s']:.2f} s"),
    ]:
        print(f"{label:<52}{value:>16}")
    (RESULTS / "reliability.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\nwritten: {RESULTS / 'reliability.json'}")


if __name__ == "__main__":
    # The harness's own child processes: `--timed-kdb LATFILE KDB_ARGS...` and `--deleter DB LOG SECONDS SEED`.
    if sys.argv[1:2] == ["--timed-kdb"]:
        sys.exit(_timed_kdb(Path(sys.argv[2]), sys.argv[3:]))
    if sys.argv[1:2] == ["--deleter"]:
        sys.exit(_deleter(Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])))
    main()
