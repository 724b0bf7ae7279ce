"""NNFusion's ONNX Runtime pre-pass, run the way the compiler runs it, so that extraction reads the graph it imports.

Before importing an ONNX model the compiler runs `python3 <templates/onnx/ort_run_frozen.py beside the binary>
--graph_optimization_level ORT_ENABLE_BASIC --warmup 1 --iters 0 --file <model> --optimized_model_filepath <tmp>`
through system(), and imports the rewritten model when that exits 0 and wrote the file (onnx_import/onnx.cpp,
load_onnx_model). Whether it does depends on the `python3` first on the compiler's PATH having onnxruntime: with it,
BERT's MatMul+Add become 2-D Gemms, whose Dot identifiers differ from the rank-3 MatMul's. The caller says where the
script is and which python3 the compiler finds (core/nnfusion/compiler.py: compiler_prepass); this module runs it.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

SCRIPT = Path("templates") / "onnx" / "ort_run_frozen.py"  # where the compiler finds it, beside its binary
TIMEOUT_S = 600.0  # the compiler waits for as long as it takes; kdb gives up on a pre-pass past this
_VERSIONS = ("import importlib.metadata as m\n"
             "for name in ('onnxruntime', 'onnx'):\n"
             "    try: print(m.version(name))\n"
             "    except m.PackageNotFoundError: print('')\n")


@dataclass(frozen=True)
class PrePass:
    """The pre-pass as one compiler will run it: its script and the python3 its PATH gives (None: no python3 there).
    `unchecked` says why it could not be known (no compiler found): the user's model is extracted then."""

    script: Path | None
    python3: Path | None
    unchecked: str = ""

    @classmethod
    def not_checked(cls, reason: str) -> PrePass:
        return cls(None, None, reason)

    def identity(self) -> str:
        """What decides the pre-pass's outcome on a given model, for a cache key: the script's bytes, the python3's
        path and its onnxruntime and onnx versions."""
        if self.unchecked or self.script is None:
            return f"unchecked: {self.unchecked}"
        try:
            script = hashlib.sha256(self.script.read_bytes()).hexdigest()
        except OSError as exc:
            return f"no script at {self.script}: {exc.strerror or exc}"
        ort, onnx = self.versions
        return f"{script}:{self.python3}:{ort}:{onnx}"

    @cached_property
    def versions(self) -> tuple[str, str]:
        """The onnxruntime and onnx versions of the python3 ('' for one it lacks, or no python3). Asked once per
        PrePass: the cache key and the run both need them, and each asking starts that python3."""
        if self.python3 is None:
            return "", ""
        try:
            done = subprocess.run([str(self.python3), "-c", _VERSIONS], capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return "", ""
        lines = [*done.stdout.splitlines(), "", ""] if done.returncode == 0 else ["", ""]
        return lines[0].strip(), lines[1].strip()


@dataclass(frozen=True)
class PrePassOutcome:
    """What the pre-pass did to one model: `rewritten` is the model the compiler imports when it applied."""

    applied: bool
    python3: str
    onnxruntime: str
    why: str  # when not applied: why the compiler imports the model as given
    rewritten: Path | None = None
    # The rewrite would change the model's precision, so kdb runs the compiler without the pre-pass (compiler.py).
    bypassed: bool = False

    def to_dict(self) -> dict[str, object]:
        return {"applied": self.applied, "python3": self.python3, "onnxruntime": self.onnxruntime, "why": self.why,
                "bypassed": self.bypassed}


@contextmanager
def run_prepass(prepass: PrePass, model: Path) -> Iterator[PrePassOutcome]:
    """Run the pre-pass on `model` as the compiler would (an argument list, never a shell string); the rewritten
    model lives until the block ends."""
    if prepass.unchecked or prepass.script is None:
        yield PrePassOutcome(False, "", "", f"the pre-pass could not be checked: {prepass.unchecked}")
        return
    if prepass.python3 is None:
        yield PrePassOutcome(False, "", "", "no python3 on the compiler's PATH: it imports the model as given")
        return
    python3 = str(prepass.python3)
    ort = prepass.versions[0]
    with tempfile.TemporaryDirectory(prefix="kdb-prepass-") as folder:
        rewritten = Path(folder) / "optimized.onnx"
        command = [python3, str(prepass.script), "--graph_optimization_level", "ORT_ENABLE_BASIC", "--warmup", "1",
                   "--iters", "0", "--file", str(model.resolve()), "--optimized_model_filepath", str(rewritten)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, errors="replace",
                                  stdin=subprocess.DEVNULL, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            yield PrePassOutcome(False, python3, ort, f"ran past {TIMEOUT_S:.0f} s; kdb stopped it and extracts the "
                                 "model as given (the compiler would wait for it)")
            return
        except OSError as exc:
            yield PrePassOutcome(False, python3, ort, f"cannot run {python3}: {exc.strerror or exc}")
            return
        if done.returncode == 0 and rewritten.is_file():
            casts = precision_casts(rewritten)
            if casts:
                yield PrePassOutcome(False, python3, ort, (
                    f"ONNX Runtime's CPU rewrite inserts {casts} casts to float around the ops its CPU provider has "
                    "no half kernel for, so the compiled network would compute them in float: kdb runs the compiler "
                    "without the pre-pass, on the model as given (to compile it yourself so, put a python3 without "
                    "onnxruntime first on NNFusion's PATH)"), bypassed=True)
                return
            yield PrePassOutcome(True, python3, ort, "", rewritten)
            return
        last = next((line.strip() for line in reversed(done.stderr.splitlines()) if line.strip()), "")
        yield PrePassOutcome(False, python3, ort, f"it exited with status {done.returncode}"
                             + (f" ({last})" if last else "") + ": the compiler imports the model as given")


PRECISION_CAST = "InsertedPrecisionFreeCast"  # how ONNX Runtime names the casts it inserts for a missing half kernel


def precision_casts(model: Path) -> int:
    """The casts ONNX Runtime inserted into its rewrite of a model to compute half ops in float (seen on every fp16
    model of the zoo: 33 in ResNet-50, 61 in two BERT layers, with onnxruntime 1.32's CPU provider)."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    return sum(node.op_type == "Cast" and node.name.startswith(PRECISION_CAST) for node in graph.node)


def note_text(outcome: PrePassOutcome, nodes_before: int, nodes_after: int) -> str:
    """The extraction's note on what the pre-pass did."""
    if outcome.applied:
        return (f"NNFusion's ONNX Runtime pre-pass (python3 at {outcome.python3}, onnxruntime {outcome.onnxruntime}) "
                f"rewrote the model: {nodes_before} nodes -> {nodes_after}; the op configs are those of the "
                "rewritten model, which the compiler imports")
    where = f" (python3 at {outcome.python3}, onnxruntime {outcome.onnxruntime or 'absent'})" if outcome.python3 else ""
    return f"NNFusion's ONNX Runtime pre-pass{where} did not rewrite the model: {outcome.why}"
