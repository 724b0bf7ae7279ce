"""Pilot tests of the GPU & SM settings view: device states, validation, and settings that persist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from console_helpers import SNAPSHOT_DIR, FixedDeviceApp, build_small_db, wait_until

import core.cuda.nvcc as nvcc_module
from console.context import ConsoleContext
from console.screens import settings as settings_screen
from console.screens.settings import NO_DEVICE, SettingsScreen, form_values
from core.cuda.nvcc import NvccProbe
from core.errors import ToolError
from core.gpu.inventory import DeviceInfo
from core.settings import Settings, load_settings, read_settings, save_settings

REPO = Path(__file__).resolve().parents[1]
FAKE_NVCC = "/usr/local/cuda/bin/nvcc"
FAKE_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
NO_PYCUDA = "pycuda is not installed: no CUDA device, compile checks only"
H200 = DeviceInfo(index=0, name="NVIDIA H200", compute_capability=(9, 0), sm_count=132, shared_per_block=49152,
                  shared_per_block_optin=232448, registers_per_block=65536, clock_khz=1980000,
                  memory_bytes=150_109_880_320)


def fake_find_nvcc(configured: str = "") -> str:
    if configured and configured != FAKE_NVCC:
        raise ToolError(f"nvcc not found at {configured}")
    return FAKE_NVCC


@pytest.fixture
def fake_machine(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[DeviceInfo]], None]:
    """Same nvcc everywhere; call the result with the devices this "machine" has."""
    monkeypatch.setattr(nvcc_module, "find_nvcc", fake_find_nvcc)  # core's probe_nvcc asks these
    monkeypatch.setattr(nvcc_module, "supported_archs", lambda nvcc: FAKE_ARCHS)

    def with_devices(devices: list[DeviceInfo]) -> None:
        reason = "" if devices else NO_PYCUDA
        monkeypatch.setattr(settings_screen, "detect_devices", lambda timeout_s=30.0: (list(devices), reason))

    with_devices([])
    return with_devices


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return build_small_db(tmp_path / "k.db")


def make_app(db: Path) -> FixedDeviceApp:
    return FixedDeviceApp(ConsoleContext(db_path=db, settings=load_settings(), device_summary="no CUDA device (test)"))


async def until(pilot, condition: Callable[[], bool], what: str) -> None:
    await wait_until(pilot, condition, what)


async def open_settings(pilot) -> SettingsScreen:
    """Switch to the view and wait until devices and nvcc are known."""
    await pilot.press("4")
    screen = pilot.app.screen
    assert isinstance(screen, SettingsScreen)
    await until(pilot, lambda: screen.nvcc is not None and "detecting" not in text_of(screen, "#no-device"),
                "device detection and the nvcc probe")
    return screen


def text_of(screen: SettingsScreen, selector: str) -> str:
    return str(screen.query_one(selector).render())


def value_of(screen: SettingsScreen, name: str) -> str:
    return screen.query_one(f"#field-{name}").value


async def type_into(pilot, name: str, text: str) -> None:
    await pilot.click(f"#field-{name}")
    pilot.app.screen.query_one(f"#field-{name}").value = ""
    await pilot.press(*text)


def test_form_text_round_trips_and_names_every_bad_field():
    settings = Settings(archs=["sm_80", "sm_90a"], product_name="NVIDIA H200", nvcc_flags=["-DNAME=a b", "-O3"],
                        nvcc_timeout_s=12.5, workers=3, rpc_tracker="host:9190")
    assert read_settings(form_values(settings), None) == (settings, {})
    values = {**form_values(settings), "archs": "sm_80 sm_95", "workers": "3.5", "nvcc_flags": "-D'x"}
    _, errors = read_settings(values, NvccProbe("", FAKE_NVCC, FAKE_ARCHS))
    assert set(errors) == {"archs", "workers", "nvcc_flags"}


async def test_no_device_shows_compile_checks_only(db: Path, fake_machine):
    app = make_app(db)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_settings(pilot)
        shown = text_of(screen, "#no-device")
        assert NO_DEVICE in shown and NO_PYCUDA in shown
        assert not screen.query_one("#device-table").display
        assert screen.query_one("#use-detected").disabled
        assert screen.query_one("#field-product_name").placeholder == "(detected device name)"
        assert FAKE_NVCC in text_of(screen, "#help-nvcc_path")


async def test_settings_persist(db: Path, fake_machine):
    config = Path(os.environ["KDB_CONFIG"])
    app = make_app(db)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_settings(pilot)
        await type_into(pilot, "archs", "sm_80, sm_90")
        await type_into(pilot, "product_name", "NVIDIA H200")
        await type_into(pilot, "nvcc_flags", "-lineinfo -Xptxas '-O3'")
        await pilot.press("ctrl+s")
        await until(pilot, config.exists, "the settings file")
        await until(pilot, lambda: app.context.settings.archs == ["sm_80", "sm_90"], "the shared settings")
        assert "saved" in text_of(screen, "#settings-status") and "unsaved" not in text_of(screen, "#settings-status")
        assert app.context.settings.product_name == "NVIDIA H200"
        assert app.context.settings.nvcc_flags == ["-lineinfo", "-Xptxas", "-O3"]

    stored = tomllib.loads(config.read_text())
    assert stored["archs"] == ["sm_80", "sm_90"] and stored["product_name"] == "NVIDIA H200"
    loaded = load_settings()
    assert loaded.archs == ["sm_80", "sm_90"] and loaded.product_name == "NVIDIA H200"

    fresh = make_app(db)
    async with fresh.run_test(size=(160, 45)) as pilot:
        screen = await open_settings(pilot)
        assert value_of(screen, "archs") == "sm_80, sm_90"
        assert value_of(screen, "product_name") == "NVIDIA H200"
        assert value_of(screen, "nvcc_flags") == "-lineinfo -Xptxas -O3"

    # the CLI reads the same file
    proc = subprocess.run([sys.executable, "-m", "console.entry", "settings", "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=dict(os.environ), check=False)
    shown = json.loads(proc.stdout)
    assert shown["path"] == str(config)
    assert shown["archs"] == ["sm_80", "sm_90"] and shown["product_name"] == "NVIDIA H200"


async def test_revert_reloads_from_disk(db: Path, fake_machine):
    save_settings(Settings(archs=["sm_80"], tune_trials=7))
    app = make_app(db)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_settings(pilot)
        await type_into(pilot, "tune_trials", "99")
        assert "unsaved changes" in text_of(screen, "#settings-status")
        await pilot.press("ctrl+z")
        await until(pilot, lambda: value_of(screen, "tune_trials") == "7", "the reverted form")
        assert value_of(screen, "archs") == "sm_80"


@pytest.mark.parametrize(("name", "text", "why"), [
    ("archs", "sm_1000", "not an SM arch"),
    ("archs", "compute_90", "not an SM arch"),
    ("archs", "sm_80, sm_95", "sm_95: not built by this nvcc"),
    ("product_name", "NVIDIA H200;x", "must not contain"),
    ("nvcc_path", "/nowhere/nvcc", "nvcc not found at /nowhere/nvcc"),
    ("workers", "many", "whole number"),
    ("rpc_tracker", "tracker", "HOST:PORT"),
])
async def test_bad_values_show_inline_and_are_never_saved(db: Path, fake_machine, name: str, text: str, why: str):
    config = save_settings(Settings(archs=["sm_80"]))
    before = config.read_bytes()
    app = make_app(db)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_settings(pilot)
        await type_into(pilot, name, text)
        await pilot.press("ctrl+s")
        await until(pilot, lambda: why in text_of(screen, f"#error-{name}"), f"the inline error on {name}")
        assert screen.query_one(f"#field-{name}").has_class("invalid")
        assert screen.focused is screen.query_one(f"#field-{name}")
    assert config.read_bytes() == before
    assert app.context.settings.archs == ["sm_80"] and app.context.settings.product_name == ""


async def test_detected_device_fills_arch_and_name(db: Path, fake_machine):
    fake_machine([H200])
    app = make_app(db)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_settings(pilot)
        table = screen.query_one("#device-table")
        await until(pilot, lambda: table.row_count == 1, "the device row")
        row = [str(cell) for cell in table.get_row_at(0)]
        assert "NVIDIA H200" in row and "132" in row and "9.0 (sm_90)" in row
        assert not screen.query_one("#no-device").display
        assert screen.query_one("#field-product_name").placeholder == "NVIDIA H200"
        await pilot.click("#use-detected")
        assert value_of(screen, "archs") == "sm_90"
        assert value_of(screen, "product_name") == "NVIDIA H200"
        # and from the keyboard
        await type_into(pilot, "archs", "sm_80")
        await pilot.press("ctrl+g")
        assert value_of(screen, "archs") == "sm_90"


def test_no_device_snapshot(snap_compare, fake_machine, monkeypatch: pytest.MonkeyPatch):
    folder = SNAPSHOT_DIR / "settings"
    db = build_small_db(folder / "kernel_cache.db")
    config = folder / "settings.toml"
    config.unlink(missing_ok=True)
    monkeypatch.setenv("KDB_CONFIG", str(config))
    app = make_app(db)

    async def arrive(pilot) -> None:
        await open_settings(pilot)

    assert snap_compare(app, terminal_size=(160, 45), run_before=arrive)
