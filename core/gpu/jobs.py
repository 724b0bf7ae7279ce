"""GPU jobs (verify, time, count barriers) run in a child process, so a hung or crashing kernel never
freezes the console or the CLI: each job has a timeout, after which the child's whole process group is
killed and a fresh child takes the next job.

The parent side needs no pycuda: it only builds job payloads from kernel rows and reads the answers.
The child (core.gpu.worker) holds the CUDA context, compiles with pycuda and launches.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.cuda.nvcc import BLOCK_KERNEL, standalone_source
from core.errors import InputError, ToolError
from core.gpu.exclusive import LOCK_ENV, WAITING, lock_path
from core.kernels.export import row_to_item
from core.kernels.kernel_row import KernelRow

if TYPE_CHECKING:
    from core.gpu.inventory import DeviceInfo


def gpu_children(workers: int) -> int:
    """GPU children to run at once for `workers` CPU workers: a verification's cost is the CPU's compile and
    float64 reference, so several overlap on one GPU (timed launches take turns); each holds a CUDA context."""
    return max(1, min(8, workers // 2))




@dataclass
class GpuResult:
    ok: bool
    kind: str  # verify | time | barriers | devices
    reason: str = ""
    max_rel_error: float | None = None
    microseconds: float | None = None  # median of the timed launches
    spread: tuple[float, float] | None = None  # (p10, p90) of the timed launches, us
    launches: int = 0
    barriers: int | None = None
    device: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def profile_entry(self) -> dict[str, Any]:
        """A timing as the row keeps it in Miscs.kdb.profile[device]."""
        return {"us": self.microseconds, "p10_us": self.spread[0] if self.spread else None,
                "p90_us": self.spread[1] if self.spread else None, "launches": self.launches}


def job_for_row(row: KernelRow, kind: str, *, repeats: int = 100, tolerance: float | None = None,
                cubins: Mapping[str, bytes] | None = None) -> dict[str, Any]:
    """The payload the child needs: the row's standalone kernel, launch config and op parameters.

    `cubins` (arch -> the nvcc check's cubin of the row's translation unit): the child loads the one built
    for its device instead of compiling the source again; without one for its arch it compiles."""
    try:
        function = json.loads(row.function)
        attrs = json.loads(row.attributes)
    except ValueError as exc:
        raise InputError(f"row {row.key[:20]}: Function/Attributes are not JSON: {exc}") from exc
    item = row_to_item(row)
    dtype = attrs.get("dtype", "float") if isinstance(attrs, dict) else "float"
    return {
        "kind": kind,
        "name": item["tvm_func_name"],
        "source": standalone_source(function),
        "kernel": "kdb_kernel",
        "grid": function["grid_dim"],
        "block": function["block_dim"],
        "op_type": row.op,
        "params": item["parameters"],
        "dtype": dtype,
        "tolerance": tolerance if tolerance is not None else _tolerance(row.op, item["parameters"], dtype,
                                                                        item.get("math", "")),
        "repeats": repeats,
        "cubins": {arch: base64.b64encode(data).decode("ascii") for arch, data in (cubins or {}).items() if data},
        "cubin_kernel": BLOCK_KERNEL,
    }


def _tolerance(op_type: str, params: dict[str, Any], dtype: str, math: str = "") -> float:
    """The verification bound for the row's op and element type, or TF32's for a TF32 row (core/codegen/reference.
    tolerance's policy)."""
    from core.codegen.reference import tolerance_for
    from core.opconfigs.opconfig import OpConfig

    return tolerance_for(OpConfig(op_type, params, dtype=dtype, math=math))


class GpuSession:
    """A child process that runs GPU jobs one at a time; restarted after a timeout or a crash."""

    def __init__(self, *, timeout_s: float = 60.0, compile_timeout_s: float = 300.0,
                 python: str = sys.executable) -> None:
        self.timeout_s = timeout_s  # for the launches, counted from the end of compilation
        self.compile_timeout_s = compile_timeout_s  # nvcc on a heavily unrolled tuned kernel can take minutes
        self.python = python
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> GpuSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([self.python, "-m", "core.gpu.worker"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                         cwd=os.getcwd(), env={**os.environ, LOCK_ENV: str(lock_path())})
        return self.proc

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._kill()
        self.proc = None

    def _kill(self) -> str:
        """Kill the child's whole process group; return what it wrote on stderr (the cause, often)."""
        if self.proc is None:
            return ""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            _, err = self.proc.communicate(timeout=5)
        except (subprocess.TimeoutExpired, ValueError, OSError):
            err = b""
        self.proc = None
        return (err or b"").decode("utf-8", "replace")[-2000:]

    def run(self, job: dict[str, Any]) -> GpuResult:
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write((json.dumps(job) + "\n").encode())
            proc.stdin.flush()
        except OSError:
            stderr = self._kill()
            return GpuResult(False, job["kind"], f"GPU worker died before the job: {stderr.strip()[-500:]}")
        # Clocks: compiling (the child says when it is done), waiting for the GPU lock (another process's timed
        # launches), then the launches themselves.
        deadline, clock = time.monotonic() + self.compile_timeout_s, "compiling"
        buffered = b""
        while True:
            if b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                answer = json.loads(line.decode())
                if set(answer) != {"phase"}:
                    break
                clock = "waiting" if answer["phase"] == WAITING else "running"
                deadline = time.monotonic() + (self.compile_timeout_s if clock == "waiting" else self.timeout_s)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill()
                return GpuResult(False, job["kind"], {
                    "compiling": f"compiling the kernel took over {self.compile_timeout_s:g} s "
                                 "(nvcc through pycuda): the GPU job was killed",
                    "waiting": f"waited over {self.compile_timeout_s:g} s for the GPU (another process held "
                               f"{lock_path()}): the GPU job was killed",
                    "running": f"timed out after {self.timeout_s:g} s (hung kernel?): the GPU job was killed",
                }[clock])
            ready, _, _ = select.select([proc.stdout], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    stderr = self._kill()
                    return GpuResult(False, job["kind"], f"GPU worker crashed: {stderr.strip()[-500:] or 'no message'}")
                buffered += chunk
        spread = answer.get("spread")
        return GpuResult(ok=answer["ok"], kind=answer["kind"], reason=answer.get("reason", ""),
                         max_rel_error=answer.get("max_rel_error"), microseconds=answer.get("microseconds"),
                         spread=tuple(spread) if spread else None, launches=answer.get("launches", 0),
                         barriers=answer.get("barriers"), device=answer.get("device", ""),
                         extra=answer.get("extra", {}))


class GpuSessions:
    """Idle GPU sessions for worker threads: each borrows one (a child starts on first need) and gives it back."""

    def __init__(self, *, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._idle: queue.SimpleQueue[GpuSession] = queue.SimpleQueue()

    @contextmanager
    def borrow(self) -> Iterator[GpuSession]:
        try:
            session = self._idle.get_nowait()
        except queue.Empty:
            session = GpuSession(timeout_s=self.timeout_s)
        try:
            yield session
        finally:
            self._idle.put(session)

    def close(self) -> None:
        while not self._idle.empty():
            self._idle.get().close()


def gpu_available() -> tuple[bool, str]:
    """Whether pycuda and a CUDA device are here (asked in a child, like every GPU question)."""
    from core.gpu.inventory import detect_devices

    devices, reason = detect_devices()
    return (True, devices[0].name) if devices else (False, reason)


def require_gpu() -> str:
    return require_device().name


def require_device() -> DeviceInfo:
    """The CUDA device GPU jobs run on (the first one); ToolError saying why there is none."""
    from core.gpu.inventory import detect_devices

    devices, reason = detect_devices()
    if not devices:
        raise ToolError(reason)
    return devices[0]
