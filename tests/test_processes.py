"""Process pools started under a host that replaced sys.stderr, as Textual does while the console runs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import KERNELS, REPO, needs_artifact

# A fresh interpreter: in this one an earlier test may have started multiprocessing's resource tracker already,
# and then the bug cannot show.
SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from core.db.kernel_db import KernelDB
    from core.inject import InjectOptions, Injector

    class NoDescriptor:  # what Textual puts in sys.stderr while an app runs
        def write(self, text): return len(text)
        def flush(self): pass
        def fileno(self): return -1

    if __name__ == "__main__":
        sys.stderr = NoDescriptor()
        try:
            with KernelDB.open(Path(sys.argv[1]), create=True) as db:
                report = Injector(db, InjectOptions(compile=False, workers=2)).run([Path(sys.argv[2])])
        except Exception as exc:
            sys.stdout.write(json.dumps({"error": repr(exc)}))
        else:
            sys.stdout.write(json.dumps({"injected": report.injected,
                                         "failures": [f.reason for f in report.failures]}))
""")


@needs_artifact
def test_a_pool_of_workers_starts_when_stderr_has_no_descriptor(tmp_path: Path):
    script = tmp_path / "inject_without_stderr.py"
    script.write_text(SCRIPT, encoding="utf-8")
    kernels = sorted(KERNELS.glob("*.json"))[0]
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "k.db"), str(kernels)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert proc.returncode == 0, proc.stderr
    outcome = json.loads(proc.stdout)
    assert "error" not in outcome, outcome["error"]
    assert outcome["failures"] == [] and outcome["injected"] > 0
