"""TVM's RPC tracker and servers: the engine users already run to measure on many GPUs and hosts.

`RpcCluster` starts (or attaches to) a tracker and one rpc_server per GPU, each server pinned to its
GPU with CUDA_VISIBLE_DEVICES; `tracker_status` reads the tracker's servers and queue for the views.
Every process is started from an argv list in its own process group, so stopping kills it whole.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from core.errors import ToolError
from core.processes import kill_group


@dataclass
class ServerInfo:
    key: str
    address: str


@dataclass
class TrackerStatus:
    reachable: bool
    servers: list[ServerInfo] = field(default_factory=list)
    queue: dict[str, dict[str, int]] = field(default_factory=dict)  # key -> {"free", "pending"}
    error: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tracker_status(host: str, port: int, timeout_s: float = 5.0) -> TrackerStatus:
    try:
        from tvm import rpc
    except ImportError as exc:
        return TrackerStatus(False, error=f"Apache TVM is not installed ({exc})")
    try:  # a port nobody listens on answers at once here; TVM's client would retry it for 60 s
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        return TrackerStatus(False, error=f"cannot connect to {host}:{port}: {exc}")
    try:
        summary = rpc.connect_tracker(host, port).summary()
    except Exception as exc:
        return TrackerStatus(False, error=f"{type(exc).__name__}: {exc}")
    servers = [ServerInfo(str(s.get("key", "")).split(":")[-1], str(s.get("addr", "")))
               for s in summary.get("server_info", [])]
    queue = {str(k): {"free": int(v.get("free", 0)), "pending": int(v.get("pending", 0))}
             for k, v in summary.get("queue_info", {}).items()}
    return TrackerStatus(True, servers, queue)


class RpcCluster:
    """A tracker (started here unless attaching) and rpc_servers, e.g. one per GPU of this host."""

    def __init__(self, *, host: str = "127.0.0.1", port: int | None = None, key: str = "kdb",
                 start_tracker: bool = True) -> None:
        self.host, self.port, self.key = host, port or free_port(), key
        self.start_tracker = start_tracker
        self.procs: list[subprocess.Popen[bytes]] = []
        self.servers: dict[str, subprocess.Popen[bytes]] = {}

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True, env={**os.environ, **(env or {})})
        self.procs.append(proc)
        return proc

    def __enter__(self) -> RpcCluster:
        if self.start_tracker:
            self._spawn(["-m", "tvm.exec.rpc_tracker", "--host", self.host, "--port", str(self.port),
                         "--port-end", str(self.port + 1), "--silent"])
            self._wait(lambda s: s.reachable, "the tracker did not come up")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_server(self, name: str, *, gpu: int | None = None) -> None:
        """Start one rpc_server registered under our key; pinned to one GPU when `gpu` is given."""
        env = {"CUDA_VISIBLE_DEVICES": str(gpu)} if gpu is not None else {}
        port = free_port()
        self.servers[name] = self._spawn(
            ["-m", "tvm.exec.rpc_server", "--tracker", f"{self.host}:{self.port}", "--key", self.key,
             "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 50), "--no-fork", "--silent"],
            env)

    def wait_for_servers(self, n: int, timeout_s: float = 60.0) -> TrackerStatus:
        return self._wait(lambda s: s.reachable and s.queue.get(self.key, {}).get("free", 0) >= n,
                          f"fewer than {n} rpc_servers registered", timeout_s)

    def kill_server(self, name: str) -> None:
        proc = self.servers.pop(name)
        kill_group(proc)

    def status(self) -> TrackerStatus:
        return tracker_status(self.host, self.port)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            kill_group(proc)
        self.procs.clear()
        self.servers.clear()

    def _wait(self, ok: Any, what: str, timeout_s: float = 60.0) -> TrackerStatus:
        deadline = time.monotonic() + timeout_s
        status = self.status()
        while not ok(status):
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                err = (dead[0].stderr.read() if dead[0].stderr else b"").decode("utf-8", "replace")[-800:]
                raise ToolError(f"{what}: a process exited ({err.strip() or 'no message'})")
            if time.monotonic() > deadline:
                raise ToolError(f"{what} within {timeout_s:g} s ({status.error or status.queue})")
            time.sleep(0.3)
            status = self.status()
        return status


def local_gpu_cluster(n: int, *, key: str = "kdb") -> RpcCluster:
    """A tracker and one rpc_server per GPU of this host (n < 0: every GPU), already registered."""
    from core.gpu.inventory import detect_devices

    devices, reason = detect_devices()
    if not devices:
        raise ToolError(f"no GPU to measure on: {reason}")
    count = len(devices) if n < 0 else n
    if count > len(devices):
        raise ToolError(f"{count} GPUs asked for, {len(devices)} here")
    cluster = RpcCluster(key=key)
    cluster.__enter__()
    try:
        for gpu in range(count):
            cluster.add_server(f"gpu{gpu}", gpu=gpu)
        cluster.wait_for_servers(count)
    except BaseException:
        cluster.stop()
        raise
    return cluster

