"""The op table's library figure: the fastest of several processes' timings (bench_tune.fastest_library).

On the H200 (session 10) cuDNN ran the 512x256 1x1 convolution in 26.8 us in one process and 15.4 us in the
next, the same DB and code: cudnn.benchmark picks its algorithm anew in each process. One pick made the
from-nothing geometric mean 0.613x; counting each op's cuDNN at the faster of the two processes makes it 0.643x."""

from __future__ import annotations

import copy
import json
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_tune import fastest_library, print_op_rows  # noqa: E402

RESULTS = REPO / "bench" / "results" / "h200" / "session10"
ONE_BY_ONE = "Convolution in 1x256x14x14 w 512x256x1x1 out 1x512x7x7 s2x2 p0x0"


def ops_json(archive: str) -> list[dict]:
    with tarfile.open(RESULTS / archive) as tar:
        member = tar.extractfile("net/ops.json")
        assert member is not None
        return json.loads(member.read())


def test_each_op_counts_the_librarys_fastest_pick_and_the_geomean_follows(capsys: pytest.CaptureFixture[str]):
    call5, call6 = ops_json("5-ops-results.tgz"), ops_json("6-extend-results.tgz")
    assert print_op_rows(call5) == pytest.approx(0.6129, abs=1e-4)  # what call 5 printed (one pick)
    other_pick = copy.deepcopy(call5)  # the same rows, cuDNN timed in another process: call 6's times
    library6 = {r["op"]: r["library_us"] for r in call6}
    for row in other_pick:
        row["library_us"] = library6[row["op"]]
    merged = fastest_library([call5, other_pick])
    one = next(r for r in merged if r["op"].startswith(ONE_BY_ONE))
    assert one["library_us"] == pytest.approx(15.36, abs=0.01) and one["library_picks_us"][0] == pytest.approx(26.816)
    assert one["ratio"] == pytest.approx(one["best_us"] / 15.36, rel=1e-3)
    assert all(r["library_us"] == min(r["library_picks_us"]) for r in merged if r["library_us"])
    assert print_op_rows(merged) == pytest.approx(0.643, abs=1e-3)
    assert "geometric mean 0.64x the library over 15" in capsys.readouterr().out


def test_picks_from_different_dbs_are_refused():
    call5, call6 = ops_json("5-ops-results.tgz"), ops_json("6-extend-results.tgz")  # call 6 tuned further
    with pytest.raises(ValueError, match="not taken on the same DB"):
        fastest_library([call5, call6])


@pytest.mark.parametrize(("call", "empty"), [("5-network-results.tgz", "1.00x"), ("8-network-results.tgz", None)])
def test_the_latency_table_has_no_ratio_to_an_empty_db_it_did_not_measure(call: str, empty: str | None,
                                                                          tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]):
    """Session 11's call 8 timed the tuned DB alone (CONTENDERS="tuned-best"): its table printed "nanx"."""
    from bench_network import summary

    with tarfile.open(REPO / "bench" / "results" / "h200" / "session11" / call) as tar:
        for member in tar.getmembers():
            if member.name.startswith("net/") and member.name.endswith(".json"):
                (tmp_path / Path(member.name).name).write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
    summary(tmp_path)
    table = capsys.readouterr().out
    tuned = next(line for line in table.splitlines() if line.startswith("NNFusion, tuned-best DB"))
    assert "nan" not in table.lower()
    if empty is None:
        assert tuned.split()[-2] == "-" and "0.6866" in tuned
    else:
        assert "0.71x" in tuned and empty in next(ln for ln in table.splitlines() if ln.startswith("NNFusion, empty"))


def test_the_op_table_counts_a_runner_up_row_that_runs_faster_than_the_best_row(tmp_path: Path):
    """Session 12's Conv+Add+Relu 512x256 s2 row ran 3x its record; its runner-ups (best2, best3) are rows of
    their own, and the table takes the op's fastest of them, as `kdb db fastest` keeps it for the network."""
    from bench_tune import op_table
    from test_pattern_twins import fused_row

    from core.codegen.generate import kernel_name
    from core.db.kernel_db import KernelDB
    from core.opconfigs.opconfig import parse_line
    from core.tuning.network import Network, NetworkOp

    config = parse_line("cudnn_avgpool_op_float|i+1_512_7_7|o+1_512_1_1|win+7_7|ws+1_1|pb+0_0|pa+0_0")
    stem = kernel_name(config).removesuffix("_kernel0")
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        for role, us in (("best", 111.2), ("best2", 40.3), ("best3", 45.0), ("efficient", 30.0)):
            miscs = {"kdb": {"name": f"{stem}_{role}_kernel0", "profile": {"NVIDIA H200": {"us": us}}}}
            db.insert(fused_row(f"kdb:{role}", miscs=json.dumps(miscs)))
    rows = op_table(tmp_path / "k.db", Network("n", [NetworkOp(config, 1, 90.3e-6)]))
    assert rows[0]["best_us"] == pytest.approx(40.3) and rows[0]["efficient_us"] == pytest.approx(30.0)


def test_the_network_steps_dbs_leave_the_ops_the_library_wins_to_it(tmp_path: Path):
    """`h200_network.sh network`'s DB variants from session 18's ResNet-50 tuning (H100): 9 tuned rows, two of them
    slower than cuDNN in its ops table. (Once this step imported a core function a refactor had renamed, and the
    device call lost its tuned contenders.)"""
    import gzip
    import shutil

    from bench_network import part_dbs

    from core.db.kernel_db import KernelDB

    session = REPO / "bench" / "results" / "h100" / "session18"
    tuned = tmp_path / "tuned.db"
    with gzip.open(session / "3-tuned.db.gz") as packed, tuned.open("wb") as db:
        shutil.copyfileobj(packed, db)
    with tarfile.open(session / "3-ops-network-results.tgz") as tar:
        member = tar.extractfile("./resnet50/ops.json")
        assert member is not None
        (tmp_path / "ops.json").write_bytes(member.read())
    part_dbs(tmp_path / "out", tuned, None, tmp_path / "ops.json")
    counts = {}
    for label in ("tuned-all", "tuned-best", "tuned-lib"):
        with KernelDB.open(tmp_path / "out" / f"{label}.db") as db:
            counts[label] = sum(1 for row in db.iter_rows() if row.device_type == "CUDA_GPU")
    assert counts == {"tuned-all": 9, "tuned-best": 9, "tuned-lib": 7}, counts  # the two 1x1 convs cuDNN wins
