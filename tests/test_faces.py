"""The console and the CLI run the same core function with the same request, for the runs not held elsewhere
(tests/test_tune_request.py: tune; test_generate_inject.py: generate and inject; test_db_plans.py: DB maintenance):
verify/profile on the GPU, the SM archs an injection is checked for, writing an op-config list."""

from __future__ import annotations

from pathlib import Path

import pytest
from console_helpers import FixedDeviceApp, build_small_db, wait_until

import console.entry
from console.context import ConsoleContext
from console.widgets.kernel_table import KernelTable
from core.gpu import rows as gpu_rows
from core.gpu.jobs import gpu_available
from core.gpu.rows import GpuCheckRequest
from core.settings import load_settings


@pytest.fixture
def gpu_requests(monkeypatch: pytest.MonkeyPatch) -> list[GpuCheckRequest]:
    """The requests core's check_db_rows is called with (it still runs: without a GPU it says there is none)."""
    real, requests = gpu_rows.check_db_rows, []

    def spy(request: GpuCheckRequest, **kw):  # type: ignore[no-untyped-def]
        requests.append(request)
        return real(request, **kw)

    monkeypatch.setattr(gpu_rows, "check_db_rows", spy)
    return requests


@pytest.mark.parametrize(("console_key", "command"), [("v", "verify"), ("P", "profile")])
async def test_verify_and_profile_on_the_gpu_send_one_request_from_both_faces(
        tmp_path: Path, gpu_requests: list[GpuCheckRequest], console_key: str, command: str):
    (tmp_path / "settings.toml").write_text('workers = 6\ngpu_timeout_s = 42\nproduct_name = "Test GPU"\n')
    db = build_small_db(tmp_path / "k.db")
    app = FixedDeviceApp(ConsoleContext(db_path=db, settings=load_settings(), device_summary="no GPU (test)"))
    async with app.run_test(size=(180, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_until(pilot, lambda: table.row_count > 0, "the first page")
        table.focus()
        key = table.current_key()
        await pilot.press(console_key)
        await wait_until(pilot, lambda: gpu_requests and not any(w.group == "gpu" and not w.is_finished
                                                                 for w in app.screen.query_one("KernelActions").workers),
                         "the GPU check to finish")
    status = console.entry.main(["gpu", command, str(key), "--db", str(db)])
    console_request, cli_request = gpu_requests
    assert console_request == cli_request
    assert (cli_request.keys, cli_request.profile, cli_request.product_name, cli_request.timeout_s) == (
        (key,), command == "profile", "Test GPU", 42)
    available, _ = gpu_available()
    assert status in ((0, 1) if available else (2,))  # without a CUDA device: said (the console notifies it)
