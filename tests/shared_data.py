"""Where the team's data beside the checkout (../shared) is, for tests and benchmarks only.

Product code never reads it. One place resolves it: $KDB_SHARED_DIR when set (a test points it at an
empty folder to see what a fresh clone sees), else ../shared beside the checkout, else ./shared (where the
device machine carries a copy). Nothing needs it: tests and benchmarks run on data the project makes
itself (core/demo.py), and ../shared only adds coverage where it is present. The kernel corpus that
benchmarks and load tests repeat to any size lives here too, as it is the artifact's where present.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED_ENV = "KDB_SHARED_DIR"
ARTIFACT_KERNELS = "nnfusion-artifact/kernels"
ARTIFACT_LOGS = "nnfusion-artifact/autotvm_logs"
ARTIFACT_OPCONFIGS = "nnfusion-artifact/op_configs"


def shared_dir() -> Path:
    if env := os.environ.get(SHARED_ENV):
        return Path(env)
    beside = REPO.parent / "shared"
    return beside if beside.is_dir() else REPO / "shared"


def shared_path(relative: str) -> Path:
    return shared_dir() / relative


def shared_label(relative: str) -> str:
    """How messages name a shared path: as the team knows it, and where it was looked for."""
    return f"../shared/{relative} (looked for at {shared_path(relative)}; {SHARED_ENV} moves it)"


def artifact_kernel_files() -> list[Path]:
    """The Rammer artifact's kernel JSON files; empty when ../shared is absent."""
    return sorted(shared_path(ARTIFACT_KERNELS).glob("*.json"))


def read_items(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read kernel JSON: {exc}") from exc
    return data if isinstance(data, list) else [data]


def project_kernels() -> list[dict[str, Any]]:
    """The demo kernels the project writes itself (core/demo.py), less the one made to fail."""
    from core.demo import demo_kernels

    return [k for k in demo_kernels() if "spin" not in k["tvm_func_name"]]


def kernel_corpus() -> tuple[str, list[dict[str, Any]]]:
    """The kernels a benchmark repeats: the artifact's where ../shared has them, else the project's own."""
    files = artifact_kernel_files()
    if files:
        return str(shared_path(ARTIFACT_KERNELS)), [item for path in files for item in read_items(path)]
    return "the demo kernels (core/demo.py)", project_kernels()


def distinct_copies(n: int) -> Iterator[dict[str, Any]]:
    """N kernels from kernel_corpus(), each with its own name and body (a comment naming the copy), so nothing
    is deduplicated: each is real work for validation, parsing, barrier counting and its own insert."""
    _, base = kernel_corpus()
    for i in range(n):
        item = dict(base[i % len(base)])
        brace = item["code"].index("{")
        item["code"] = item["code"][: brace + 1] + f"\n  // copy {i}\n" + item["code"][brace + 1:]
        item["tvm_func_name"] = f"{item['tvm_func_name']}_copy{i}"
        yield item


def write_corpus(n: int, dest: Path, per_file: int = 100) -> None:
    """distinct_copies(n) as kernel JSON files of per_file items in dest."""
    dest.mkdir(parents=True, exist_ok=True)
    batch: list[dict[str, Any]] = []
    for i, item in enumerate(distinct_copies(n)):
        batch.append(item)
        if len(batch) == per_file:
            (dest / f"part{i // per_file:05d}.json").write_text(json.dumps(batch))
            batch = []
    if batch:
        (dest / f"part{n // per_file:05d}.json").write_text(json.dumps(batch))
