"""Which tuned row breaks the network: DBs with subsets of tuned-best's rows, each compiled and checked."""
import subprocess, sys
from pathlib import Path
sys.path.insert(0, ".")
from core.db.kernel_db import KernelDB
net = Path("/tmp/kdb-run/net")
with KernelDB.open(net / "tuned-best.db") as db:
    rows = list(db.iter_table_order())
def has(r, *words): return any(w in r.identifier for w in words)
subsets = {"only-maxpool": [r for r in rows if has(r, "MaxPool")],
           "only-dot": [r for r in rows if has(r, "Dot")],
           "no-pool-no-dot": [r for r in rows if not has(r, "MaxPool", "Dot")]}
for label, chosen in subsets.items():
    path = net / f"{label}.db"; path.unlink(missing_ok=True)
    with KernelDB.open(path, create=True) as db:
        for r in chosen: db.insert(r)
    print(label, len(chosen), "rows", flush=True)
    subprocess.run([sys.executable, "bench/bench_network.py", "nnfusion", "--out", str(net), "--db", str(path),
                    "--nnfusion", sys.argv[1], "--label", label, "--runs", "1"], timeout=120)
subprocess.run([sys.executable, "bench/bench_network.py", "nnfusion", "--out", str(net), "--db", str(net / "tuned-best.db"),
                "--nnfusion", sys.argv[1], "--label", "no-blockfusion", "--runs", "1", "--flag=-fblockfusion_level=0"], timeout=120)
