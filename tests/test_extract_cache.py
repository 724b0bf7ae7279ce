"""Op configs of ONNX models remembered by content (core/opconfigs/extract_cache.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

pytest.importorskip("onnx")

from conftest import REPO
from onnx_models import mlp, resnet_block, write

from core.db.state import state_dir
from core.opconfigs.extract_cache import extract_as_compiled, extract_cached
from core.opconfigs.onnx_extract import Extraction
from core.opconfigs.ort_prepass import PrePass

NO_COMPILER = PrePass.not_checked("these tests give no compiler")  # the model as given, without a pre-pass run


def extract(model: Path, flags=None) -> Extraction:
    return extract_as_compiled(model, flags, NO_COMPILER)


def everything(e: Extraction) -> tuple:
    """Every field, the configs' uncompared ones (source, line format) and the fusion graph included."""
    return (e.model_name, e.node_count, [asdict(c) for c in e.configs], e.nodes, e.unmapped, e.notes, e.graph, e.outputs,
            e.kernel_fusion_level, e.pattern_substitution, e.prepass, e.blockers, e.miscompiles)


def test_a_model_seen_before_gives_the_same_extraction(tmp_path: Path):
    model = write(resnet_block(), tmp_path / "block.onnx")
    fresh = extract(model)
    assert everything(extract_cached(model, prepass=NO_COMPILER)) == everything(fresh)
    assert len(list((state_dir() / "extractions").iterdir())) == 1
    assert everything(extract_cached(model, prepass=NO_COMPILER)) == everything(fresh)


def test_a_model_seen_before_does_not_load_onnx(tmp_path: Path):
    model = write(resnet_block(), tmp_path / "block.onnx")
    extract_cached(model, prepass=NO_COMPILER)
    code = ("import sys; from pathlib import Path; from core.opconfigs.extract_cache import extract_cached; "
            "from core.opconfigs.ort_prepass import PrePass; "
            "e = extract_cached(Path(sys.argv[1]), prepass=PrePass.not_checked('these tests give no compiler')); "
            "print(len(e.configs), 'onnx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(model)], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["2", "False"]


def test_new_bytes_at_the_same_path_are_extracted_again(tmp_path: Path):
    model = write(resnet_block(), tmp_path / "model.onnx")
    assert extract_cached(model, prepass=NO_COMPILER).model_name == "resnet_block"
    write(mlp(), model)
    assert everything(extract_cached(model, prepass=NO_COMPILER)) == everything(extract(model))


def test_other_compiler_flags_are_another_extraction(tmp_path: Path):
    from core.nnfusion.compiler import CompilerFlags

    model = write(mlp(), tmp_path / "mlp.onnx")
    default, level0 = extract_cached(model, prepass=NO_COMPILER), extract_cached(model, CompilerFlags(kernel_fusion_level=0), prepass=NO_COMPILER)
    assert len(list((state_dir() / "extractions").iterdir())) == 2
    assert (default.kernel_fusion_level, level0.kernel_fusion_level) == (3, 0)
    assert len(level0.looked_up()) > len(default.looked_up())  # the bias Adds and Relus are looked up at level 0
    assert everything(extract_cached(model, CompilerFlags(kernel_fusion_level=0), prepass=NO_COMPILER)) == everything(level0)
    assert everything(extract_cached(model, prepass=NO_COMPILER)) == everything(default)


@pytest.mark.parametrize("content", ["not json", "{}", json.dumps({"configs": [{"op_type": 1}]})])
def test_an_entry_that_does_not_read_back_is_extracted_again(tmp_path: Path, content: str):
    model = write(resnet_block(), tmp_path / "block.onnx")
    extract_cached(model, prepass=NO_COMPILER)
    (entry,) = (state_dir() / "extractions").iterdir()
    entry.write_text(content)
    assert everything(extract_cached(model, prepass=NO_COMPILER)) == everything(extract(model))


def test_an_unwritable_state_dir_still_extracts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    model = write(resnet_block(), tmp_path / "block.onnx")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("KDB_STATE_DIR", str(blocker))
    assert everything(extract_cached(model, prepass=NO_COMPILER)) == everything(extract(model))
