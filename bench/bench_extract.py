"""Op-config extraction time for a model of 100+ ops (a ResNet of basic blocks, built with onnx.helper).

    .venv/bin/python bench/bench_extract.py            # prints a table, writes bench/results/extract.json

Two builds of the same 109-node graph: real ResNet widths (64..512 channels at 224x224, ~100 MB of
weights) and a narrow one (8..64 channels), so the table separates reading the weights from the
per-node work. Each time is the median of 5 runs of core.onnx_extract.extract, the whole of it
(load, shape inference, mapping); "onnx.load" times reading and parsing the file alone, the part no
extraction can skip.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

RUNS = 5
MODELS = {
    "resnet, widths 64-512, 224px": {"widths": (64, 128, 256, 512), "size": 224},
    "resnet, widths 8-64, 64px": {"widths": (8, 16, 32, 64), "size": 64},
}


def median_ms(fn: Callable[[], object]) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def load(path: Path) -> object:
    import onnx

    return onnx.load(str(path), load_external_data=False)


def measure(name: str, kwargs: dict, tmp: Path) -> dict:
    from onnx_models import resnet, write

    from core.opconfigs.onnx_extract import extract

    path = write(resnet(**kwargs), tmp / "model.onnx")
    extraction = extract(path)  # warm-up (imports), and the counts
    total = median_ms(lambda: extract(path))
    loaded = median_ms(lambda: load(path))
    nodes = extraction.node_count
    return {"model": name, "nodes": nodes, "configs": len(extraction.configs),
            "ops": sum(extraction.count(c) for c in extraction.configs), "unmapped": len(extraction.unmapped),
            "mb": path.stat().st_size / 1e6, "ms": total, "load_ms": loaded, "ms_per_node": total / nodes,
            "beyond_load_ms_per_node": max(total - loaded, 0.0) / nodes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, default=RESULTS / "extract.json", help="results file")
    out = ap.parse_args().json
    with tempfile.TemporaryDirectory(prefix="kdb-bench-") as tmp:
        rows = [measure(name, kwargs, Path(tmp)) for name, kwargs in MODELS.items()]
    cols = [("model", "model", ""), ("nodes", "nodes", "d"), ("configs", "op configs", "d"), ("ops", "ops", "d"),
            ("unmapped", "unmapped", "d"), ("mb", "MB", ".1f"), ("ms", "ms", ".1f"),
            ("load_ms", "onnx.load ms", ".1f")]
    width = {key: max(len(label), 6) for key, label, _ in cols} | {"model": max(len(r["model"]) for r in rows)}
    print(f"\nop-config extraction (median of {RUNS} runs)")
    print("  ".join(f"{label:<{width[key]}}" if key == "model" else f"{label:>{width[key]}}" for key, label, _ in cols))
    for r in rows:
        print("  ".join(f"{r[key]:<{width[key]}}" if key == "model" else f"{format(r[key], fmt):>{width[key]}}"
                        for key, _, fmt in cols))
    for r in rows:
        print(f"  ratio: {r['ms_per_node']:.3f} ms per node ({r['beyond_load_ms_per_node']:.3f} ms per node beyond "
              f"onnx.load: shape inference and mapping) for {r['model']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"python": sys.version.split()[0], "runs": RUNS, "models": rows}, indent=1))
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
