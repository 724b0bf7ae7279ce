"""When the best record's row runs far slower than the record, the next records are injected and timed as rows too.

The records are real: the AvgPool of ResNet-18 as the H200 tuned it in session 12 (66 MetaSchedule records, in
bench/results/h200/session12/7-state.tgz). TVM generates their CUDA here; the GPU stage is the stand-in child of
test_gpu_parallel (it answers 7.5 us for every kernel), so the row-to-record ratio is what the test sets.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import session12_job
from test_gpu_parallel import stand_in  # noqa: F401  (the fixture)
from test_kernel_row import NVCC

from core.db.kernel_db import KernelDB
from core.inject.pipeline import InjectOptions
from core.tuning import queue
from core.tuning.harvest import runner_up_kernels, scored_records
from core.tuning.job import TuneJob, TuneResult
from core.tuning.records import recorded_runs

AVGPOOL = "cudnn_avgpool_op_float|i+1_512_7_7|o+1_512_1_1|win+7_7|ws+1_1|pb+0_0|pa+0_0"

pytestmark = [pytest.mark.tvm, pytest.mark.skipif(not NVCC, reason="nvcc not found: kernels are compile-checked")]


@pytest.fixture
def avgpool(tmp_path: Path) -> tuple[TuneJob, Path]:
    """The job and a work dir holding its records (the op folder of the session-12 state)."""
    job = session12_job(AVGPOOL, tmp_path)
    return job, job.work_dir


def test_runner_ups_are_the_next_distinct_kernels_by_record_time(avgpool: tuple[TuneJob, Path]):
    job, work = avgpool
    scored = scored_records(job, work)
    kernels = queue.best_kernels(job, work, scored=scored)
    best = kernels.kernels["best"]
    best_seconds = next(c["seconds"] for c in kernels.candidates if c["role"] == "best")
    ups = runner_up_kernels(job, work, scored, [best["code"]], 2, after_seconds=best_seconds)
    assert [role for role, _s, _item in ups] == ["best2", "best3"]
    codes = [item["code"] for _r, _s, item in ups]
    assert len({best["code"], *codes}) == 3  # three different kernels
    fastest = min(t for t in recorded_runs(work) if t is not None)
    assert fastest <= ups[0][1] and fastest <= ups[1][1]
    # the first runner-up has another block size than the best (the row's form differs most where the block
    # does); the second is the next by time
    assert ups[0][2]["blockDim"] != best["blockDim"], (ups[0][2]["blockDim"], best["blockDim"])
    assert all(item["tvm_func_name"].endswith(f"_{role}_kernel0") for role, _s, item in ups)


def test_a_slow_best_row_brings_the_next_records_in_as_rows(avgpool: tuple[TuneJob, Path], tmp_path: Path,
                                                            stand_in: Path, isolated_env: Path):  # noqa: F811
    job, work = avgpool
    # The stand-in times every row at 7.5 us; the record says 5.0 us: the best row runs 1.5x its record.
    result = TuneResult(job, work)
    events: list[tuple[str, str]] = []
    options = InjectOptions(archs=("sm_90",), nvcc=NVCC, workers=1, verify=True, profile=True)
    real_best = queue.best_kernels

    def best_at_5_us(*args, **kwargs):  # type: ignore[no-untyped-def]
        kernels = real_best(*args, **kwargs)
        kernels.candidates = [{**c, "seconds": 5e-6} for c in kernels.candidates]
        return kernels

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(queue, "best_kernels", best_at_5_us)
        queue._inject(0, job, result, tmp_path / "k.db", options, queue.QueueReport(),
                      lambda i, status, detail, **_: events.append((status, detail)))
    status, detail = events[-1]
    assert status == "done" and "injected 1," in detail, detail  # the job's own kernel; the line says the rest
    assert "the best row runs 1.5x its record; the next records as rows: best2 7.5 us (record " in detail, detail
    assert ", best3 7.5 us (record " in detail, detail
    with KernelDB.open(tmp_path / "k.db") as db:
        names = [json.loads(r.miscs)["kdb"]["name"] for r in db.iter_table_order() if r.device_type == "CUDA_GPU"]
    assert [n.rsplit("_", 2)[-2] for n in names] == ["best", "best2", "best3"]


def test_a_best_row_near_its_record_brings_nothing_more(avgpool: tuple[TuneJob, Path], tmp_path: Path,
                                                        stand_in: Path, isolated_env: Path):  # noqa: F811
    job, work = avgpool
    events: list[tuple[str, str]] = []
    options = InjectOptions(archs=("sm_90",), nvcc=NVCC, workers=1, verify=True, profile=True)
    real_best = queue.best_kernels

    def best_at_7_us(*args, **kwargs):  # type: ignore[no-untyped-def]
        kernels = real_best(*args, **kwargs)
        kernels.candidates = [{**c, "seconds": 7e-6} for c in kernels.candidates]  # the row: 7.5 us, 1.07x
        return kernels

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(queue, "best_kernels", best_at_7_us)
        queue._inject(0, job, TuneResult(job, work), tmp_path / "k.db", options, queue.QueueReport(),
                      lambda i, status, detail, **_: events.append((status, detail)))
    status, detail = events[-1]
    assert status == "done" and "injected 1," in detail and "next records" not in detail, detail


def test_the_first_runner_up_is_the_fastest_record_of_another_block_size():
    from core.tuning.harvest import _runner_up_order

    records = [(1.1e-5, 0, "same block, second fastest", 64), (1.0e-5, 0, "the best", 64),
               (1.5e-5, 0, "another block", 128), (1.2e-5, 0, "same block, third", 64)]
    assert [r[2] for r in _runner_up_order(records)] == [
        "another block", "the best", "same block, second fastest", "same block, third"]
    one_size = [r for r in records if r[3] == 64]
    assert [r[2] for r in _runner_up_order(one_size)] == ["the best", "same block, second fastest", "same block, third"]
