"""docs/images/network-view.svg: the Network view on a small CNN, as a user gets there (run from the repo root).

    KDB_STATE_DIR=$(mktemp -d) KDB_CONFIG=$(mktemp -d)/s.toml .venv/bin/python docs/make_network_screenshot.py

Builds the model and a DB of kdb's own kernels (extract -> codegen -> inject), compiles once through `kdb nnfusion`
in a terminal (the real compiler of ../shared/nnfusion), then opens the model in the console's Network view (8)
and saves the screen. No GPU here: the view says what only a GPU can show.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]


async def main() -> None:
    from console_helpers import FixedDeviceApp, wait_until
    from onnx_models import GraphBuilder, write
    from test_nnfusion_compiler import COMPILER, build_db

    from console.context import ConsoleContext
    from core.settings import Settings, save_settings

    work = Path(tempfile.mkdtemp())
    settings = Settings(workers=1, nnfusion_path=str(COMPILER))
    save_settings(settings)
    g = GraphBuilder({"x": [1, 16, 32, 32]})
    y = g.node("Relu", [g.conv("x", 16, 32, 3, bias=True, name="conv1")], "relu1")
    y = g.node("MaxPool", [y], "pool1", kernel_shape=[2, 2], strides=[2, 2])
    y = g.node("Relu", [g.node("Add", [g.conv(y, 32, 32, 3, name="conv2"), y], "residual")], "relu2")
    y = g.node("GlobalAveragePool", [y], "gap")
    model = write(g.model(y, "small_cnn"), work / "small_cnn.onnx")
    db = build_db(model, work / "k.db", work)
    subprocess.run([sys.executable, "-m", "console.entry", "nnfusion", str(model), "--db", str(db)], cwd=REPO,
                   check=True, capture_output=True)
    app = FixedDeviceApp(ConsoleContext(db_path=db, settings=settings, device_summary="no CUDA device"))
    async with app.run_test(size=(160, 36)) as pilot:
        await pilot.press("8")
        app.screen.open_model(model)  # what `o` and the path typed do
        await wait_until(pilot, lambda: app.screen.query_one("#network-history").row_count >= 1, "the story")
        app.save_screenshot(str(REPO / "docs" / "images" / "network-view.svg"))


if __name__ == "__main__":
    asyncio.run(main())
