"""Standalone rows (core/db/standalone.py): an op whose rows BlockFusion must not fuse runs them on its own launch.

NNFusion's kernel selection takes an op's first External row; without one, the fastest Antares row for the
product, through CacheCudaEmitter (no BlockCudaEmitter tag), which BlockFusion skips. The real compiler's side is
tested in test_nnfusion_compiler.py (a fused kernel that cannot launch, mended with --fit-launches).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_kdb, run_kdb_json

from core.db.kernel_db import KernelDB
from core.db.maintenance import apply_plan, standalone_plan
from core.db.standalone import UNPROFILED_US, plan_standalone
from core.demo import demo_kernels
from core.errors import InputError
from core.inject.pipeline import InjectOptions, Injector
from core.kernels.kernel_row import antares_entry, is_standalone, twin_key
from core.kernels.ops import BLOCK_TAG, DEFAULT_PRODUCT, DEVICE_TYPE, EXTERNAL_SOURCE, STANDALONE_SOURCE

PRODUCT = "NVIDIA H200"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """The demo kernels injected (no compile): plain, fused (with its CUDA twin) and Dot rows."""
    src = tmp_path / "k.json"
    src.write_text(json.dumps(demo_kernels()))
    path = tmp_path / "k.db"
    with KernelDB.open(path, create=True) as db:
        Injector(db, InjectOptions(compile=False, workers=1)).run([src])
    return path


def rows_of(db: KernelDB, op_type: str) -> list:
    return list(db.iter_rows("WHERE OpType = ? AND DeviceType = ?", [op_type, DEVICE_TYPE]))


def test_every_row_of_the_op_becomes_standalone_and_undo_gives_back_the_same_rows(db_path: Path):
    with KernelDB.open(db_path, write=True) as db:
        before = {r.key: r for r in db.iter_rows()}
        (fused,) = rows_of(db, "Fused_Convolution_Relu")
        with db.connection() as raw:  # a profile for the product, so the row's time is known
            miscs = json.loads(fused.miscs)
            miscs["external_profile"] = {"time": f"{PRODUCT}:12.5;", "resource": 4096}
            raw.execute("UPDATE KernelCache SET Miscs = ? WHERE Key = ?", (json.dumps(miscs), fused.key))
        plan = standalone_plan(db, [fused.key[:16]], PRODUCT)  # a Key prefix names the op
        assert [c.row.key for c in plan.details] == [fused.key]
        apply_plan(db, plan)
        (row,) = rows_of(db, "Fused_Convolution_Relu")
        assert is_standalone(row) and row.source == STANDALONE_SOURCE and BLOCK_TAG not in row.tags.split(",")
        assert row.key == fused.key and row.function == fused.function and row.identifier == fused.identifier
        entry = antares_entry(json.loads(row.miscs), PRODUCT)
        assert entry == {"device_name": PRODUCT, "planned_steps": 1, "time": 12.5}
        assert antares_entry(json.loads(row.miscs), "another GPU") is None  # selection takes it for the product only
        (twin,) = db.find(twin_key(fused.key))  # the CUDA twin follows: the pattern is still substituted
        assert twin.source == STANDALONE_SOURCE and twin.tags == row.tags
        others = {r.key: r for r in db.iter_rows() if r.identifier != fused.identifier}
        assert all(others[k] == before[k] for k in others)  # nothing else changed

        apply_plan(db, standalone_plan(db, [fused.key], back=True))
        (back,) = rows_of(db, "Fused_Convolution_Relu")
        original = before[fused.key]
        assert (back.source, back.tags, back.function) == (EXTERNAL_SOURCE, original.tags, original.function)
        assert "antares" not in json.loads(back.miscs)


def test_a_row_without_a_profile_for_the_product_still_counts_and_dot_keeps_its_transpose_tags(db_path: Path):
    with KernelDB.open(db_path, write=True) as db:
        dots = rows_of(db, "Dot")
        plan = plan_standalone(db, [dots[0].identifier], "")  # an Identifier names the op; no product: NNFusion's
        (change,) = plan
        assert change.miscs["antares"] == {"device_name": DEFAULT_PRODUCT, "planned_steps": 1, "time": UNPROFILED_US}
        assert change.tags.split(",")[:2] == ["KernelEmitter", "CudaEmitter"]
        assert [t for t in dots[0].tags.split(",") if t != BLOCK_TAG] == change.tags.split(",")
        apply_plan(db, standalone_plan(db, [dots[0].identifier], ""))
        assert plan_standalone(db, [dots[0].key], "") == []  # standalone already: nothing to change
        apply_plan(db, standalone_plan(db, [dots[0].key], back=True))
        (back,) = [r for r in rows_of(db, "Dot") if r.key == dots[0].key]
        assert back.tags == dots[0].tags  # BlockCudaEmitter back in its place


def test_an_unknown_key_is_named_and_nothing_is_written(db_path: Path):
    with KernelDB.open(db_path, write=True) as db:
        before = list(db.iter_rows())
        relu = rows_of(db, "Relu")[0].key
        with pytest.raises(InputError, match="kdb:nosuchkey: no row has this Key or Identifier"):
            plan_standalone(db, [relu, "kdb:nosuchkey"], PRODUCT)
        assert list(db.iter_rows()) == before


def test_coverage_promises_the_fastest_standalone_row_for_the_product_only(db_path: Path):
    from core.nnfusion.compiler import CompilerFlags
    from core.nnfusion.coverage import _Model  # the lookup model coverage() runs per op

    with KernelDB.open(db_path, write=True) as db:
        relu = rows_of(db, "Relu")[0]
        apply_plan(db, standalone_plan(db, [relu.key], PRODUCT))
        chooser = _Model(db, CompilerFlags.parse(()), PRODUCT)
        choice, reasons, abort = chooser._select(relu.identifier, None)
        assert choice is not None and choice.key == relu.key and not abort
        assert "standalone" in choice.why and choice.time_us == UNPROFILED_US
        other = _Model(db, CompilerFlags.parse(()), "another GPU")
        choice, reasons, _ = other._select(relu.identifier, None)
        assert choice is None and "Miscs.antares names the product ('another GPU')" in reasons[0]


def test_the_cli_previews_then_applies_and_undoes(db_path: Path):
    with KernelDB.open(db_path) as db:
        key = rows_of(db, "MaxPool")[0].key
    proc, preview = run_kdb_json("db", "standalone", "--db", str(db_path), key, "--product", PRODUCT)
    assert proc.returncode == 0 and not preview["applied"] and preview["written"] == []
    assert [r["key"] for r in preview["rows"]] == [key] and preview["rows"][0]["source"] == STANDALONE_SOURCE
    with KernelDB.open(db_path) as db:
        assert not is_standalone(db.find(key)[0])  # a preview writes nothing
    proc = run_kdb("db", "standalone", "--db", str(db_path), key, "--product", PRODUCT, "--apply")
    assert proc.returncode == 0 and "Run 1 row(s) of 1 op(s) standalone" in proc.stdout, proc.stdout
    assert "written in one transaction" in proc.stdout
    with KernelDB.open(db_path) as db:
        assert is_standalone(db.find(key)[0])
    proc = run_kdb("db", "standalone", "--db", str(db_path), key, "--undo", "--apply")
    assert proc.returncode == 0 and "back to BlockFusion" in proc.stdout
    with KernelDB.open(db_path) as db:
        assert not is_standalone(db.find(key)[0])
    bad = run_kdb("db", "standalone", "--db", str(db_path), "kdb:nosuchkey")
    assert bad.returncode == 2 and "no row has this Key or Identifier" in bad.stderr and "Traceback" not in bad.stderr
