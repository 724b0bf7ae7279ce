"""`kdb inject` against a hostile corpus: every bad file or item fails alone, at the right stage, with a
reason that says what is wrong; every good item lands; nothing is written outside the DB and the state
dir; names are data, never paths or shell.

The whole corpus (plus the artifact kernels, when present) goes through one `inject --no-compile --json`
run, shared by the tests of this module; the compile check gets a tiny corpus of its own.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import KERNELS, REPO
from hostile_corpus import (
    EVIL_NAMES,
    OK,
    Expectation,
    Outcome,
    expectations,
    write_corpus,
    write_surrogate_corpus,
)

NVCC = Path("/usr/local/cuda/bin/nvcc")
EVIL_TMP_GLOBS = ("kdb_evil*", "kdb_pwned*")
RUN_LIMIT_S = 60  # the whole corpus, --no-compile; it takes a few seconds


# ---------------------------------------------------------------------------------------------
# Running kdb


def kdb(*args: str, env: dict[str, str], timeout: float = RUN_LIMIT_S,
        **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "console.entry", *args], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=timeout, check=False, **kw)


def sandbox_env(base: Path, settings: str = "") -> dict[str, str]:
    """HOME, state, settings and TMPDIR all under `base`; no XDG dir pointing elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "KDB_"))}
    for name in ("home", "state", "tmpdir"):
        (base / name).mkdir(exist_ok=True)
    (base / "settings.toml").write_text(settings, encoding="utf-8")
    env.update(HOME=str(base / "home"), KDB_STATE_DIR=str(base / "state"), TMPDIR=str(base / "tmpdir"),
               KDB_CONFIG=str(base / "settings.toml"), KDB_DB=str(base / "kernel.db"))
    return env


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under root with its size and mtime (symlinks not followed)."""
    out = {}
    for path in root.rglob("*"):
        st = path.lstat()
        out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def git_status() -> set[str]:
    proc = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, text=True,
                          capture_output=True, check=True)
    return set(proc.stdout.splitlines())


def evil_tmp_entries() -> set[str]:
    return {str(p) for pattern in EVIL_TMP_GLOBS for p in Path("/tmp").glob(pattern)}


def db_names(db: Path) -> list[str]:
    """kdb.name of every row (what `kdb show` prints as the kernel's name)."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT Miscs FROM KernelCache").fetchall()
    return [json.loads(miscs)["kdb"]["name"] for (miscs,) in rows]


def artifact_item_count() -> int:
    total = 0
    for path in KERNELS.glob("*.json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        total += len(data) if isinstance(data, list) else 1
    return total


@dataclass
class HostileRun:
    corpus: Path
    base: Path
    db: Path
    expected: dict[str, Expectation]
    proc: subprocess.CompletedProcess[str]
    report: dict[str, Any]
    listed: subprocess.CompletedProcess[str]
    seconds: float
    artifact_items: int
    before: dict[str, Any]
    after: dict[str, Any]

    def failures_for(self, name: str, index: int | None) -> list[dict[str, Any]]:
        path = self.corpus / name
        return [f for f in self.report["failures"] if Path(f["file"]) == path and f["index"] == index]


def snapshot(base: Path) -> dict[str, Any]:
    return {"git": git_status(), "home": tree(base / "home"), "tmpdir": tree(base / "tmpdir"),
            "corpus": tree(base / "corpus"), "tmp": evil_tmp_entries(),
            "settings": (base / "settings.toml").read_bytes()}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> HostileRun:
    base = tmp_path_factory.mktemp("hostile")
    corpus = base / "corpus"
    expected = write_corpus(corpus)
    env = sandbox_env(base)
    db = base / "kernel.db"
    paths = [str(corpus)] + ([str(KERNELS)] if KERNELS.is_dir() else [])
    before = snapshot(base)
    start = time.monotonic()
    proc = kdb("inject", "--db", str(db), "--json", "--no-compile", "--workers", "2", *paths, env=env)
    seconds = time.monotonic() - start
    after = snapshot(base)
    assert proc.stdout.strip(), f"no JSON on stdout; stderr:\n{proc.stderr}"
    report = json.loads(proc.stdout)
    listed = kdb("failures", "--db", str(db), "--json", env=env)
    return HostileRun(corpus, base, db, expected, proc, report, listed, seconds,
                      artifact_item_count() if KERNELS.is_dir() else 0, before, after)


def case_id(name: str, outcome: Outcome) -> str:
    return name if outcome.index is None else f"{name}#{outcome.index}"


def cases(*, failing_only: bool) -> list[Any]:
    out = []
    for name, expectation in expectations().items():
        for outcome in expectation.outcomes:
            if failing_only and outcome.stage == OK:
                continue
            cid = case_id(name, outcome)
            out.append(pytest.param(name, outcome, id=cid))
    return out


# ---------------------------------------------------------------------------------------------
# The batch as a whole


def test_the_batch_runs_to_the_end_and_reports_in_json(run: HostileRun):
    assert "Traceback" not in run.proc.stderr, run.proc.stderr
    assert run.proc.returncode == 1, run.proc.stderr
    assert set(run.report) >= {"injected", "unchanged", "failed", "failures"}
    assert run.report["failed"] == len(run.report["failures"])
    for failure in run.report["failures"]:
        assert set(failure) == {"file", "index", "name", "stage", "reason"}, failure
    assert run.seconds < RUN_LIMIT_S / 2, f"took {run.seconds:.1f} s"


def test_every_good_item_lands(run: HostileRun):
    ok_items = sum(e.ok_items for e in run.expected.values())
    # Bad items that landed anyway are test_outcome's business; here they must not hide a lost good one.
    slipped = sum(1 for name, e in run.expected.items() for o in e.outcomes
                  if o.stage != OK and o.index is not None and not run.failures_for(name, o.index))
    landed = run.report["injected"] + run.report["unchanged"]
    assert landed == ok_items + run.artifact_items + slipped
    artifact_failures = [f for f in run.report["failures"] if not Path(f["file"]).is_relative_to(run.corpus)]
    assert artifact_failures == []


def test_no_failure_beyond_the_expected_ones(run: HostileRun):
    known = {(run.corpus / name, o.index) for name, e in run.expected.items() for o in e.outcomes}
    unknown = [f for f in run.report["failures"] if (Path(f["file"]), f["index"]) not in known]
    assert unknown == []


# ---------------------------------------------------------------------------------------------
# Each file and item


@pytest.mark.parametrize(("name", "outcome"), cases(failing_only=False))
def test_outcome(run: HostileRun, name: str, outcome: Outcome):
    found = run.failures_for(name, outcome.index)
    if outcome.stage == OK:
        assert found == [], f"a good item failed: {found}"
        items = json.loads((run.corpus / name).read_text(encoding="utf-8"))
        item = items[outcome.index] if isinstance(items, list) else items
        assert item["tvm_func_name"] in db_names(run.db)
        return
    assert len(found) == 1, f"expected one {outcome.stage} failure, got {found}"
    assert found[0]["stage"] == outcome.stage, found[0]
    if outcome.index is None:
        assert not run.failures_for(name, 0), "a file that failed as a whole also failed item by item"


@pytest.mark.parametrize(("name", "outcome"), cases(failing_only=True))
def test_reason_says_what_is_wrong(run: HostileRun, name: str, outcome: Outcome):
    found = run.failures_for(name, outcome.index)
    assert found, "no failure recorded"
    reason = found[0]["reason"]
    assert reason.strip(), found[0]
    assert any(m.lower() in reason.lower() for m in outcome.mentions), (
        f"reason {reason!r} names none of {outcome.mentions}")


def test_empty_list_file_is_no_failure(run: HostileRun):
    empty = [n for n, e in run.expected.items() if not e.outcomes]
    assert empty
    for name in empty:
        assert [f for f in run.report["failures"] if Path(f["file"]) == run.corpus / name] == []


# ---------------------------------------------------------------------------------------------
# Names are data; nothing is written outside the DB and the state dir


def test_hostile_names_are_stored_verbatim(run: HostileRun):
    names = db_names(run.db)
    for evil in EVIL_NAMES:
        assert evil in names


def test_nothing_written_outside_the_db_and_the_state_dir(run: HostileRun):
    before, after = run.before, run.after
    assert after["tmp"] - before["tmp"] == set(), "a name was used as a path or run by a shell"
    assert after["git"] == before["git"], "the repository (the command's cwd) changed"
    assert after["home"] == before["home"] == {}
    assert after["tmpdir"] == {}, "temporary files left behind"
    assert after["corpus"] == before["corpus"], "the input was modified"
    assert after["settings"] == before["settings"]
    allowed = {"corpus", "home", "tmpdir", "state", "settings.toml", "kernel.db", "kernel.db-wal",
               "kernel.db-shm"}
    assert {p.name for p in run.base.iterdir()} <= allowed


def test_db_passes_integrity_check_and_holds_exactly_the_injected_rows(run: HostileRun):
    with closing(sqlite3.connect(f"file:{run.db}?mode=ro", uri=True)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        kernels = conn.execute("SELECT count(*) FROM KernelCache WHERE DeviceType = 'CUDA_GPU'").fetchone()[0]
        assert kernels == run.report["injected"]
        # and the CUDA twin of every fused kernel among them (NNFusion uses a fused kernel only as the pair)
        assert conn.execute("SELECT count(*) FROM KernelCache AS t WHERE DeviceType = 'CUDA' AND NOT EXISTS "
                            "(SELECT 1 FROM KernelCache AS k WHERE k.Key || '#CUDA' = t.Key)").fetchone()[0] == 0


def test_failures_command_lists_the_same_failures(run: HostileRun):
    assert "Traceback" not in run.listed.stderr, run.listed.stderr
    assert run.listed.returncode in (0, 1), run.listed.stderr
    listed = json.loads(run.listed.stdout)
    assert Path(listed["db"]) == run.db

    def key(f: dict[str, Any]) -> tuple[str, int, str, str, str]:
        return (f["file"], -1 if f["index"] is None else f["index"], f["name"], f["stage"], f["reason"])

    assert sorted(map(key, listed["failures"])) == sorted(map(key, run.report["failures"]))
    assert all(f["id"] is not None and f["created_at"] for f in listed["failures"])


# ---------------------------------------------------------------------------------------------
# The nvcc compile check

VALID_DOT = {
    "tvm_func_name": "manual_dot_nn_op_float_m1_k256_n256_kernel0", "op_type": "Dot",
    "parameters": {"arg0_shape": [1, 256], "arg1_shape": [256, 256], "out_shape": [1, 256],
                   "transpose_A": False, "transpose_B": False},
    "code": ('extern "C" __global__ void manual_dot_nn_op_float_m1_k256_n256_kernel0(float* input0, '
             "float* input1, float* output0)\n{\n    int warp_id = threadIdx.x >> 5;\n"
             "    int lane_id = threadIdx.x & 31;\n    int col_id = blockIdx.x * blockDim.x / 4 + lane_id;\n"
             "    if (col_id < 256)\n    {\n        float val = 0;\n"
             "        for (int i = warp_id * 64; i < (warp_id + 1) * 64; i++)\n        {\n"
             "            val = fma(input0[i], input1[i * 256 + col_id], val);\n        }\n"
             "        __syncthreads();\n        atomicAdd(output0 + col_id, val);\n    }\n}\n"),
    "gridDim": [8, 1, 1], "blockDim": [128, 1, 1],
}


@pytest.mark.skipif(not NVCC.is_file(), reason=f"{NVCC} is not present")
def test_compile_check_fails_only_the_kernel_nvcc_rejects(tmp_path: Path):
    broken = {**VALID_DOT, "tvm_func_name": "hostile_does_not_compile",
              "parameters": {**VALID_DOT["parameters"], "arg1_shape": [256, 512], "out_shape": [1, 512]},
              "code": VALID_DOT["code"].replace("atomicAdd(output0 + col_id, val);",
                                                "atomicAdd(output0 + col_id, val * kdb_undeclared_scale);")}
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "tiny.json").write_text(json.dumps([VALID_DOT, broken]), encoding="utf-8")
    env = sandbox_env(tmp_path, settings=f'nvcc_path = "{NVCC}"\narchs = ["sm_90"]\n')
    db = tmp_path / "kernel.db"
    git_before = git_status()
    proc = kdb("inject", "--db", str(db), "--json", str(corpus), env=env, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["injected"], report["unchanged"], report["failed"]) == (1, 0, 1), report
    (failure,) = report["failures"]
    assert (Path(failure["file"]), failure["index"], failure["stage"]) == (corpus / "tiny.json", 1, "compile")
    assert "nvcc" in failure["reason"] and "kdb_undeclared_scale" in failure["reason"], failure
    assert db_names(db) == [VALID_DOT["tvm_func_name"]]
    assert tree(tmp_path / "home") == {} and tree(tmp_path / "tmpdir") == {}
    assert git_status() == git_before


# ---------------------------------------------------------------------------------------------
# Inputs that take the whole batch down today: kept out of the shared run


def test_lone_surrogates_and_non_utf8_file_names_fail_alone(tmp_path: Path):
    corpus = tmp_path / "corpus"
    expected = write_surrogate_corpus(corpus)
    db = tmp_path / "kernel.db"
    proc = kdb("inject", "--db", str(db), "--json", "--no-compile", str(corpus), env=sandbox_env(tmp_path))
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    for name, expectation in expected.items():
        for outcome in expectation.outcomes:
            found = [f for f in report["failures"]
                     if Path(f["file"]) == corpus / name and f["index"] == outcome.index]
            if outcome.stage == OK:
                assert found == [], found
                continue
            assert [f["stage"] for f in found] == [outcome.stage], found
            assert any(m.lower() in found[0]["reason"].lower() for m in outcome.mentions), found
    assert report["injected"] == sum(e.ok_items for e in expected.values())


def _two_gib_address_space() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize("kind", ["dev_zero", "fifo"])
def test_a_special_file_named_on_the_command_line_fails_at_read(tmp_path: Path, kind: str):
    path = Path("/dev/zero")
    if kind == "fifo":
        path = tmp_path / "pipe.json"
        os.mkfifo(path)
    env = sandbox_env(tmp_path)
    try:  # the address-space limit keeps a kdb that reads /dev/zero from eating the machine's memory
        proc = kdb("inject", "--db", str(tmp_path / "kernel.db"), "--json", "--no-compile", "--workers", "1",
                   str(path), env=env, timeout=10, preexec_fn=_two_gib_address_space)
    except subprocess.TimeoutExpired:
        pytest.fail(f"inject {path} still running after 10 s")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 1, proc.stderr
    (failure,) = json.loads(proc.stdout)["failures"]
    assert (failure["file"], failure["index"], failure["stage"]) == (str(path), None, "read")
    assert any(m in failure["reason"].lower() for m in ("regular file", "not a file", "device", "fifo", "pipe"))


def test_off_a_terminal_a_failure_reason_stays_on_one_line(tmp_path: Path):
    """A CI log or a pipe: Rich would fold the failures table at 80 columns and split each reason."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"tvm_func_name": "k", "op_type": "NotAnOp", "parameters": {}, "code": "x",
                                "gridDim": [1, 1, 1], "blockDim": [1, 1, 1]}]))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = kdb("inject", "--db", str(tmp_path / "k.db"), "--no-compile", str(bad), env=env)
    assert proc.returncode == 1
    assert "'NotAnOp' is not an op type the compiler fetches from the kernel DB" in proc.stdout, proc.stdout
    assert "not run (--verify/--profile run them)" in proc.stdout
