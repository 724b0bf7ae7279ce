"""Helpers for console tests: a small real DB built by the engine, and an app on it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from textual.pilot import Pilot

from console.app import KdbApp
from console.context import ConsoleContext
from core.demo import demo_kernels
from core.inject.pipeline import InjectOptions
from core.inject.session import open_injector
from core.settings import load_settings

# Snapshot tests need the same path in the header on every run and machine.
SNAPSHOT_DIR = Path("/tmp/kdb-snapshots")


def build_small_db(path: Path, *, with_failure: bool = True) -> Path:
    """The demo kernels (no nvcc, fast), injected by the engine; the unprovable one becomes a failure."""
    for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        leftover.unlink(missing_ok=True)
    items = demo_kernels() if with_failure else demo_kernels()[:-1]
    src = path.parent / "small_kernels.json"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(json.dumps(items), encoding="utf-8")
    with open_injector(path, InjectOptions(compile=False)) as injector:
        injector.run([src])
    return path


def make_app(db_path: Path) -> KdbApp:
    return KdbApp(ConsoleContext(db_path=db_path, settings=load_settings(), device_summary="no CUDA device (test)"))


class FixedDeviceApp(KdbApp):
    """The app with device detection switched off, so snapshots do not depend on the machine."""

    def detect_device(self) -> None:  # type: ignore[override]
        self.sub_title = f"{self.context.db_path} · {self.context.device_summary}"


WAIT_BOUND_S = 300.0  # what ends a wait that never would (wait_until's docstring says why so long)


async def wait_until(pilot: Pilot[object], condition: Callable[[], bool], what: str,
                     timeout_s: float = WAIT_BOUND_S) -> None:
    """Wait for the event a test checks (`condition` true), not for a time: the app processes its messages and
    workers between polls. `timeout_s` only bounds a wait that never ends: a busy 2-core CI machine takes seconds
    where a laptop takes milliseconds, and three suites at once there (load average 7.5) once took over 60 s for
    a step of a 4-s test. The failure names `what` was awaited."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what}")
        await pilot.pause(0.02)


def app_with_compiler(db_path: Path, compiler: Path) -> FixedDeviceApp:
    """An app on `db_path` whose settings name this NNFusion compiler, on no GPU."""
    from core.settings import Settings

    return FixedDeviceApp(ConsoleContext(db_path=db_path, settings=Settings(workers=1, nnfusion_path=str(compiler)),
                                         device_summary="no CUDA device (test)"))


async def compile_dialog(pilot: Pilot[object], app: KdbApp, model: Path):  # type: ignore[no-untyped-def]
    """The compile dialog of `model` (console/screens/nnfusion.py), pushed, once its compile has reported."""
    from console.screens.nnfusion import compile_screen

    dialog = compile_screen(app.context, model)
    app.push_screen(dialog)
    await wait_until(pilot, lambda: dialog.report is not None, "the compile's report")
    return dialog
