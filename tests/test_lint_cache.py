"""Lint findings remembered per DB file (core/db/lint_cache.py): the same findings as linting every row, read
from the state dir only while the DB file and the lint rules are as they were."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from test_lint import GOOD, with_

import core.db.lint_cache as lint_cache
from core.db.kernel_db import NNFUSION_DDL, KernelDB
from core.db.summary_index import state_file_for
from core.kernels.lint import lint_rows


def make_db(path: Path, rows: list[tuple]) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")  # as our writers leave it: changes sit in the WAL first
    conn.execute(NNFUSION_DDL)
    conn.executemany("INSERT INTO KernelCache VALUES (?,?,?,?,?,?,?,?,?)", [r[1:] for r in rows])
    conn.commit()
    conn.close()
    return path


ROWS = [GOOD, with_(rowid=2, Key="k2", Tags="KernelEmitter"), with_(rowid=3, Key="k3", OpType="Softmax")]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return make_db(tmp_path / "k.db", ROWS)


@pytest.fixture
def lints(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the times every row is linted."""
    calls: list[int] = []

    def counting(rows):  # type: ignore[no-untyped-def]
        calls.append(1)
        return lint_rows(rows)

    monkeypatch.setattr(lint_cache, "lint_rows", counting)
    return calls


def lint(path: Path) -> tuple[int, list]:
    with KernelDB.open(path) as db:
        return lint_cache.lint_db(db)


def test_an_unchanged_db_is_answered_from_the_cache_with_the_same_findings(db: Path, lints: list[int]):
    with KernelDB.open(db) as kdb:
        expected = list(lint_rows(kdb.iter_raw()))
    assert expected and lint(db) == (3, expected)
    assert lint(db) == (3, expected)
    assert len(lints) == 1


def test_a_row_changed_in_place_by_another_tool_is_linted_again(db: Path, lints: list[int]):
    before = lint(db)[1]
    conn = sqlite3.connect(db)  # an UPDATE keeps rowid and Key: only the file says something changed
    conn.execute("UPDATE KernelCache SET Tags = 'KernelEmitter,CudaEmitter,BlockCudaEmitter' WHERE Key = 'k2'")
    conn.commit()
    conn.close()
    after = lint(db)[1]
    assert [f.key for f in before if f.check == "tags"] == ["k2"]
    assert not [f for f in after if f.check == "tags"] and len(lints) == 2


def test_new_lint_rules_lint_every_row_again(db: Path, lints: list[int], monkeypatch: pytest.MonkeyPatch):
    lint(db)
    monkeypatch.setattr(lint_cache, "_rules_digest", lambda: "the rules of a newer kdb")
    assert lint(db)[1] and len(lints) == 2


def test_findings_that_do_not_read_back_are_linted_again(db: Path):
    expected = lint(db)
    path = state_file_for(db, "lint", ".json")
    kept = json.loads(path.read_text())  # the right signature, findings of another shape
    path.write_text(json.dumps({**kept, "findings": [{"rowid": 1, "problem": "?"}]}))
    assert lint(db) == expected


@pytest.mark.parametrize("content", ["not json", "[]", '{"signature": 1}'])
def test_a_cache_file_not_of_our_making_is_ignored(db: Path, content: str):
    expected = lint(db)
    state_file_for(db, "lint", ".json").write_text(content)
    assert lint(db) == expected


def test_an_unwritable_state_dir_still_lints(db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("KDB_STATE_DIR", str(blocker))
    assert lint(db)[0] == 3 and lint(db)[1]
