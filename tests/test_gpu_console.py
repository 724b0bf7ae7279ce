"""The issue's end-to-end check on a GPU: tune a layer from the console's Tuning view on CUDA, watch the table and
the curve follow the trials, and find the tuned kernel in the DB verified and timed on that GPU.

Runs only where a CUDA device, pycuda and TVM are present (`pytest -m gpu`); CI skips it, saying why.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from core.gpu.jobs import gpu_available

available, why = gpu_available()
needs = [("tvm", "apache-tvm"), ("textual", "textual")]
missing = [package for module, package in needs if importlib.util.find_spec(module) is None]
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not available, reason=f"needs a CUDA GPU and pycuda: {why}"),
              pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}")]

DOT = "cublas_dot_op_float|a+64_256|b+256_128|o+64_128|ta+0|tb+0"
TRIALS = 16


@pytest.mark.timeout(900)
async def test_tune_a_layer_from_the_console_and_find_it_verified_and_timed_in_the_db(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch):
    from test_console_tuning import choose, import_ops, open_view, wait_for, write_lines
    from textual.widgets import Sparkline

    from console.app import KdbApp
    from console.context import ConsoleContext
    from console.widgets.best_so_far_plot import BestSoFarPlot
    from console.widgets.tune_table import TuneTable
    from core.db.kernel_db import KernelDB
    from core.kernels.profile import parse_profile
    from core.settings import Settings

    monkeypatch.setenv("KDB_STATE_DIR", str(tmp_path / "state"))
    db_path = tmp_path / "kernels.db"
    app = KdbApp(ConsoleContext(db_path=db_path, settings=Settings(archs=["sm_90"]), device_summary=why))
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_ops(pilot, screen, write_lines(tmp_path / "ops.txt", [DOT]), 1)
        await wait_for(pilot, lambda: screen.gpu is not None)  # the device probe runs in a worker
        await choose(pilot, screen, trials=TRIALS, target="cuda")
        await pilot.press("ctrl+r")
        assert screen.running, screen.explanation

        table = screen.query_one(TuneTable)
        key = screen.configs[0].key
        seen: set[str] = set()

        def watch() -> bool:  # the table moves while the run goes: trials counted up, a best time appears
            seen.add(str(table.get_cell(key, "trials")))
            return not screen.running

        await wait_for(pilot, watch, timeout=840)
        report = screen.report
        assert report is not None and not report.cancelled and not report.failures, screen.run_error
        result = report.results[0]
        assert result.trials == TRIALS and result.best_seconds is not None
        assert len(seen) > 2, f"the trials column never moved during the run: {seen}"
        assert str(table.get_cell(key, "status")) == "done"
        points = screen.query_one(BestSoFarPlot).query_one(Sparkline).data or []
        assert points and points == sorted(points, reverse=True)

    with KernelDB.open(db_path) as db:
        rows = list(db.iter_rows())
    assert rows, "nothing was injected"
    for row in rows:
        miscs = json.loads(row.miscs)
        verified = miscs["kdb"]["verified"]
        assert verified["max_rel_error"] is not None and verified["max_rel_error"] < 1e-4
        times = parse_profile(miscs["external_profile"]["time"])
        assert times and all(us > 0 for us in times.values()), miscs["external_profile"]
