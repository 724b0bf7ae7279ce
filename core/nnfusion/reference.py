"""The network's inputs (seeded), its reference outputs from ONNX Runtime on the CPU, and the error measure.

The reference is a runtime nobody here wrote: ONNX Runtime's CPU execution provider runs the same model on the
same inputs. Error of one output: max_i |out_i - ref_i| / max_i |ref_i| (in float64; a reference of all zeros
divides by 1e-30); the network's error is the largest over its outputs, infinite when an output holds a NaN or
an infinity the reference does not.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import InputError, ToolError
from core.nnfusion.build import Signature, Tensor

if TYPE_CHECKING:
    import numpy as np

DEFAULT_SEED = 0


def tensor_file(folder: Path, index: int, tensor: Tensor) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", tensor.onnx_name)[:60] or "tensor"
    return folder / f"{index}_{safe}.bin"


def make_inputs(signature: Signature, folder: Path, seed: int = DEFAULT_SEED) -> list[np.ndarray]:
    """One array per input, written to `folder` in kernel_entry's order: standard normal values for floating
    types; 0 or 1 for integers (valid as an index on any axis)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = []
    for i, tensor in enumerate(signature.inputs):
        dtype = np.dtype(tensor.dtype)
        if dtype.kind == "f":
            array = rng.standard_normal(tensor.shape).astype(dtype)
        else:
            array = rng.integers(0, 2, size=tensor.shape).astype(dtype)
        array.tofile(tensor_file(folder, i, tensor))
        arrays.append(array)
    return arrays


def read_outputs(signature: Signature, folder: Path) -> list[np.ndarray]:
    """The outputs a run wrote to `folder`. InputError when one is missing or of the wrong size."""
    import numpy as np

    arrays = []
    for i, tensor in enumerate(signature.outputs):
        path = tensor_file(folder, i, tensor)
        try:
            array = np.fromfile(path, dtype=tensor.dtype)
        except OSError as exc:
            raise InputError(f"cannot read the output: {exc}", where=str(path)) from exc
        if array.size != tensor.elements:
            raise InputError(f"holds {array.size} values, {tensor.onnx_name} has {tensor.elements}", where=str(path))
        arrays.append(array.reshape(tensor.shape))
    return arrays


@dataclass
class Reference:
    outputs: list[Any]  # numpy arrays, in kernel_entry's output order
    seconds: float
    runtime: str  # "onnxruntime 1.x (CPUExecutionProvider)"


def onnx_runtime_reference(model: Path, signature: Signature, inputs: list[np.ndarray]) -> Reference:
    """The model run by ONNX Runtime's CPU execution provider on `inputs`, its outputs matched to kernel_entry's by
    the model's names. ToolError without onnxruntime; InputError when the names do not match."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise ToolError(f"onnxruntime is not installed ({exc}): it computes the reference output "
                        "(`pip install 'kernel-db-console[run]'`)") from exc
    started = time.monotonic()
    try:
        session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types for a model it cannot load
        raise InputError(f"ONNX Runtime cannot load the model: {exc}", where=str(model)) from exc
    wanted = {i.name for i in session.get_inputs()}
    given = {t.onnx_name for t in signature.inputs}
    if wanted != given:
        raise InputError(f"ONNX Runtime wants inputs {sorted(wanted)}, NNFusion's kernel_entry takes {sorted(given)}",
                         where=str(model))
    names = [o.name for o in session.get_outputs()]
    missing = [t.onnx_name for t in signature.outputs if t.onnx_name not in names]
    if missing:
        raise InputError(f"NNFusion's outputs {missing} are not among the model's {names}", where=str(model))
    try:
        outputs = session.run([t.onnx_name for t in signature.outputs],
                              {t.onnx_name: a for t, a in zip(signature.inputs, inputs, strict=True)})
    except Exception as exc:  # the run's own errors (shapes, types) come as onnxruntime's exception types
        raise InputError(f"ONNX Runtime cannot run the model: {exc}", where=str(model)) from exc
    return Reference(list(outputs), time.monotonic() - started, f"onnxruntime {onnxruntime.__version__} "
                     "(CPUExecutionProvider)")


def relative_error(output: np.ndarray, reference: np.ndarray) -> float:
    """max |output - reference| / max |reference|, in float64; inf when the output is not finite where the
    reference is."""
    import numpy as np

    out = np.asarray(output, dtype=np.float64).ravel()
    ref = np.asarray(reference, dtype=np.float64).ravel()
    if out.shape != ref.shape:
        raise InputError(f"an output of {out.size} values against a reference of {ref.size}")
    if out.size == 0:
        return 0.0
    if not np.all(np.isfinite(out) | ~np.isfinite(ref)):
        return float("inf")
    finite = np.isfinite(ref)
    diff = np.abs(out[finite] - ref[finite])
    scale = float(np.max(np.abs(ref[finite]))) if finite.any() else 0.0
    return float(np.max(diff)) / max(scale, 1e-30) if diff.size else 0.0


def largest_error(outputs: list[np.ndarray], reference: list[np.ndarray]) -> tuple[float, list[float]]:
    """(the largest relative error, each output's)."""
    each = [relative_error(o, r) for o, r in zip(outputs, reference, strict=True)]
    return max(each, default=0.0), each
