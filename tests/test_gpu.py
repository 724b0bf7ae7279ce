"""GPU tests: run on a machine with a CUDA GPU and pycuda (`pytest -m gpu`); CI skips them, saying why.

They check the GPU side against itself and against the static analysis: verification catches a wrong
kernel, barrier counts on the GPU equal the static counts, timing gives positive numbers, and a kernel
that never returns is killed without taking the caller down.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import kernel_items, needs_artifact

from core.gpu.jobs import GpuSession, gpu_available, job_for_row

available, why = gpu_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not available, reason=f"needs a CUDA GPU and pycuda: {why}")]


STORE = "C[row * 128 + col] = acc;"  # the demo Dot kernel's one store: the tests plant their bugs there


def demo_dot() -> dict:
    """A kernel the project writes itself (core/demo.py): these tests need no ../shared, only a GPU."""
    from core.demo import demo_kernels

    item = next(k for k in demo_kernels() if k["tvm_func_name"] == "demo_dot_m64_k256_n128_kernel0")
    assert STORE in item["code"]
    return item


def wrong_dot() -> dict:
    item = demo_dot()
    return dict(item, code=item["code"].replace(STORE, "C[row * 128 + col] = 2 * acc;"))


def rows_of(items: list[dict]) -> list:
    from core.cuda.barriers import count_barriers
    from core.cuda.source import parse_kernel
    from core.kernels.kernel_json import validate_item
    from core.kernels.kernel_row import build_row

    out = []
    for item in items:
        spec = validate_item(item)
        src = parse_kernel(spec.code)
        out.append(build_row(spec, src, count_barriers(src, spec.block, spec.grid)))
    return out


@pytest.fixture(scope="module")
def session():
    with GpuSession(timeout_s=60) as s:
        yield s


@needs_artifact
def test_artifact_kernels_verify_and_gpu_barrier_counts_match_static_ones(session: GpuSession):
    rows = rows_of([item for _, _, item in kernel_items()])
    assert rows, "the artifact's folder holds no kernel JSON"
    mismatched = []
    for row in rows:
        verified = session.run(job_for_row(row, "verify"))
        assert verified.ok, f"{row.identifier}: {verified.reason}"
        counted = session.run(job_for_row(row, "barriers"))
        static = json.loads(row.function)["num_syncthreads"]
        if counted.barriers != static:
            mismatched.append((row.identifier, static, counted.barriers))
    assert mismatched == []


def test_a_wrong_kernel_fails_verification(session: GpuSession):
    result = session.run(job_for_row(rows_of([wrong_dot()])[0], "verify"))
    assert not result.ok and "relative error" in result.reason


def test_timing_gives_a_median_and_spread(session: GpuSession):
    row = rows_of([demo_dot()])[0]
    result = session.run(job_for_row(row, "time", repeats=50))
    assert result.ok and result.microseconds and result.microseconds > 0 and result.launches == 50
    assert result.spread is not None and result.spread[0] <= result.microseconds <= result.spread[1]


def test_a_hung_kernel_is_killed_and_the_session_goes_on(tmp_path: Path):
    item = demo_dot()
    # __nanosleep is a side effect, so the compiler keeps the endless loop.
    hung = dict(item, code=item["code"].replace(STORE, "for (;;) { __nanosleep(1000); }\n  " + STORE))
    with GpuSession(timeout_s=10) as session:
        result = session.run(job_for_row(rows_of([hung])[0], "verify"))
        assert not result.ok and "timed out" in result.reason
        again = session.run(job_for_row(rows_of([item])[0], "verify"))
        assert again.ok, again.reason


def test_the_nvcc_checks_cubin_verifies_and_times_like_a_fresh_compile(session: GpuSession, tmp_path: Path):
    """The child loads the cubin the nvcc check built (kdb_block_kernel) instead of compiling again: same
    verdict, same error, a time within the run-to-run spread; a wrong kernel still fails from its cubin."""
    from core.cuda.nvcc import compile_check, find_nvcc
    from core.gpu.inventory import detect_devices

    major, minor = detect_devices()[0][0].compute_capability
    arch = f"sm_{major}{minor}"
    good, bad = demo_dot(), wrong_dot()
    for item, should_pass in ((good, True), (bad, False)):
        row = rows_of([item])[0]
        built = compile_check(json.loads(row.function), arch, nvcc=find_nvcc(), flags=(), timeout_s=120,
                              workdir=tmp_path)
        assert built.ok and built.cubin[:4] == b"\x7fELF"
        fresh = session.run(job_for_row(row, "verify"))
        loaded = session.run(job_for_row(row, "verify", cubins={arch: built.cubin}))
        assert fresh.ok == loaded.ok == should_pass, (fresh.reason, loaded.reason)
        assert fresh.max_rel_error == loaded.max_rel_error
    timed = session.run(job_for_row(rows_of([good])[0], "time", cubins={arch: built.cubin}))
    assert timed.ok and timed.microseconds and timed.microseconds > 0
