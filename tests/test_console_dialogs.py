"""File dialogs start at the working directory, or in the folder of the last path one took (kept in the
settings, across launches); no product code looks for the team's ../shared data."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from console_helpers import FixedDeviceApp
from textual.widgets import Input

from console.context import ConsoleContext
from console.screens.settings import form_values
from console.widgets.dialogs import PathDialog
from core.settings import Settings, load_settings, read_settings

REPO = Path(__file__).resolve().parents[1]


def make_app(db: Path) -> FixedDeviceApp:
    return FixedDeviceApp(ConsoleContext(db_path=db, settings=load_settings(), device_summary="no CUDA device (test)"))


async def dialog_text(pilot, view: str, key: str) -> str:
    """Open a view and its path dialog; the dialog's starting text (the dialog stays open)."""
    await pilot.press(view)
    await pilot.press(key)
    assert isinstance(pilot.app.screen, PathDialog)
    return pilot.app.screen.query_one("#path", Input).value


async def take(pilot, path: Path) -> None:
    pilot.app.screen.query_one("#path", Input).value = str(path)
    await pilot.press("enter")
    await pilot.pause()


def test_no_product_code_looks_for_the_shared_dev_data():
    for path in [*REPO.glob("core/**/*.py"), *REPO.glob("console/**/*.py")]:
        text = path.read_text(encoding="utf-8")
        assert "nnfusion-artifact" not in text, path
        assert not re.search(r"""/\s*["']shared["']""", text), f"{path} builds a path to a 'shared' folder"


async def test_dialogs_start_at_the_working_dir_then_where_the_last_path_was(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    work, logs = tmp_path / "work", tmp_path / "logs"
    work.mkdir()
    logs.mkdir()
    monkeypatch.chdir(work)
    async with make_app(tmp_path / "k.db").run_test(size=(160, 45)) as pilot:
        assert await dialog_text(pilot, "6", "o") == f"{work}/"  # AutoTVM logs: nothing taken yet
        await take(pilot, logs / "tune.log")
        assert await dialog_text(pilot, "5", "i") == f"{logs}/"  # Op configs import: where the log was
        await pilot.press("escape")  # cancelled: nothing remembered
        assert pilot.app.context.settings.last_path == str(logs / "tune.log")
    assert load_settings().last_path == str(logs / "tune.log")  # saved with the settings

    async with make_app(tmp_path / "k.db").run_test(size=(160, 45)) as pilot:  # the next launch
        assert await dialog_text(pilot, "5", "i") == f"{logs}/"
        await pilot.press("escape")
    shutil.rmtree(logs)
    async with make_app(tmp_path / "k.db").run_test(size=(160, 45)) as pilot:  # gone: the working dir again
        assert await dialog_text(pilot, "7", "i") == f"{work}/"


def test_saving_the_settings_form_keeps_the_last_path():
    settings = Settings(archs=["sm_80"], last_path="/data/models/resnet.onnx")
    assert read_settings(form_values(settings), None, settings) == (settings, {})
