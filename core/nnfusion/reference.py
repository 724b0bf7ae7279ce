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
from core.nnfusion.build import RUN_EXTRA, Signature, Tensor

if TYPE_CHECKING:
    import numpy as np

DEFAULT_SEED = 0


def tensor_file(folder: Path, index: int, tensor: Tensor) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", tensor.onnx_name)[:60] or "tensor"
    return folder / f"{index}_{safe}.bin"


def random_inputs(signature: Signature, seed: int = DEFAULT_SEED) -> list[np.ndarray]:
    """One array per input, in kernel_entry's order: standard normal values for floating types; 0 or 1 for
    integers (valid as an index on any axis)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays = []
    for tensor in signature.inputs:
        dtype = np.dtype(tensor.dtype)
        if dtype.kind == "f":
            arrays.append(rng.standard_normal(tensor.shape).astype(dtype))
        else:
            arrays.append(rng.integers(0, 2, size=tensor.shape).astype(dtype))
    return arrays


def make_inputs(signature: Signature, folder: Path, seed: int = DEFAULT_SEED) -> list[np.ndarray]:
    """random_inputs, each also written to `folder` for the harness."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = random_inputs(signature, seed)
    for i, (tensor, array) in enumerate(zip(signature.inputs, arrays, strict=True)):
        array.tofile(tensor_file(folder, i, tensor))
    return arrays


def read_outputs(signature: Signature, folder: Path, suffix: str = "") -> list[np.ndarray]:
    """The outputs a run wrote to `folder` (`suffix`: those of its CUDA graph, cuda_graph.GRAPH_SUFFIX). InputError
    when one is missing or of the wrong size."""
    import numpy as np

    arrays = []
    for i, tensor in enumerate(signature.outputs):
        path = tensor_file(folder, i, tensor)
        path = path.with_name(path.name + suffix)
        try:
            array = np.fromfile(path, dtype=tensor.dtype)
        except OSError as exc:
            raise InputError(f"cannot read the output: {exc}", where=str(path)) from exc
        if array.size != tensor.elements:
            raise InputError(f"holds {array.size} values, {tensor.onnx_name} has {tensor.elements}", where=str(path))
        arrays.append(array.reshape(tensor.shape))
    return arrays


# Below this, the output hardly depends on the input (see Reference.sensitivity): a network whose activations
# vanish (random weights of too small a scale, say) gives its biases whatever its convolutions compute, and an error
# bound met there says little about the kernels. A network that uses its input changes by O(1).
INSENSITIVE_BELOW = 1e-3


@dataclass
class Reference:
    outputs: list[Any]  # numpy arrays, in kernel_entry's output order
    seconds: float
    runtime: str  # "onnxruntime 1.x (CPUExecutionProvider)"
    # how much the outputs change for another random input: the largest relative_error(other, outputs); None when
    # no other input was run
    sensitivity: float | None = None

    def insensitive(self) -> str:
        """Why the comparison with this reference tests little, or ''."""
        if self.sensitivity is None or self.sensitivity >= INSENSITIVE_BELOW:
            return ""
        return (f"the output hardly depends on the input: another random input changes it by {self.sensitivity:.1e} "
                f"of its largest value (below {INSENSITIVE_BELOW:g}), so the error check tests little of the network "
                "(activations that vanish, e.g. random weights of too small a scale, leave the output to the biases)")


def onnx_runtime_reference(model: Path, signature: Signature, inputs: list[np.ndarray],
                           other_inputs: list[np.ndarray] | None = None) -> Reference:
    """The model run by ONNX Runtime's CPU execution provider on `inputs`, its outputs matched to kernel_entry's by
    the model's names; with `other_inputs`, run on those too for Reference.sensitivity. ToolError without
    onnxruntime; InputError when the names do not match."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise ToolError(f"onnxruntime is not installed ({exc}): it computes the reference output ({RUN_EXTRA})") \
            from exc
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
    def run(arrays: list[np.ndarray]) -> list[Any]:
        try:
            return list(session.run([t.onnx_name for t in signature.outputs],
                                    {t.onnx_name: a for t, a in zip(signature.inputs, arrays, strict=True)}))
        except Exception as exc:  # the run's own errors (shapes, types) come as onnxruntime's exception types
            raise InputError(f"ONNX Runtime cannot run the model: {exc}", where=str(model)) from exc

    outputs = run(inputs)
    seconds = time.monotonic() - started
    sensitivity = None if other_inputs is None else largest_error(run(other_inputs), outputs)[0]
    return Reference(outputs, seconds, f"onnxruntime {onnxruntime.__version__} (CPUExecutionProvider)", sensitivity)


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
