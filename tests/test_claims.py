"""Several tuning processes share one network's ops through claim files (core/tuning/claims.py).

On the H200 the four processes of a run, each dealt its ops before the start, ended 200 s apart; claiming the
next op lets them end together. What must hold: every op goes to exactly one process, a process waits for the
probes others are running (but not for a process that died), and odd names never reach the file system."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.errors import InputError
from core.tuning.claims import ClaimBoard

KEYS = [f"Convolution|in+1_{c}_56_56|w+{c}_{c}_3_3|../odd name {c}" for c in range(40)]


def claim_all(root: str, run: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    board = ClaimBoard(Path(root), run)
    queue.put([key for key in KEYS if board.claim("tune", key)])


def test_each_op_goes_to_exactly_one_of_several_processes(tmp_path: Path):
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=claim_all, args=(str(tmp_path), "run-1", queue)) for _ in range(4)]
    for p in processes:
        p.start()
    got = [queue.get(timeout=120) for _ in processes]
    for p in processes:
        p.join(timeout=60)
    claimed = [key for keys in got for key in keys]
    assert sorted(claimed) == sorted(KEYS), "every op claimed once, none twice"


def test_a_new_run_name_frees_the_ops_and_odd_keys_stay_inside_the_run_folder(tmp_path: Path):
    first, again, resumed = (ClaimBoard(tmp_path, run) for run in ("run-1", "run-1", "run-2"))
    assert first.claim("probe", KEYS[0]) and not again.claim("probe", KEYS[0])
    assert again.claim("tune", KEYS[0]), "the tuning stage is claimed apart from the probes"
    assert resumed.claim("probe", KEYS[0])
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert all(p.resolve().is_relative_to(tmp_path.resolve()) and " " not in p.name for p in files)


@pytest.mark.parametrize("run", ["", "../up", ".hidden", "a/b", "with space"])
def test_a_run_name_that_is_not_a_plain_file_name_is_refused(tmp_path: Path, run: str):
    with pytest.raises(InputError, match="is not a run name"):
        ClaimBoard(tmp_path, run)


def test_the_probes_wait_for_jobs_other_processes_claimed_and_not_for_a_dead_one(tmp_path: Path):
    mine, other = ClaimBoard(tmp_path, "r"), ClaimBoard(tmp_path, "r")
    assert mine.claim("probe", "a")
    assert mine.pending("probe", ["a", "b"]) == 2, "b: nobody has claimed it yet"
    assert mine.claim("probe", "b")
    mine.done("probe", "a")
    mine.done("probe", "b")
    assert mine.pending("probe", ["a", "b"]) == 0
    # another process of the run claimed "c" (an op this process did not list: it looked at the records earlier)
    (tmp_path / "r" / "probe").mkdir(parents=True, exist_ok=True)
    assert other.claim("probe", "c")
    assert mine.pending("probe", ["a", "b"]) == 1, "a claim by a live process (this test's own pid) is waited for"
    assert not mine.wait_for("probe", ["a", "b"], should_cancel=lambda: True, poll_s=0.01)  # cancelled
    # a claimant that died: rewrite the claim with the pid of a process that has ended
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    open_claims = [p for p in (tmp_path / "r" / "probe").glob("*.claim") if not p.with_suffix(".done").exists()]
    assert len(open_claims) == 1
    open_claims[0].write_text(str(dead.pid))
    start = time.perf_counter()
    assert mine.wait_for("probe", ["a", "b"], should_cancel=lambda: time.perf_counter() - start > 5, poll_s=0.01), \
        "still waiting for a process that has ended"
