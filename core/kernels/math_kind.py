"""What a row computes in and on: its precision (fp16, TF32, fp32, fp64) and its units (the tensor cores or the CUDA
cores), read from the row alone, so that the Kernels view, `kdb ls` and their filters say it of every row.

The precision is the row's element type, TF32 where its Attributes say `"math": "tf32"` (a float op computed on the
tensor cores in TF32: core/kernels/opsig.py). The units are the tensor cores where the body issues a matrix
instruction: inline-PTX `mma.sync` (kdb's rows: core/codegen/mma.py) or WMMA's `mma_sync` (other tools' rows).
"""

from __future__ import annotations

import json

PRECISIONS = ("fp16", "tf32", "fp32", "fp64")
TENSOR_CORES, CUDA_CORES = "tensor cores", "CUDA cores"
UNITS = (TENSOR_CORES, CUDA_CORES)
_PRECISION_OF_DTYPE = {"half": "fp16", "float": "fp32", "double": "fp64"}
# Text a tensor-core body holds and a CUDA-core body does not; the SQL below and units() both test these
TENSOR_CORE_MARKS = ("mma.sync", "mma_sync")
# The units of a KernelCache row in SQL, over its Function column (JSON text: the marks read the same escaped)
UNITS_SQL = ("CASE WHEN " + " OR ".join(f"instr({{function}}, '{m}') > 0" for m in TENSOR_CORE_MARKS)
             + f" THEN '{TENSOR_CORES}' ELSE '{CUDA_CORES}' END")


def units(function_or_body: str | None) -> str:
    """The tensor cores or the CUDA cores, from a row's Function column or its kernel body."""
    text = function_or_body or ""
    return TENSOR_CORES if any(mark in text for mark in TENSOR_CORE_MARKS) else CUDA_CORES


def precision(identifier: str | None, attributes: str | None) -> str:
    """fp16, tf32, fp32 or fp64: the Attributes' dtype and math (kdb writes both), else the C type the identifier
    names (rows of other tools). Registered as the SQL function kdb_precision (core/db/browse.py)."""
    attrs = _json_object(attributes)
    if attrs.get("math") == "tf32":
        return "tf32"
    dtype = attrs.get("dtype")
    if isinstance(dtype, str) and dtype in _PRECISION_OF_DTYPE:
        return _PRECISION_OF_DTYPE[dtype]
    text = identifier or ""
    for c_type in ("half", "double"):  # an identifier names one C type per tensor: two in a row at least
        if c_type * 2 in text:
            return _PRECISION_OF_DTYPE[c_type]
    return "fp32"


def label(row_precision: str, row_units: str) -> str:
    """How a list shows both: "fp16 · tensor", "fp32 · CUDA"."""
    shown = "TF32" if row_precision == "tf32" else row_precision
    return f"{shown} · {'tensor' if row_units == TENSOR_CORES else 'CUDA'}" if row_precision else ""


def describe(row_precision: str, row_units: str) -> str:
    """How a row's detail says both: "fp16 on the tensor cores"."""
    shown = "TF32" if row_precision == "tf32" else row_precision
    return f"{shown} on the {row_units}"


def _json_object(text: str | None) -> dict[str, object]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
