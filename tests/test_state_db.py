"""The console's state file (core/db/state.py): runs and failures, in the layout state files have always had."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from core.db.state import Failure, ModelEvent, StateDB

# What the first state files hold: SQLModel's create_all wrote these tables.
FIRST_LAYOUT = [
    "CREATE TABLE run (\n\tid INTEGER NOT NULL, \n\tkind VARCHAR NOT NULL, \n\tdb_path VARCHAR NOT NULL, \n\t"
    "started_at VARCHAR NOT NULL, \n\tfinished_at VARCHAR, \n\targs VARCHAR NOT NULL, \n\tinjected INTEGER NOT NULL, "
    "\n\tunchanged INTEGER NOT NULL, \n\tfailed INTEGER NOT NULL, \n\tcancelled BOOLEAN NOT NULL, \n\tPRIMARY KEY (id)\n)",
    "CREATE TABLE failure (\n\tid INTEGER NOT NULL, \n\trun_id INTEGER, \n\tdb_path VARCHAR NOT NULL, \n\tfile VARCHAR "
    "NOT NULL, \n\titem_index INTEGER, \n\tname VARCHAR NOT NULL, \n\tstage VARCHAR NOT NULL, \n\treason VARCHAR NOT "
    "NULL, \n\tdetail VARCHAR NOT NULL, \n\tinput VARCHAR, \n\tcreated_at VARCHAR NOT NULL, \n\tresolved_at VARCHAR, "
    "\n\tdismissed BOOLEAN NOT NULL, \n\tPRIMARY KEY (id)\n)",
    "CREATE INDEX ix_failure_db_path ON failure (db_path)",
    "CREATE INDEX ix_failure_run_id ON failure (run_id)",
]
# Added since (the console's Network view): a model's story, one event per compile, run, op times, never-slower step
MODEL_EVENT_LAYOUT = [
    "CREATE TABLE model_event (\n\tid INTEGER NOT NULL, \n\tmodel VARCHAR NOT NULL, \n\tdb_path VARCHAR NOT NULL, "
    "\n\tkind VARCHAR NOT NULL, \n\tok BOOLEAN NOT NULL, \n\theadline VARCHAR NOT NULL, \n\tdetail VARCHAR NOT NULL, "
    "\n\tcreated_at VARCHAR NOT NULL, \n\tPRIMARY KEY (id)\n)",
    "CREATE INDEX ix_model_event_model ON model_event (model)",
]


def test_a_state_file_of_the_first_layout_reads_and_writes(tmp_path: Path):
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path)
    for statement in FIRST_LAYOUT:
        conn.execute(statement)
    conn.execute("INSERT INTO failure (run_id, db_path, file, item_index, name, stage, reason, detail, input, "
                 "created_at, resolved_at, dismissed) VALUES (NULL, 'k.db', 'a.json', 3, 'relu', 'parse', 'bad', "
                 "'{}', NULL, '2026-12-01T00:00:00+00:00', NULL, 0)")
    conn.commit()
    conn.close()
    state = StateDB(path)
    try:
        (old,) = state.failures(Path("k.db"))
        assert (old.id, old.file, old.item_index, old.stage, old.dismissed) == (1, "a.json", 3, "parse", False)
        run = state.start_run("inject", Path("k.db"), {"archs": ["sm_90"]})
        state.record_failures([Failure(run_id=run, db_path="k.db", file="b.json", stage="compile", reason="nvcc")])
        state.finish_run(run, injected=1, unchanged=0, failed=1, cancelled=True)
        state.close_failures([1], resolved=False)
        (new,) = state.failures(Path("k.db"))
        assert (new.id, new.run_id, new.file, new.dismissed, new.resolved_at) == (2, run, "b.json", False, None)
        closed = state.failures(Path("k.db"), include_closed=True)
        assert [(f.id, f.dismissed) for f in closed] == [(1, True), (2, False)]
        assert all(f.dismissed in (True, False) and type(f.dismissed) is bool for f in closed)  # not 0/1
        (finished,) = state.runs()
        assert (finished.failed, finished.cancelled is True, finished.finished_at is not None) == (1, True, True)
        assert state.get_failure(2) == new and state.get_failure(99) is None
    finally:
        state.close()
    tables = sqlite3.connect(path).execute("SELECT sql FROM sqlite_master WHERE name IN ('run', 'failure')")
    assert [t[0] for t in tables] == FIRST_LAYOUT[:2]  # left as it was
    state = StateDB(path)  # ... and the table added since is there, and works
    try:
        state.record_model_event(ModelEvent(model="/m.onnx", db_path="k.db", kind="compile", ok=True, headline="x"))
        assert [(e.kind, e.ok) for e in state.model_events(Path("/m.onnx"))] == [("compile", True)]
        assert state.recent_models() == ["/m.onnx"]
    finally:
        state.close()


def test_a_new_state_file_has_the_same_columns(tmp_path: Path):
    StateDB(tmp_path / "new.db").close()
    old = sqlite3.connect(tmp_path / "old.db")
    for statement in FIRST_LAYOUT:
        old.execute(statement)
    new = sqlite3.connect(tmp_path / "new.db")
    for table in ("run", "failure"):
        columns = [tuple(c) for c in new.execute(f"PRAGMA table_info({table})")]
        assert columns == [tuple(c) for c in old.execute(f"PRAGMA table_info({table})")]


def test_a_new_state_file_is_written_in_the_first_layout_indexes_included(tmp_path: Path):
    # Run and Failure (core/db/state.py) are the one declaration of the schema: their fields make the tables.
    StateDB(tmp_path / "new.db").close()
    new = sqlite3.connect(tmp_path / "new.db")
    assert [r[0] for r in new.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid")] \
        == FIRST_LAYOUT + MODEL_EVENT_LAYOUT


def test_a_second_command_creating_the_state_file_waits_for_the_first(tmp_path: Path):
    """Two commands on a new state dir: the one that finds no tables while the other creates them waits for the
    other's write and then finds its tables (it died on "table run already exists" before)."""
    import threading

    path = tmp_path / "state.db"
    first = sqlite3.connect(path, isolation_level=None)
    first.execute("PRAGMA journal_mode = WAL")
    first.execute("BEGIN IMMEDIATE")  # "the first command", in the middle of creating the tables
    for statement in FIRST_LAYOUT:
        first.execute(statement)
    errors: list[BaseException] = []
    looked = threading.Event()

    def second() -> None:
        try:
            state = StateDB(path)  # finds no table (the first's are not committed), then asks for the write lock
            state.close()
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)
        finally:
            looked.set()

    waiting = threading.Thread(target=second)
    waiting.start()
    assert not looked.wait(timeout=1.0) and not errors, errors  # it waits for the lock instead of racing the first
    first.execute("COMMIT")  # the first command is done
    waiting.join(timeout=30)
    assert not waiting.is_alive() and not errors, errors
    assert [r[0] for r in first.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid")] \
        == FIRST_LAYOUT + MODEL_EVENT_LAYOUT  # the second added the table the first did not know


def test_a_db_given_relative_is_one_db_per_folder(tmp_path: Path, monkeypatch):
    """Held out in session 30: failures were keyed by --db as typed, so `--db fp32.db` listed six other folders'
    fp32.db failures, and the absolute path of the DB showed none."""
    state = StateDB(tmp_path / "state.db")
    try:
        for folder in ("a", "b"):
            (tmp_path / folder).mkdir()
            monkeypatch.chdir(tmp_path / folder)
            state.record_failures([Failure(db_path="fp32.db", file=f"{folder}.txt", stage="codegen", reason="x")])
        assert [f.file for f in state.failures(Path("fp32.db"))] == ["b.txt"]  # (in folder b)
        assert [f.file for f in state.failures(tmp_path / "a" / "fp32.db")] == ["a.txt"]
        monkeypatch.chdir(tmp_path / "a")
        assert [f.file for f in state.failures(Path("./fp32.db"))] == ["a.txt"]
    finally:
        state.close()
