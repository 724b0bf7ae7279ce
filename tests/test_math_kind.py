"""Each row says its precision (fp16, TF32, fp32, fp64) and its units (tensor or CUDA cores): read from the row alone,
shown by the Kernels view, `kdb ls` and `kdb show`, and taken by their filters. The rows are real: `generate`'s
tensor-core Dots (fp16, TF32) beside CUDA-core rows, injected as `kdb inject` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_kdb_json
from console_helpers import FixedDeviceApp, wait_until

from core.db.browse import KernelFilter, count_kernels, list_kernels, list_kernels_indexed
from core.db.kernel_db import KernelDB
from core.db.summary_index import SummaryIndex
from core.kernels.math_kind import CUDA_CORES, TENSOR_CORES, precision, units

DOT = "cublas_dot_op_{dtype}|a+32_64|b+64_48|o+32_48|ta+0|tb+0"
POOL = "cudnn_avgpool_op_{dtype}|i+1_8_6_6|o+1_8_3_3|win+2_2|ws+2_2|pb+0_0|pa+0_0"
# (op config, math) -> (precision, units) the row must say
ROWS = {
    (DOT.format(dtype="half"), ""): ("fp16", TENSOR_CORES),
    (DOT.format(dtype="float"), "tf32"): ("tf32", TENSOR_CORES),
    (DOT.format(dtype="float"), ""): ("fp32", CUDA_CORES),
    (POOL.format(dtype="half"), ""): ("fp16", CUDA_CORES),
}


def test_precision_comes_from_the_attributes_else_from_the_identifiers_c_types():
    assert precision("Relu2;2halfhalf", json.dumps({"dtype": "half"})) == "fp16"
    assert precision("Dot2,2;2,2;2,2floatfloatfloat", json.dumps({"math": "tf32"})) == "tf32"
    assert precision("Relu2;2halfhalf", "{}") == "fp16"  # another tool's row: no dtype in its Attributes
    assert precision("Relu2;2doubledouble", "not json") == "fp64"
    assert precision("Relu2;2floatfloat", None) == "fp32"


def test_units_are_the_tensor_cores_where_the_body_issues_a_matrix_instruction():
    assert units('asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 ...")') == TENSOR_CORES
    assert units("nvcuda::wmma::mma_sync(c, a, b, c);") == TENSOR_CORES
    assert units("output0[i] = max(input0[i], 0.f);") == CUDA_CORES
    assert units(None) == CUDA_CORES


@pytest.fixture(scope="module")
def math_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("tvm")
    from core.codegen.batch import generate_all
    from core.inject.pipeline import InjectOptions, Injector
    from core.opconfigs.opconfig import parse_line, with_math

    work = tmp_path_factory.mktemp("math")
    configs = [with_math(parse_line(line, "case"), tensor_math) for line, tensor_math in ROWS]
    report = generate_all(configs, "sm_90", check=False)
    assert not report.failed, [f.error for f in report.failed]
    (work / "kernels.json").write_text(json.dumps(report.items), encoding="utf-8")
    with KernelDB.open(work / "k.db", create=True) as db:
        assert Injector(db, InjectOptions(compile=False), state=None).run([work / "kernels.json"]).failed == 0
    return work / "k.db"


def _said(db_path: Path, flt: KernelFilter) -> list[tuple[str, str]]:
    with KernelDB.open(db_path) as db:
        direct = sorted((k.precision, k.units) for k in list_kernels(db, flt, limit=0))
        assert count_kernels(db, flt) == len(direct)
    with SummaryIndex.open(db_path) as index:  # the console's pages: the same answer
        index.sync()
        assert sorted((k.precision, k.units) for k in list_kernels_indexed(index, flt, limit=0)) == direct
    return direct


def test_every_row_says_its_precision_and_units_and_the_filters_take_them(math_db: Path):
    assert _said(math_db, KernelFilter()) == sorted(ROWS.values())
    assert _said(math_db, KernelFilter(units=TENSOR_CORES)) == [("fp16", TENSOR_CORES), ("tf32", TENSOR_CORES)]
    assert _said(math_db, KernelFilter(precision="fp16")) == [("fp16", CUDA_CORES), ("fp16", TENSOR_CORES)]
    assert _said(math_db, KernelFilter(precision="fp16", units=CUDA_CORES)) == [("fp16", CUDA_CORES)]
    assert _said(math_db, KernelFilter(precision="fp64")) == []


def test_kdb_ls_and_show_say_them(math_db: Path):
    _, listed = run_kdb_json("ls", "--db", str(math_db), "--precision", "tf32", "--units", "tensor")
    assert [(k["op_type"], k["precision"], k["units"]) for k in listed["kernels"]] == [("Dot", "tf32", TENSOR_CORES)]
    _, shown = run_kdb_json("show", "--db", str(math_db), listed["kernels"][0]["key"])
    assert (shown["kernels"][0]["precision"], shown["kernels"][0]["units"]) == ("tf32", TENSOR_CORES)


async def test_the_kernels_view_shows_them_and_filters_by_them(math_db: Path):
    from console.context import ConsoleContext
    from console.widgets.kernel_table import KernelTable
    from core.settings import load_settings

    app = FixedDeviceApp(ConsoleContext(db_path=math_db, settings=load_settings(), device_summary="no GPU (test)"))
    async with app.run_test(size=(200, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_until(pilot, lambda: table.row_count == len(ROWS), "every row")
        shown = sorted(str(table.get_row(k)[table.get_column_index("math")]) for k in table.rows)
        assert shown == ["TF32 · tensor", "fp16 · CUDA", "fp16 · tensor", "fp32 · CUDA"]
        app.screen.query_one("#filter-units").value = TENSOR_CORES
        await wait_until(pilot, lambda: table.row_count == 2, "the tensor-core rows alone")
        app.screen.query_one("#filter-precision").value = "tf32"
        await wait_until(pilot, lambda: table.row_count == 1, "the TF32 row alone")
        table.focus()
        await pilot.press("down", "up")
        detail = app.screen.query_one("#detail-body")
        await wait_until(pilot, lambda: "TF32 on the tensor cores" in _text(detail), "the detail to say TF32")


def _text(widget) -> str:  # type: ignore[no-untyped-def]
    from rich.console import Console

    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(widget.content)
    return console.export_text()
