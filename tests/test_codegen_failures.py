"""Codegen failures as failure records: what TVM said (cut to its decisive lines), the failing module's
TVMScript, the op config's file and line; retry generates again and injects; edit-and-retry edits the op
config; `kdb codegen` generates every good line and reports every bad one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_kdb, run_kdb_json

pytest.importorskip("tvm")

import core.codegen.schedule as schedule
from core.codegen.batch import generate_all, load_configs
from core.codegen.diagnostics import diagnose
from core.codegen.failures import CODEGEN_STAGE
from core.db.kernel_db import KernelDB
from core.db.state import Failure, StateDB
from core.inject.pipeline import InjectOptions
from core.inject.retry import retry_failures
from core.opconfigs.opconfig import parse_line, source_location
from core.opconfigs.ort_prepass import PrePass

RELU = "elementwise_relu_op_float|i+1_64|o+1_64"
CONV = "cudnn_convolution_op_float|i+1_8_8_8|w+8_8_3_3|o+1_8_8_8|ws+1_1|wd+1_1|p+1_1"
GROUPED = "cudnn_convolution_op_float|i+1_8_8_8|w+8_1_3_3|o+1_8_8_8|ws+1_1|wd+1_1|p+1_1|g+8"  # no kernel-DB op type


def schedule_error() -> BaseException:
    """A real ScheduleError: decompose_reduction on the output copy block, which is no reduction."""
    from tvm import s_tir
    from tvm.s_tir.schedule import ScheduleError

    from core.codegen.generate import prim_func_module

    mod, _ = prim_func_module(parse_line(CONV, "x"))
    sch = s_tir.Schedule(mod)
    out = sch.get_sblock("output0")
    with pytest.raises(ScheduleError) as raised:
        sch.decompose_reduction(out, sch.get_loops(out)[0])
    return raised.value


def broken_schedule(mod, threads: int = schedule.THREADS, *, bind: bool = True):  # type: ignore[no-untyped-def]
    """A schedule bug planted for the test: TVM refuses it with a ScheduleError."""
    from tvm import s_tir

    sch = s_tir.Schedule(mod)
    out = sch.get_sblock("output0")
    sch.decompose_reduction(out, sch.get_loops(out)[0])
    return sch.mod


def test_schedule_error_is_cut_to_its_decisive_lines_and_keeps_the_ir():
    d = diagnose(schedule_error())
    assert d.reason == ('ScheduleError in decompose-reduction: The block "output0" is not a reduction block - '
                        "it violates condition #1: The block has the `init` statement")
    assert d.excerpt.splitlines()[1:] == ['Error message: The block "output0" is not a reduction block - it violates '
                                          "condition #1.", "1) The block has the `init` statement"]
    lines = d.script.splitlines()
    assert lines[0].startswith("# from tvm.script") and not any(set(x.strip()) == {"^"} for x in lines)
    assert d.marked and 'T.sblock("output0")' in lines[d.marked[0] - 1]
    assert all('T.sblock("conv2d_nchw")' not in lines[n - 1] for n in d.marked)


def test_other_errors_keep_their_last_lines_without_the_traceback():
    class InternalError(RuntimeError):
        pass

    d = diagnose(InternalError("Traceback (most recent call last):\n  2: tvm::Foo\n  File \"x.py\", line 3\n"
                               "Check failed: fb->value != 0 (0 vs. 0) : Divide by zero"))
    assert d.reason == "InternalError: Check failed: fb->value != 0 (0 vs. 0) : Divide by zero"
    assert d.excerpt == "Check failed: fb->value != 0 (0 vs. 0) : Divide by zero" and d.script == ""


def test_a_pass_error_is_said_by_its_message_not_by_the_ir_it_underlines():
    """TVM 0.27's pass errors print the module after "Location (TVMScript):", underlined: the reason was the last
    underline ("ValueError: ^^^^", a half global MaxPool's codegen failure in session 25's review)."""
    d = diagnose(ValueError("No matched reducer for the identity and the combiner of the reduction block.\n\n"
                            "Error in pass: _pipeline\nLocation (TVMScript):\nAccess path: <root>.functions\n"
                            "Note: The underlined object is the nearest visible parent of this path.\n"
                            "# from tvm.script import ir as I\n@I.ir_module\nclass Module:\n"
                            "    x = T.max(a, b)\n    ^^^^^^^^^^^^^^^"))
    assert d.reason == "ValueError: No matched reducer for the identity and the combiner of the reduction block."
    assert "Error in pass: _pipeline" in d.excerpt and "^" not in d.excerpt
    assert d.script.startswith("# from tvm.script") and d.marked == [4]


def test_source_location_of_each_kind_of_source():
    assert source_location("/w/ops.txt:12") == ("/w/ops.txt", 12)
    assert source_location("ops.toml#3") == ("ops.toml", 3)
    assert source_location("/m/model.onnx:conv1:0") == ("/m/model.onnx", None)
    assert source_location("typed in") == ("typed in", None)


def open_failures(db_path: Path) -> list[Failure]:
    state = StateDB()
    try:
        return state.failures(db_path)
    finally:
        state.close()


def generate_file(tmp_path: Path, lines: list[str]):  # type: ignore[no-untyped-def]
    ops = tmp_path / "ops.txt"
    ops.write_text("\n".join(lines) + "\n")
    configs, errors = load_configs([ops], prepass=PrePass.not_checked("op-config files only"))
    state = StateDB()
    try:
        return generate_all(configs, "sm_90", state=state, db_path=tmp_path / "k.db"), errors, ops
    finally:
        state.close()


def test_a_schedule_failure_is_recorded_with_the_ir_tvm_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(schedule, "default_schedule", broken_schedule)
    report, _, ops = generate_file(tmp_path, [RELU, CONV])  # the element-wise op has no reduction either
    assert len(report.failed) == 2
    failure = open_failures(tmp_path / "k.db")[1]
    detail = failure.detail_dict()
    assert (failure.stage, failure.file, failure.item_index) == (CODEGEN_STAGE, str(ops), 2)
    assert failure.reason.startswith("ScheduleError in decompose-reduction: The block \"output0\"")
    assert detail["source"] == f"{ops}:2" and detail["op_config"] == CONV and detail["codegen_stage"] == "schedule"
    assert "Error message" in detail["tvm_error"] and "T.sblock" not in detail["tvm_error"]
    script = detail["tvmscript"].splitlines()
    assert 'T.sblock("output0")' in script[detail["marked"][0] - 1]
    assert json.loads(failure.input) == parse_line(CONV).to_dict()


def test_retry_generates_again_and_injects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with monkeypatch.context() as patch:
        patch.setattr(schedule, "default_schedule", broken_schedule)
        generate_file(tmp_path, [CONV, GROUPED])
    # the schedule is fixed now
    db_path = tmp_path / "k.db"
    state = StateDB()
    try:
        ids = [f.id for f in state.failures(db_path)]
        seen: list[tuple[int, int]] = []
        report = retry_failures(ids, db_path, InjectOptions(compile=False), state=state,
                                on_progress=lambda p: seen.append((p.items_done, p.items_seen)))
        assert seen[-1] == (2, 2)  # the op config that failed again counts as a retried item
        with KernelDB.open(db_path) as db:
            assert db.count() == 1
            assert len(db.find(parse_line(CONV).signature().identifier)) == 1
        assert (report.injected, report.failed) == (1, 1)
        [grouped] = state.failures(db_path)  # failed again: a fresh record, the old one superseded
        assert grouped.id not in ids and grouped.stage == CODEGEN_STAGE and "DepthwiseConv2dNative" in grouped.reason
        assert grouped.item_index == 2 and grouped.detail_dict()["codegen_stage"] == "define"
        closed = {f.id: f for f in state.failures(db_path, include_closed=True)}
        assert closed[ids[0]].resolved_at is not None and closed[ids[1]].dismissed
    finally:
        state.close()


def test_edit_and_retry_generates_the_edited_op_config(tmp_path: Path):
    generate_file(tmp_path, [GROUPED])
    db_path = tmp_path / "k.db"
    state = StateDB()
    try:
        [failure] = state.failures(db_path)
        assert failure.id is not None
        state.update_input(failure.id, "{not json")  # an edit that does not read: it fails again, kept to fix
        retry_failures([failure.id], db_path, InjectOptions(compile=False), state=state)
        [again] = state.failures(db_path)
        assert again.input == "{not json" and "not valid JSON" in again.reason and again.item_index == 1
        assert again.id is not None
        fixed = {**parse_line(GROUPED).to_dict(), "filter_shape": [8, 8, 3, 3]}
        del fixed["groups"]
        state.update_input(again.id, json.dumps(fixed))
        report = retry_failures([again.id], db_path, InjectOptions(compile=False), state=state)
        with KernelDB.open(db_path) as db:
            assert report.injected == 1 and db.count() == 1
        assert state.failures(db_path) == []
    finally:
        state.close()


def test_cli_generates_every_good_line_and_reports_every_bad_one(tmp_path: Path):
    ops = tmp_path / "ops.txt"
    ops.write_text("\n".join([RELU, "bogus_op_float|x+1", GROUPED, "elementwise_relu_op_float|i+4|o+5", CONV]) + "\n")
    out = tmp_path / "kernels.json"
    proc = run_kdb("codegen", str(ops), "-o", str(out))
    assert proc.returncode == 1, proc.stderr
    assert f"{ops}:2:" in proc.stderr and f"{ops}:4:" in proc.stderr  # both malformed lines, not just the first
    assert "2 kernels generated" in proc.stderr and "3 failed" in proc.stderr and f"{ops}:3" in proc.stderr
    assert len(json.loads(out.read_text())) == 2
    proc, listed = run_kdb_json("failures")
    assert proc.returncode == 1
    assert [(f["file"], f["index"], f["stage"]) for f in listed["failures"]] == [(str(ops), 3, "codegen")]
    table = run_kdb("failures", cwd=tmp_path.parent, env={"COLUMNS": "200"}).stdout
    # (the file's name alone cannot tell two models' ops.txt apart: its folder, relative to where kdb runs)
    assert f"{tmp_path.name}/ops.txt" in table, table

    proc, report = run_kdb_json("codegen", str(ops), "-o", str(out))
    assert proc.returncode == 1 and report["generated"] == 2 and report["failed"] == 3
    assert sorted(f["stage"] for f in report["failures"]) == ["define", "read", "read"]


def test_cli_with_only_bad_lines_lists_them_all_and_exits_1(tmp_path: Path):
    ops = tmp_path / "ops.txt"
    ops.write_text("bogus\nalso bogus\n")
    proc = run_kdb("codegen", str(ops), "-o", str(tmp_path / "k.json"))
    assert proc.returncode == 1
    assert f"{ops}:1:" in proc.stderr and f"{ops}:2:" in proc.stderr and "2 failed" in proc.stderr


def test_a_compile_failure_is_not_retried_by_injection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from core.db.state import Failure, StateDB
    from core.errors import InputError
    from core.inject.retry import retry_failures

    monkeypatch.setenv("KDB_STATE_DIR", str(tmp_path / "state"))
    state = StateDB()
    state.record_failures([Failure(db_path=str(tmp_path / "k.db"), file=str(tmp_path / "m.onnx"), stage="nnfusion",
                                   reason="nnfusion exited with status -11")])
    (failure,) = state.failures()
    from core.inject.pipeline import InjectOptions

    with pytest.raises(InputError, match="compiling again"):
        retry_failures([failure.id], tmp_path / "k.db", InjectOptions(compile=False), state=state)
    assert [f.id for f in state.failures()] == [failure.id]  # still open
