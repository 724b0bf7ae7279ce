"""Each tuning record's cost-model features, stored once beside the record (issue 31, change C).

The shared cost model (costmodel.py) learns every trial recorded under the tuning root, and before this each
process extracted the features of every other process's records at its warm starts: on the H200 (session
14) the warm starts were 470 of the cost-model phase's 522 process-s, and on this CPU rebuilding a record
from its trace and featurising it costs 117 CPU ms against 6.6 from the store (bench/bench_warm_start.py).
Now the process that measures a record keeps the features its live model update extracted (`FeatureCapture`)
and appends them to `FEATURES` in the record's work dir; a warm start reads them there and rebuilds nothing. A
record without stored features (a batch killed before its model update, a failed build, records from before this
file existed) is rebuilt and featurised as before.

Only the process tuning a work dir writes its file (a work dir is claimed by one process at a time:
claims.py). Each entry is keyed by the SHA-1 of its record's line, as the database wrote it, so the file need
not follow the records' order and a torn or foreign entry matches nothing. Layout of an entry: 20 bytes of
SHA-1, rows and columns (two little-endian uint32), rows x columns float32 (the features as XGBModel keeps them).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

FEATURES = "kdb_features.bin"
_HEAD = struct.Struct("<20sII")
_MAX_VALUES = 1 << 24  # more floats than any per-store feature matrix has: the rest of the file is not ours


def line_key(line: str) -> bytes:
    """What a record's features are stored under: its line in the records file, without the newline."""
    return hashlib.sha1(line.rstrip("\r\n").encode("utf-8")).digest()


def read_features(work_dir: Path) -> dict[bytes, np.ndarray]:
    """The features stored in `work_dir` by record line; a torn last entry (a process killed mid-write) ends it."""
    path = work_dir / FEATURES
    if not path.is_file():
        return {}
    data = path.read_bytes()
    out: dict[bytes, np.ndarray] = {}
    at = 0
    while at + _HEAD.size <= len(data):
        key, rows, cols = _HEAD.unpack_from(data, at)
        size = rows * cols * 4
        if rows * cols > _MAX_VALUES or at + _HEAD.size + size > len(data):
            break
        out[key] = np.frombuffer(data, dtype="<f4", count=rows * cols, offset=at + _HEAD.size).reshape(rows, cols)
        at += _HEAD.size + size
    return out


def append_features(work_dir: Path, entries: Iterable[tuple[bytes, np.ndarray]]) -> int:
    """Append (record key, features) entries to the work dir's file in one write; how many."""
    chunks = []
    for key, features in entries:
        matrix = np.ascontiguousarray(features, dtype="<f4")
        if matrix.ndim != 2:
            matrix = matrix.reshape(len(matrix), -1) if matrix.size else matrix.reshape(0, 0)
        chunks.append(_HEAD.pack(key, matrix.shape[0], matrix.shape[1]) + matrix.tobytes())
    if chunks:
        with (work_dir / FEATURES).open("ab") as out:
            out.write(b"".join(chunks))
    return len(chunks)


class _Given:
    """A feature as XGBModel reads it (`.numpy()`), from a stored array."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def numpy(self) -> np.ndarray:
        return self.array


class FeatureCapture:
    """The shared XGBModel's feature extractor, wrapped: while `armed` (the model update after a measured
    batch), it keeps what it extracted, for `take`; with `given` set, it returns those features instead of
    extracting (a warm start from stored ones)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.armed = False
        self.captured: list[tuple[list[Any], list[Any]]] = []  # (candidates, their features), per call
        self.given: list[np.ndarray] | None = None

    def extract_from(self, context: Any, candidates: Any) -> list[Any]:
        if self.given is not None:
            return [_Given(f) for f in self.given]
        features = self.inner.extract_from(context, candidates)
        if self.armed:
            self.captured.append((list(candidates), list(features)))
        return features

    def take(self) -> list[tuple[Any, np.ndarray]]:
        """(candidate, features as float32) of every extraction since armed; disarms."""
        out = [(c, f.numpy().astype("float32")) for candidates, features in self.captured
               for c, f in zip(candidates, features, strict=True)]
        self.armed, self.captured = False, []
        return out
