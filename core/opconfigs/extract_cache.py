"""Op configs of ONNX models remembered by content: `kdb coverage` of a model seen before does not load ONNX,
whose import alone takes about a second (numpy, protobuf, ml_dtypes), for a model whose ops are already known.

An entry is named by a digest of the model file's bytes, of the extraction code's source and of the installed
onnx package (shape inference is its work), and of what decides NNFusion's ONNX Runtime pre-pass (its script, the
python3 the compiler calls, that python's onnxruntime and onnx versions): another model, another kdb, another onnx
or another pre-pass extracts afresh. Every extraction of a model kdb makes for the compiler comes through here, so
that it reads the graph the compiler imports (core/opconfigs/ort_prepass.py). A cache
only: an entry that does not read back is extracted again; a state dir that cannot be written costs the next
run its shortcut.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from core.db.state import state_dir
from core.kernels import ops, opsig
from core.opconfigs import fusion, nnfusion_import, onnx_extract, opconfig, ort_prepass
from core.opconfigs.fusion import GraphNode
from core.opconfigs.nnfusion_import import Blocker, ShapeWarning
from core.opconfigs.onnx_extract import Extraction, LookupFlags, Note, Unmapped, extract
from core.opconfigs.opconfig import OpConfig
from core.opconfigs.ort_prepass import PrePass, note_text, run_prepass

FORMAT_VERSION = b"7"  # 3: the nodes NNFusion cannot compile; 4: the compiler-graph model and the flags; 5: pre-pass;
# 6: unmapped nodes whose NNFusion kernel does not build; 7: the nodes it compiles into another network


def extract_cached(path: Path, flags: LookupFlags | None = None, *, prepass: PrePass) -> Extraction:
    """extract_as_compiled(path, flags, prepass), or what it gave for the same bytes, flags, code, onnx and
    pre-pass before."""
    try:
        model = path.read_bytes()
    except OSError:
        return extract(path, flags)  # which says what is wrong with the path
    h = hashlib.sha256(FORMAT_VERSION)
    flag_text = f"{flags.kernel_fusion_level}:{flags.pattern_substitution}" if flags is not None else "defaults"
    code = (onnx_extract, fusion, nnfusion_import, opconfig, ops, opsig, ort_prepass)
    for part in (model, flag_text.encode(), *(Path(m.__file__ or "").read_bytes() for m in code),
                 Path(__file__).read_bytes(),  # this module: what it adds to an extraction (the pre-pass's note)
                 _onnx_install(), prepass.identity().encode()):
        h.update(hashlib.sha256(part).digest())
    entry = state_dir() / "extractions" / f"{h.hexdigest()[:32]}.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # none yet, or not one of ours
        return _from_json(json.loads(entry.read_text(encoding="utf-8")))
    extraction = extract_as_compiled(path, flags, prepass)
    tmp = entry.with_name(entry.name + ".tmp")
    with contextlib.suppress(OSError):
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(_to_json(extraction)), encoding="utf-8")  # ASCII: odd node names escaped
        tmp.replace(entry)
    return extraction


def extract_as_compiled(path: Path, flags: LookupFlags | None, prepass: PrePass) -> Extraction:
    """The op configs of the graph the compiler imports: the pre-pass's rewritten model when it rewrites `path`
    there, else `path` itself; a note (and `prepass`) says which and why. Nodes are named as in that model."""
    with run_prepass(prepass, path) as outcome:
        if outcome.rewritten is None:
            extraction = extract(path, flags)
            before = extraction.node_count
        else:
            extraction = extract(outcome.rewritten, flags)
            name, before = _name_and_size(path)
            extraction.model_name = name  # the user's model, not the temporary file
    note = note_text(outcome, before, extraction.node_count)
    extraction.notes.append(Note("(model)", note))
    extraction.prepass = {**outcome.to_dict(), "nodes_before": before, "nodes_after": extraction.node_count,
                          "note": note}
    return extraction


def _name_and_size(path: Path) -> tuple[str, int]:
    """The model's name as extract() gives it and its node count (its weights not read)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return graph.name or path.stem, len(graph.node)


def _onnx_install() -> bytes:
    """Which onnx is installed (its package file's path and mtime), found without importing it."""
    spec = importlib.util.find_spec("onnx")
    if spec is None or spec.origin is None:
        return b"no onnx"
    return f"{spec.origin}:{Path(spec.origin).stat().st_mtime_ns}".encode()


def _to_json(e: Extraction) -> dict[str, Any]:
    return {"model_name": e.model_name, "node_count": e.node_count, "configs": [asdict(c) for c in e.configs],
            "nodes": e.nodes, "unmapped": [list(u) for u in e.unmapped], "notes": [list(n) for n in e.notes],
            "blockers": [list(b) for b in e.blockers],
            "graph": [asdict(n) for n in e.graph], "outputs": list(e.outputs),
            "kernel_fusion_level": e.kernel_fusion_level, "pattern_substitution": e.pattern_substitution,
            "prepass": e.prepass, "miscompiles": [list(w) for w in e.miscompiles]}


def _from_json(d: dict[str, Any]) -> Extraction:
    configs = []
    for c in d["configs"]:
        line_format = c["line_format"]
        configs.append(OpConfig(**{**c, "line_format": (line_format[0], tuple(line_format[1])) if line_format
                                   else None}))
    return Extraction(d["model_name"], d["node_count"], configs,
                      {key: [tuple(m) for m in members] for key, members in d["nodes"].items()},
                      [Unmapped(*u) for u in d["unmapped"]], [Note(*n) for n in d["notes"]],
                      [Blocker(*b) for b in d["blockers"]],
                      tuple(GraphNode(**{**n, "inputs": tuple(n["inputs"])}) for n in d["graph"]), tuple(d["outputs"]),
                      d["kernel_fusion_level"], d["pattern_substitution"], dict(d["prepass"]),
                      [ShapeWarning(*w) for w in d["miscompiles"]])
