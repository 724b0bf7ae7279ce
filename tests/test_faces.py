"""The console and the CLI run the same core function with the same request, for the runs not held elsewhere
(tests/test_tune_request.py: tune; test_generate_inject.py: generate and inject; test_db_plans.py: DB maintenance):
verify/profile on the GPU, the SM archs an injection is checked for, writing an op-config list."""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path

import pytest
from console_helpers import FixedDeviceApp, build_small_db, wait_until

import console.entry
from console.context import ConsoleContext
from console.widgets.kernel_table import KernelTable
from core.cuda.nvcc import probe_nvcc
from core.gpu import rows as gpu_rows
from core.gpu.jobs import gpu_available
from core.gpu.rows import GpuCheckRequest
from core.settings import archs_problem, load_settings, parse_value, setting_problem


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


# -- the SM archs an injection is checked for, and the settings' -----------------------------------------------------

NVCC = probe_nvcc("")
needs_nvcc = pytest.mark.skipif(bool(NVCC.problem), reason=f"needs nvcc: {NVCC.problem}")


@needs_nvcc
@pytest.mark.parametrize("typed", ["sm_99", "sm_90, banana", "sm_90a"])
async def test_inject_checks_the_archs_it_is_given_the_same_way_in_both_faces(
        tmp_path: Path, typed: str, capsys: pytest.CaptureFixture[str]):
    """The Inject view refused sm_90a, which nvcc builds (compute_90 is listed, 90a is its variant); the CLI too;
    the settings form took it. One rule now (core.settings.archs_problem), and one message."""
    from test_console_inject import VALID, make_app, open_inject, text, wait_for
    from textual.widgets import Input

    source = tmp_path / "kernels.json"
    source.write_text(json.dumps(VALID[:1]), encoding="utf-8")
    expected = archs_problem(parse_value("archs", typed), NVCC)
    app = make_app(tmp_path / "console.db")
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_inject(pilot)
        screen.add_path(source)
        screen.query_one("#archs", Input).value = typed
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: screen.query_one("#archs-error").display or screen.report is not None,
                       "the archs refused, or the run's report")
        shown = text(screen, "#archs-error") if screen.query_one("#archs-error").display else ""
    status = console.entry.main(["inject", str(source), "--db", str(tmp_path / "cli.db"),
                                 *[a for arch in parse_value("archs", typed) for a in ("--arch", arch)]])
    said = capsys.readouterr().err
    assert shown == expected
    if expected:
        assert status == 2 and expected in " ".join(said.split()), said
    else:
        assert status == 0 and screen.report is not None and screen.report.injected == 1, said


@needs_nvcc
@pytest.mark.parametrize(("name", "typed"), [("archs", "sm_99"), ("archs", "sm_80, sm_90a"), ("workers", "many"),
                                             ("nvcc_path", "/nowhere/bin/nvcc")])
async def test_a_setting_is_taken_or_refused_alike_by_the_form_and_kdb_settings(
        tmp_path: Path, name: str, typed: str, capsys: pytest.CaptureFixture[str]):
    from test_console_settings import make_app, open_settings, text_of, type_into, until

    from core.settings import settings_path

    expected = setting_problem(name, typed, probe_nvcc(typed if name == "nvcc_path" else ""))
    status = console.entry.main(["settings", f"{name}={typed}"])
    said = " ".join(capsys.readouterr().err.split())
    cli_saved = settings_path().read_text() if settings_path().exists() else ""
    settings_path().unlink(missing_ok=True)
    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_settings(pilot)
        await type_into(pilot, name, typed)
        await pilot.press("ctrl+s")
        await until(pilot, lambda: text_of(screen, f"#error-{name}") or settings_path().exists(), "the save checked")
        shown = text_of(screen, f"#error-{name}").removeprefix("✗ ")
    assert shown == expected
    if expected:
        assert status == 2 and f"{name}: {expected}" in said and not cli_saved
    else:
        assert status == 0 and settings_path().read_text() == cli_saved


# -- a model's op configs, imported and written ----------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".txt", ".toml", ".json"])
async def test_a_model_imported_and_exported_in_the_console_is_the_file_kdb_opconfig_extract_writes(
        tmp_path: Path, suffix: str, capsys: pytest.CaptureFixture[str]):
    """Both read the model as the settings' compiler imports it at the settings' flags
    (core.nnfusion.compiler.extract_for_compiler) and write the list with core's write_opconfigs."""
    pytest.importorskip("onnx")
    from onnx_models import small_cnn, write
    from test_console_opconfigs import open_view, wait_for
    from textual.widgets import Input

    from console.widgets.dialogs import PathDialog

    (tmp_path / "settings.toml").write_text('nnfusion_flags = ["-fkernel_fusion_level=0"]\n')
    model = write(small_cnn(), tmp_path / "cnn.onnx")
    assert console.entry.main(["opconfig", "extract", str(model), "-o", str(tmp_path / f"cli{suffix}")]) == 0
    capsys.readouterr()
    exported = tmp_path / f"console{suffix}"
    app = FixedDeviceApp(ConsoleContext(db_path=tmp_path / "k.db", settings=load_settings(),
                                        device_summary="no GPU (test)"))
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await pilot.press("i")
        assert isinstance(app.screen, PathDialog)
        app.screen.query_one("#path", Input).value = str(model)
        await pilot.press("enter")
        await wait_for(pilot, lambda: bool(screen.configs), what="the model's op configs")
        await pilot.press("x")
        assert isinstance(app.screen, PathDialog)
        app.screen.query_one("#path", Input).value = str(exported)
        await pilot.press("enter")
        await wait_for(pilot, exported.exists, what="the exported list")
    assert exported.read_bytes() == (tmp_path / f"cli{suffix}").read_bytes()


# -- failures retried ------------------------------------------------------------------------------------------------

async def test_retry_all_is_one_core_call_from_the_failures_view_and_kdb_failures_retry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    from test_console_failures import open_view, press_and_wait_retry

    from core.db.state import StateDB
    from core.inject import retry

    (tmp_path / "settings.toml").write_text('workers = 1\narchs = ["sm_80", "sm_90"]\n')
    real, calls = retry.retry_open_failures, []

    def spy(db_path, options, ids=None, **kw):  # type: ignore[no-untyped-def]
        calls.append((options, ids, kw.get("edited")))
        return real(db_path, options, ids, **kw)

    monkeypatch.setattr(retry, "retry_open_failures", spy)
    dbs = {face: build_small_db(tmp_path / face / "k.db") for face in ("console", "cli")}  # one failure each
    app = FixedDeviceApp(ConsoleContext(db_path=dbs["console"], settings=load_settings(),
                                        device_summary="no GPU (test)"))
    async with app.run_test(size=(160, 45)) as pilot:
        await open_view(pilot, app, 1)
        await press_and_wait_retry(pilot, app, "R")
    assert console.entry.main(["failures", "retry", "--all", "--db", str(dbs["cli"])]) == 1  # it fails again
    capsys.readouterr()
    console_call, cli_call = calls
    assert console_call == cli_call and cli_call[1] is None and cli_call[0].archs == ("sm_80", "sm_90")
    with closing(StateDB()) as state:
        left = {face: [(f.stage, f.reason) for f in state.failures(db)] for face, db in dbs.items()}
    assert left["console"] == left["cli"] and len(left["cli"]) == 1
