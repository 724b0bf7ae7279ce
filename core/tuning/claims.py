"""Several processes tuning one network: each op goes to whichever process claims it first.

One tuning process cannot keep a 16-core host busy (its search and cost model are serial between build
batches), so a network is tuned by N processes side by side. Dealing the ops out before the run left the host
part-idle at the end: on the H200 (session 10) the four processes ended at 555, 612, 693 and 754 s. Here each
process takes the next op nobody has claimed, in the same order (largest share first), so they end together.

A claim is a file created with O_EXCL under `<state dir>/claims/<run>/<stage>/`: the file system decides who
got it, with no lock server, and a process that dies leaves its pid there. A run's processes share the run name;
a new run (a resume) takes a new name, so its ops are free again. The probes come before the spread of the
budget, which weighs what they measured: `wait_for` holds each process until every probe is done, so all of
them spread the same budget over the same records.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from core.errors import InputError

POLL_S = 1.0


class ClaimBoard:
    """The claims of one run's processes (all on this host: a claimant's liveness is checked by its pid)."""

    def __init__(self, root: Path, run: str) -> None:
        if not run or not all(c.isalnum() or c in "-_." for c in run) or run.startswith("."):
            raise InputError(f"{run!r} is not a run name: letters, digits, '-', '_' and '.'", where="claims")
        self.folder = root / run

    @classmethod
    def for_run(cls, run: str) -> ClaimBoard:
        """The board of run `run` in this state dir (where every process of the run must look)."""
        from core.db.state import state_dir

        return cls(state_dir() / "claims", run)

    def _path(self, stage: str, key: str, suffix: str) -> Path:
        # op keys hold any character: the file is named by a hash of the key
        return self.folder / (stage or "tune") / (hashlib.sha256(key.encode()).hexdigest()[:32] + suffix)

    def claim(self, stage: str, key: str) -> bool:
        """True when this process got the op (and must tune it), False when another process has it."""
        path = self._path(stage, key, ".claim")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True

    def done(self, stage: str, key: str) -> None:
        """The op's job ended (done, failed or cancelled): nobody waits for it any longer."""
        path = self._path(stage, key, ".done")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def pending(self, stage: str, keys: Iterable[str]) -> int:
        """Jobs of the stage not yet ended: those of `keys` nobody has claimed, and every claimed one whose
        claimant is alive and has not marked it done (a process may have claimed ops this one does not list:
        it looked at the records earlier)."""
        folder = self.folder / (stage or "tune")
        claims = {path.with_suffix("") for path in folder.glob("*.claim")} if folder.is_dir() else set()
        unclaimed = {self._path(stage, key, "") for key in keys} - claims
        return len(unclaimed) + sum(1 for stem in claims
                                    if not stem.with_suffix(".done").exists() and _claimant_alive(stem))

    def wait_for(self, stage: str, keys: Iterable[str], should_cancel: Callable[[], bool] | None = None,
                 poll_s: float = POLL_S) -> bool:
        """Block until every job of the stage has ended (or its claimant died); False when cancelled first."""
        keys = list(keys)
        while self.pending(stage, keys):
            if should_cancel is not None and should_cancel():
                return False
            time.sleep(poll_s)
        return True


def _claimant_alive(stem: Path) -> bool:
    try:
        pid = int(stem.with_suffix(".claim").read_text() or "0")
    except (FileNotFoundError, ValueError):
        return True  # the claimant is still writing its pid
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True
