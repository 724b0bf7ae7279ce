"""AutoTVM logs: every shared log parses, best times agree with an independent count, bad lines are reported."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
from conftest import ARTIFACT, run_kdb, run_kdb_json

from core.errors import InputError
from core.opconfigs.autotvm_log import MAX_LINE_BYTES, LogSummary, match, read_log, workload_key
from core.opconfigs.opconfig import read_opconfigs

LOGS = ARTIFACT / "autotvm_logs"
OP_CONFIGS = ARTIFACT / "op_configs"
ALEXNET = "alexnet_nchw_tuned_conv2d.1000.log"
DEEPSPEECH2 = "deepspeech2_tuned_conv2d.1000.log"
TILING_NN = "all_tuned_tilling_dense_nn.1000.log"
TOPI_DENSE = "all_tuned_topi_dense.1000.log"

pytestmark = pytest.mark.skipif(not LOGS.is_dir(), reason="../shared/nnfusion-artifact/autotvm_logs is not present")

# Counted once by hand from the files (json per line, grouped by (task, args)).
TOPI_TRIALS = {
    (1, 256, 10): 9, (1, 256, 256): 9, (1, 256, 512): 9, (1, 3008, 1024): 14, (1, 4096, 1000): 13,
    (1, 4096, 4096): 13, (1, 512, 1024): 10, (16, 256, 10): 9, (16, 256, 256): 9, (16, 256, 512): 9,
    (16, 3008, 1024): 14, (16, 512, 1024): 10, (1, 768, 10): 18, (1, 9216, 4096): 33, (4, 256, 10): 9,
    (4, 256, 256): 9, (4, 256, 512): 9, (4, 3008, 1024): 14, (4, 512, 1024): 10, (75, 256, 29): 1000,
    (1, 1056, 1000): 24, (1, 2048, 1000): 12,
}
EXPECTED = {  # file: (workloads, trials per workload (None: see TOPI_TRIALS), successes, errors by kind)
    ALEXNET: (5, 1000, 4550, {"INSTANTIATION_ERROR": 360, "RUNTIME_DEVICE": 50, "BUILD_TIMEOUT": 40}),
    DEEPSPEECH2: (2, 1000, 1766, {"INSTANTIATION_ERROR": 195, "RUNTIME_DEVICE": 36, "BUILD_TIMEOUT": 3}),
    TILING_NN: (8, 1000, 5924, {"INSTANTIATION_ERROR": 633, "COMPILE_HOST": 1417, "RUNTIME_DEVICE": 19,
                                "BUILD_TIMEOUT": 7}),
    TOPI_DENSE: (22, None, 814, {"INSTANTIATION_ERROR": 309, "COMPILE_HOST": 120, "RUNTIME_DEVICE": 3,
                                 "BUILD_TIMEOUT": 20}),
}


@pytest.fixture(scope="module")
def summaries() -> dict[str, LogSummary]:
    return {name: read_log(LOGS / name) for name in EXPECTED}


@pytest.mark.parametrize("name", EXPECTED)
def test_every_shared_log_parses_with_the_expected_counts(summaries: dict[str, LogSummary], name: str) -> None:
    summary = summaries[name]
    count, trials, successes, errors = EXPECTED[name]
    assert summary.bad_lines == [] and summary.bad_line_count == 0
    assert len(summary.workloads) == count
    if trials is None:
        assert {tuple(w.args): w.trials for w in summary.workloads} == TOPI_TRIALS
    else:
        assert all(w.trials == trials for w in summary.workloads)
    assert summary.records == sum(w.trials for w in summary.workloads)
    assert sum(w.successes for w in summary.workloads) == successes
    total: Counter[str] = Counter()
    for w in summary.workloads:
        total.update(w.errors_by_kind)
        assert w.successes + sum(w.errors_by_kind.values()) == w.trials
        assert w.op_config is not None, w.op_config_note
    assert dict(total) == errors


@pytest.mark.parametrize("name", EXPECTED)
def test_best_time_and_curve_match_an_independent_count(summaries: dict[str, LogSummary], name: str) -> None:
    times: dict[tuple[str, str], list[float]] = {}  # per workload, per trial: mean cost, inf when it failed
    stamps: dict[tuple[str, str], list[float]] = {}
    with (LOGS / name).open() as f:
        for line in f:
            record = json.loads(line)
            key = workload_key(record["i"][1], record["i"][2])
            costs, error_no, _, stamp = record["r"]
            times.setdefault(key, []).append(sum(costs) / len(costs) if error_no == 0 else math.inf)
            stamps.setdefault(key, []).append(stamp)
    for w in summaries[name].workloads:
        trial_times = times[w.workload]
        best = min(trial_times)
        assert w.best_seconds == best
        assert w.best_trial == trial_times.index(best) + 1
        assert w.best_so_far == [min(trial_times[: i + 1]) for i in range(len(trial_times))]
        assert (w.first_timestamp, w.last_timestamp) == (min(stamps[w.workload]), max(stamps[w.workload]))
        assert w.best_config and all(len(knob) == 3 for knob in w.best_config)


@pytest.mark.parametrize(("log", "opconfigs"), [(ALEXNET, "alexnet_conv_kernels.txt"),
                                                 (DEEPSPEECH2, "deepspeech2_conv_kernels.txt")])
def test_conv_workloads_match_the_shared_op_configs_one_to_one(summaries: dict[str, LogSummary], log: str,
                                                               opconfigs: str) -> None:
    configs = read_opconfigs(OP_CONFIGS / opconfigs)
    assert configs.errors == []
    summary = summaries[log]
    matched = match(summary, configs.configs)
    assert set(matched) == {w.workload for w in summary.workloads}
    assert sorted(c.source for c in matched.values()) == sorted(c.source for c in configs.configs)
    assert all(w.op_config is not None and w.op_config.op_type == "Convolution" for w in summary.workloads)


def test_dense_templates_get_the_right_transposes(summaries: dict[str, LogSummary], tmp_path: Path) -> None:
    for w in summaries[TILING_NN].workloads:  # A[M, K] x B[K, N]
        _, k, n = w.args
        assert w.op_config is not None and w.op_config.params["arg1_shape"] == [k, n]
        assert not w.op_config.params["transpose_B"]
    for w in summaries[TOPI_DENSE].workloads:  # TOPI dense: B is [N, K]
        _, k, n = w.args
        assert w.op_config is not None and w.op_config.params["arg1_shape"] == [n, k]
        assert w.op_config.params["transpose_B"]
    dots = tmp_path / "dots.txt"
    dots.write_text("cublas_dot_op_float|a+16_256|b+256_512|o+16_512|ta+0|tb+0\n"
                    "cublas_dot_op_float|a+16_256|b+512_256|o+16_512|ta+0|tb+1\n")
    configs = read_opconfigs(dots).configs
    assert [c.source for c in match(summaries[TILING_NN], configs).values()] == [f"{dots}:1"]
    assert [c.source for c in match(summaries[TOPI_DENSE], configs).values()] == [f"{dots}:2"]


def _corrupted_copy(tmp_path: Path) -> tuple[Path, dict[int, str]]:
    """The TOPI log with four bad lines inserted; returns the path and {line number: what is wrong}."""
    lines = (LOGS / TOPI_DENSE).read_text().splitlines(keepends=True)
    success = next(line for line in lines if json.loads(line)["r"][1] == 0)
    nan = json.loads(success)
    nan["r"][0] = [math.nan]
    bad = {
        10: lines[9][: len(lines[9]) // 2] + "\n",
        100: "this is not JSON\n",
        500: json.dumps({"i": ["cuda", "tvm_matmul_tune_op"], "r": [[1e-5], 0, 1.0, 1.0], "v": 0.1}) + "\n",
        1000: json.dumps(nan) + "\n",  # Python writes NaN, as TVM would
    }
    for number in sorted(bad):
        lines.insert(number - 1, bad[number])
    path = tmp_path / "corrupted.log"
    path.write_text("".join(lines))
    return path, {10: "truncated", 100: "not JSON", 500: '"i" must be', 1000: "cost nan"}


def test_a_corrupted_copy_reports_exactly_its_bad_lines(summaries: dict[str, LogSummary], tmp_path: Path) -> None:
    path, expected = _corrupted_copy(tmp_path)
    summary = read_log(path)
    assert [exc.where for exc in summary.bad_lines] == [f"{path}:{n}" for n in expected]
    for exc, reason in zip(summary.bad_lines, expected.values(), strict=True):
        assert reason in exc.reason, exc
    assert summary.bad_line_count == 4
    assert [w.as_dict() for w in summary.workloads] == [w.as_dict() for w in summaries[TOPI_DENSE].workloads]


def _record(task: str, args: list, error_no: int = 0, cost: float = 1e-5, knobs: list | None = None) -> str:
    config = {"i": 0, "t": "", "c": None, "e": knobs or [["tile_k", "sp", [-1, 2]]]}
    costs = [cost] if error_no == 0 else [1e9]
    return json.dumps({"i": ["cuda", task, args, {}, [task, *args], config], "r": [costs, error_no, 1.0, 1.0],
                       "v": 0.1})


def test_odd_lines_are_reported_and_odd_tasks_still_summarised(tmp_path: Path) -> None:
    dot = _record("tvm_matmul_tune_op", [4, 8, 16], cost=2e-5)
    path = tmp_path / "odd.log"
    path.write_bytes("\n".join([
        "# a comment", "", dot,
        "x" * (MAX_LINE_BYTES + 10),  # over the cap
        _record("tvm_matmul_tune_op", [4, 8, 16], error_no=9),
        _record("tvm_matmul_tune_op", [4, 8, 16], cost=-1.0),
        dot.replace("2e-05", "true"),  # a bool is no cost
        _record("my_task", ["anything", None]),
        _record("tvm_matmul_tune_op", [4, 8, 16], error_no=7),
        _record("tvm_matmul_tune_op", [4, 8, 16], cost=1e-5),
    ]).encode() + b"\n\xff\xfe\n" + dot[:40].encode())  # not UTF-8, then a last line cut short (no newline)
    summary = read_log(path)
    assert [(int(e.where.rsplit(":", 1)[1]), e.reason.split()[0]) for e in summary.bad_lines] == [
        (4, "line"), (5, "error_no"), (6, "cost"), (7, '"r"[0]'), (11, "not"), (12, "truncated")]
    dot_summary, other = summary.workloads
    assert (dot_summary.trials, dot_summary.successes, dot_summary.errors_by_kind) == (3, 2, {"RUN_TIMEOUT": 1})
    assert (dot_summary.best_seconds, dot_summary.best_trial, dot_summary.best_so_far) == (1e-5, 3, [2e-5, 2e-5, 1e-5])
    assert other.op_config is None and "my_task" in other.op_config_note and other.trials == 1


def test_a_workload_without_successes_has_no_best(tmp_path: Path) -> None:
    path = tmp_path / "failed.log"
    path.write_text(_record("tvm_matmul_tune_op", [4, 8, 16], error_no=1) + "\n")
    (w,) = read_log(path).workloads
    assert (w.best_seconds, w.best_trial, w.best_so_far) == (None, None, [math.inf])
    assert w.as_dict()["best_so_far"] == [None]


@pytest.mark.parametrize("make", [lambda p: p / "missing.log", lambda p: p])
def test_an_unreadable_log_raises_input_error(tmp_path: Path, make) -> None:
    with pytest.raises(InputError, match="cannot read"):
        read_log(make(tmp_path))


def test_cli_json(tmp_path: Path) -> None:
    opconfigs = OP_CONFIGS / "alexnet_conv_kernels.txt"
    proc, data = run_kdb_json("autotvm", "summary", str(LOGS / ALEXNET), "--opconfigs", str(opconfigs))
    assert proc.returncode == 0, proc.stderr
    assert data["log"] == str(LOGS / ALEXNET) and data["bad_lines"] == []
    assert len(data["workloads"]) == 5
    assert all(w["matched_op_config"].startswith(f"{opconfigs}:") for w in data["workloads"])
    assert all(len(w["best_so_far"]) == w["trials"] == 1000 for w in data["workloads"])

    path, expected = _corrupted_copy(tmp_path)
    proc, data = run_kdb_json("autotvm", "summary", str(path))
    assert proc.returncode == 1
    assert [b["line"] for b in data["bad_lines"]] == list(expected)


def test_cli_table_and_exit_codes(tmp_path: Path) -> None:
    proc = run_kdb("autotvm", "summary", str(LOGS / DEEPSPEECH2), env={"COLUMNS": "200"})  # cells unfolded
    assert proc.returncode == 0, proc.stderr
    assert "conv2d_nchw" in proc.stdout and "2000 records" in proc.stdout
    proc = run_kdb("autotvm", "summary", str(tmp_path / "missing.log"))
    assert proc.returncode == 2 and "cannot read" in proc.stderr
