"""The CLI's contract, as the README states it, for every subcommand: `--json` prints one JSON object (`kdb tune
--json`: JSON lines), also when the command cannot run; exit status 0 ok, 1 failures or findings, 2 could not
run, 130 interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, run_kdb
from console_helpers import build_small_db

from console.cli.parser import build_parser
from core.db.kernel_db import KernelDB
from core.demo import demo_kernels

GOOD_OPCONFIG = "elementwise_relu_op_float|i+8_256|o+8_256\n"


@dataclass
class World:
    """A small DB of the demo kernels (the unprovable one a recorded failure) and inputs for every command."""

    tmp: Path
    db: Path
    key: str

    def file(self, name: str, text: str) -> str:
        path = self.tmp / name
        path.write_text(text, encoding="utf-8")
        return str(path)

    def kernels(self, items: list[dict]) -> str:
        return self.file("kernels.json", json.dumps(items))


@pytest.fixture
def world(tmp_path: Path) -> World:
    db = build_small_db(tmp_path / "kernel_cache.db")  # KDB_DB points here (conftest)
    with KernelDB.open(db) as kdb:
        key = kdb.iter_rows().__next__().key
    return World(tmp_path, db, key)


def autotvm_log(world: World, *, bad_line: bool) -> str:
    record = {"i": ["cuda", "tvm_matmul_tune_op", [4, 8, 16], {}, ["tvm_matmul_tune_op", 4, 8, 16],
                    {"i": 0, "t": "", "c": None, "e": [["tile_k", "sp", [-1, 2]]]}],
              "r": [[1e-5], 0, 1.0, 1.0], "v": 0.1}
    return world.file("tuning.log", json.dumps(record) + "\n" + ("not a record\n" if bad_line else ""))


def lint_problem(world: World) -> list[str]:
    """Plants a row the compiler would crash on (External without BlockCudaEmitter); no arguments to add."""
    with KernelDB.open(world.db, write=True) as db, db.writing() as conn:
        conn.execute("UPDATE KernelCache SET Tags = 'KernelEmitter' WHERE Key = ?", (world.key,))
    return []


def onnx_model(world: World) -> str:
    pytest.importorskip("onnx")
    from onnx_models import resnet_block, write

    return str(write(resnet_block(), world.tmp / "block.onnx"))


def tvm_opconfigs(world: World) -> str:
    pytest.importorskip("tvm")
    return world.file("ops.txt", GOOD_OPCONFIG)


def undo_file(world: World) -> str:
    """The undo file of a plan applied to the world's DB (its key's op made standalone)."""
    from core.db.maintenance import apply_plan, standalone_plan

    with KernelDB.open(world.db, write=True) as db:
        return str(apply_plan(db, standalone_plan(db, [world.key]), undo_dir=world.tmp / "undo").undo_file)


def unusable_db(world: World) -> list[str]:
    path = world.tmp / "not-a-db.db"
    path.write_bytes(b"a kernel list, not a database\n" * 100)
    return ["--db", str(path)]


# (case, exit status, the arguments before --json, given the world). Every subcommand of the parser appears here
# at least once; test_every_subcommand_has_a_case checks that.
CASES: list[tuple[str, int, Callable[[World], list[str]]]] = [
    ("inject", 0, lambda w: ["inject", "--no-compile", w.kernels(demo_kernels()[:3])]),
    ("inject: a bad kernel", 1, lambda w: ["inject", "--no-compile", w.kernels([{"op_type": "Relu"}])]),
    ("inject: no such file", 2, lambda w: ["inject", "--no-compile", str(w.tmp / "none.json")]),
    ("ls", 0, lambda w: ["ls"]),
    ("ls: an unusable DB", 2, lambda w: ["ls", *unusable_db(w)]),
    ("show", 0, lambda w: ["show", w.key]),
    ("show: no such kernel", 2, lambda w: ["show", "no-such-kernel"]),
    ("lint", 0, lambda w: ["lint"]),
    ("lint: a crash row", 1, lambda w: ["lint", *lint_problem(w)]),
    ("failures: one open", 1, lambda w: ["failures"]),
    ("failures: none for this DB", 0, lambda w: ["failures", "--db", str(w.tmp / "other.db")]),
    ("failures dismiss", 0, lambda w: ["failures", "dismiss", "--all"]),
    ("failures retry: fails again", 1, lambda w: ["failures", "retry", "--all"]),
    ("failures retry: no IDs", 2, lambda w: ["failures", "retry"]),
    ("db init", 0, lambda w: ["db", "init", "--db", str(w.tmp / "new.db")]),
    ("db check", 0, lambda w: ["db", "check"]),
    ("db check: a crash row", 1, lambda w: ["db", "check", *lint_problem(w)]),
    ("db repair", 0, lambda w: ["db", "repair"]),  # the demo kernels hold no fused pair to repair
    ("db repair: an unusable DB", 2, lambda w: ["db", "repair", *unusable_db(w)]),
    ("db fastest", 0, lambda w: ["db", "fastest", "--product", "NVIDIA H200"]),
    ("db fastest: no GPU named, none in the profiles", 2, lambda w: ["db", "fastest"]),
    ("db standalone", 0, lambda w: ["db", "standalone", w.key, "--apply"]),
    ("db standalone: no such row", 2, lambda w: ["db", "standalone", "kdb:no-such-row"]),
    ("db leave-to-library: nothing measured", 0, lambda w: ["db", "leave-to-library", w.file(
        "times.json", json.dumps({"device": "NVIDIA H200", "ops": [{"identifier": "Relu", "library_us": None}]}))]),
    ("db leave-to-library: no GPU named", 2, lambda w: ["db", "leave-to-library", w.file(
        "times.json", json.dumps({"ops": []}))]),
    ("db undo", 0, lambda w: ["db", "undo", undo_file(w), "--apply"]),
    ("db undo: not an undo file", 2, lambda w: ["db", "undo", *unusable_db(w)[1:]]),
    ("db convert", 0, lambda w: ["db", "convert", str(w.db), str(w.tmp / "converted.db")]),
    ("db convert: the destination exists", 2, lambda w: ["db", "convert", str(w.db), str(w.db)]),
    ("db backup", 0, lambda w: ["db", "backup", str(w.tmp / "backup.db")]),
    ("db backup: an unusable DB", 2, lambda w: ["db", "backup", *unusable_db(w), str(w.tmp / "b.db")]),
    ("settings", 0, lambda w: ["settings"]),
    ("settings: an unknown key", 2, lambda w: ["settings", "colour=blue"]),
    ("opconfig check", 0, lambda w: ["opconfig", "check", w.file("ops.txt", GOOD_OPCONFIG)]),
    ("opconfig check: a bad line", 1, lambda w: ["opconfig", "check", w.file("ops.txt", GOOD_OPCONFIG + "x|y\n")]),
    ("opconfig extract", 0, lambda w: ["opconfig", "extract", onnx_model(w)]),
    ("model fp16", 0, lambda w: ["model", "fp16", onnx_model(w), str(w.tmp / "block16.onnx")]),
    ("model fp16: not a model", 2, lambda w: ["model", "fp16", w.file("x.onnx", "not a model"), str(w.tmp / "o.onnx")]),
    ("model expand", 0, lambda w: ["model", "expand", onnx_model(w), str(w.tmp / "blockx.onnx")]),
    ("model expand: not a model", 2, lambda w: ["model", "expand", w.file("x.onnx", "not a model"),
                                                 str(w.tmp / "o.onnx")]),
    ("coverage: ops missing", 1, lambda w: ["coverage", onnx_model(w)]),
    ("coverage: no such model", 2, lambda w: ["coverage", str(w.tmp / "none.onnx")]),
    ("nnfusion: no compiler", 2, lambda w: ["nnfusion", onnx_model(w), "--nnfusion", str(w.tmp / "no-nnfusion")]),
    ("nnfusion --op-times: no kernel DB", 2, lambda w: ["nnfusion", onnx_model(w), "--db", str(w.tmp / "none.db"),
                                                        "--op-times", str(w.tmp / "T.json")]),
    ("autotvm summary", 0, lambda w: ["autotvm", "summary", autotvm_log(w, bad_line=False)]),
    ("autotvm summary: a bad line", 1, lambda w: ["autotvm", "summary", autotvm_log(w, bad_line=True)]),
    ("codegen", 0, lambda w: ["codegen", tvm_opconfigs(w), "-o", str(w.tmp / "out.json")]),
    ("codegen: an input it cannot read", 1, lambda w: ["codegen", w.file("bad.txt", "not an op config\n")]),
    ("codegen: no such file", 2, lambda w: ["codegen", str(w.tmp / "none.txt")]),  # as inject and coverage
    ("gpu devices", 1, lambda w: ["gpu", "devices"]),  # none on a CI machine: the GPU tests cover a real one
    ("gpu verify: no GPU", 2, lambda w: ["gpu", "verify", "--all"]),
    ("gpu profile: no GPU", 2, lambda w: ["gpu", "profile", "--all"]),
    ("tune: no op configs", 2, lambda w: ["tune", w.file("empty.txt", "# nothing\n")]),
]


@pytest.mark.parametrize(("case", "status", "argv"), CASES, ids=[c[0] for c in CASES])
def test_json_is_one_object_and_the_exit_status_says_how_it_went(world: World, case: str, status: int,
                                                                   argv: Callable[[World], list[str]]):
    if case.startswith("gpu devices") or case.startswith(("gpu verify", "gpu profile")):
        _skip_on_a_gpu_machine()
    proc = run_kdb(*argv(world), "--json")
    assert proc.returncode == status, proc.stderr[-2000:]
    if case.startswith("tune"):  # JSON lines, each an object
        lines = [json.loads(line) for line in proc.stdout.splitlines()]
        assert lines and all(isinstance(line, dict) for line in lines), proc.stdout
        value = lines[-1]
    else:
        value = json.loads(proc.stdout)  # exactly one JSON value: anything after it fails to parse
        assert isinstance(value, dict), proc.stdout
    if status == 2:
        assert value.get("error") and value["error"] in proc.stderr


def _skip_on_a_gpu_machine() -> None:
    from core.gpu.jobs import gpu_available

    if gpu_available()[0]:
        pytest.skip("this case is about a machine with no GPU")


def _subcommands() -> list[str]:
    """Every leaf command of the parser, e.g. "ls", "db check", "gpu devices"."""
    import argparse

    def leaves(parser: argparse.ArgumentParser, prefix: str) -> list[str]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return [prefix]
        return [leaf for name, sub in subs[0].choices.items() for leaf in leaves(sub, f"{prefix} {name}".strip())]

    return leaves(build_parser(), "")


def test_every_subcommand_takes_json_and_has_a_case():
    import argparse

    parser = build_parser()
    for command in _subcommands():
        if command == "console":  # the full-screen app: nothing to script
            continue
        sub = parser
        for word in command.split():
            sub = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
        assert "--json" in sub._option_string_actions, f"kdb {command} has no --json"
        assert any(c[0] == command or c[0].startswith(f"{command}:") for c in CASES), f"kdb {command}: no case"


def test_bad_arguments_exit_2(world: World):
    for argv, reason in ((["ls", "--limit", "0"], "argument --limit"), (["db"], "required: ACTION"),
                         (["no-such-command"], "invalid choice")):
        proc = run_kdb(*argv)
        assert proc.returncode == 2 and reason in proc.stderr, (argv, proc.stderr)


def test_codegen_of_nothing_readable_writes_no_kernels_file(world: World):
    """Held out in session 28: `kdb codegen missing.txt -o kernels.json` wrote `[]`, which `kdb inject` then took;
    a missing file is now refused before anything runs (exit 2, as inject's), a file of bad lines reported (exit 1)."""
    out = world.tmp / "nothing.json"
    proc = run_kdb("codegen", str(world.tmp / "missing.txt"), str(world.tmp), "-o", str(out))
    assert proc.returncode == 2 and "no such file or directory: " in proc.stderr and "missing.txt" in proc.stderr \
        and "nothing written" in proc.stderr and not proc.stdout.strip(), proc.stderr
    assert not out.exists()
    proc = run_kdb("codegen", world.file("bad.txt", "not an op config\n"), "-o", str(out))
    assert proc.returncode == 1 and "nothing written" in proc.stderr, proc.stderr
    assert not out.exists()


def test_a_closed_pipe_ends_ls_quietly(world: World):
    """`kdb ls --all | head -1`: the reader goes away; no traceback, exit 0."""
    cmd = [sys.executable, "-m", "console.entry", "ls", "--all"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=60) == 0
    assert b"Traceback" not in proc.stderr.read()


def many_kernels(n: int) -> list[dict]:
    """n distinct kernels (the demo's, each copy with a comment of its own in the body): a few seconds' work."""
    base = demo_kernels()[:-1]  # the unprovable one fails: leave it out
    out = []
    for i in range(n):
        item = dict(base[i % len(base)])
        brace = item["code"].index("{")
        item["code"] = item["code"][: brace + 1] + f"\n  // copy {i}\n" + item["code"][brace + 1:]
        out.append(item)
    return out


def test_a_first_ctrl_c_cancels_inject_and_exits_130(world: World):
    """The first SIGINT asks inject to stop after the kernel in flight: what was committed stays, the summary
    says cancelled, and the exit status says interrupted (130), as for a second Ctrl-C."""
    src = world.kernels(many_kernels(4000))
    cmd = [sys.executable, "-m", "console.entry", "inject", "--no-compile", "--jsonl", src]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        first = json.loads(proc.stdout.readline())
        assert first["event"] == "committed", first
        proc.send_signal(signal.SIGINT)
        rest = [json.loads(line) for line in proc.stdout]
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = rest[-1]
    assert summary["event"] == "summary" and summary["cancelled"], summary
    assert summary["injected"] < 4000 - len(demo_kernels())  # it stopped early


@pytest.mark.tvm
@pytest.mark.slow
def test_a_first_ctrl_c_cancels_tune_and_exits_130(tmp_path: Path):
    """A first Ctrl-C lets tune end the batch in flight and stop; the summary says cancelled, the exit status
    130."""
    pytest.importorskip("tvm")
    config = tmp_path / "dot.txt"
    config.write_text("cublas_dot_op_float|a+16_16|b+16_16|o+16_16|ta+0|tb+0\n")
    cmd = [sys.executable, "-m", "console.entry", "tune", str(config), "--target", "llvm", "--trials", "64",
           "--json"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:  # Ctrl-C as the job starts: it stops after its first batch of trials
            if json.loads(line).get("status") == "tuning":
                proc.send_signal(signal.SIGINT)
                break
        lines = [json.loads(line) for line in proc.stdout]
        assert proc.wait(timeout=600) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert lines[-1]["event"] == "summary" and lines[-1]["cancelled"]
