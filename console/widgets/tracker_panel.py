"""The RPC tracker as the Tuning view shows it: its address and key, whether it answers, its servers and queue.

The panel reads the tracker itself, in a worker (one read at a time: an unreachable host takes seconds to say
so); its owner calls poll() with the settings' tracker whenever it wants a fresh read.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from textual import work
from textual.markup import escape
from textual.message import Message
from textual.widgets import Static
from textual.worker import Worker

from core.tuning.rpc import TrackerStatus, tracker_status

SERVERS_SHOWN = 4
CONNECT_S = 2.0


def read_tracker(address: str) -> TrackerStatus:
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return TrackerStatus(False, error=f"{address!r} is not HOST:PORT")
    return tracker_status(host, int(port), timeout_s=CONNECT_S)


class TrackerPanel(Static):
    """The tracker at `address` (the settings'), as last read: `status` (None: not read yet)."""

    @dataclass
    class Read(Message):
        address: str
        status: TrackerStatus

    def __init__(self, **kwargs: str) -> None:
        super().__init__(**kwargs)
        self.address = self.key = ""
        self.status: TrackerStatus | None = None
        self.busy = False

    def poll(self, address: str, key: str) -> None:
        if address != self.address:  # the settings name another tracker (or none)
            self.address, self.status = address, None
        self.key = key
        self._show()
        if address and not self.busy:
            self.busy = True
            self.read(address)

    @work(thread=True, exit_on_error=False, group="tracker")
    def read(self, address: str) -> None:
        self.post_message(self.Read(address, read_tracker(address)))

    def on_tracker_panel_read(self, message: Read) -> None:
        message.stop()
        if message.address == self.address:  # else the settings changed meanwhile
            self.status = message.status
            self._show()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.is_finished:
            self.busy = False
        self.app.report_worker_failure(event)  # type: ignore[attr-defined]

    def _show(self) -> None:
        self.update("\n".join(tracker_lines(self.address, self.key, self.status)))


def tracker_lines(address: str, key: str, status: TrackerStatus | None) -> list[str]:
    if not address:
        return ["[dim]none set: trials are measured on this machine (set one in GPU & SM settings, 4)[/]"]
    head = f"{escape(address)} · key [b]{escape(key)}[/b]"
    if status is None:
        return [f"{head}: [dim]checking…[/]"]
    if not status.reachable:
        return [f"{head}: [$error]unreachable[/]", f"[dim]{escape(status.error)}[/]"]
    lines = [f"{head}: [$success]reachable[/]"]
    ours = status.queue.get(key)
    if ours is None:
        lines.append(f"[$warning]no server registered under key {escape(key)}[/]")
    for name, counts in sorted(status.queue.items(), key=lambda kv: kv[0] != key):
        label = f"[b]{escape(name)}[/b]" if name == key else escape(name)
        lines.append(f"queue {label}: {counts.get('free', 0)} free · {counts.get('pending', 0)} pending")
    servers = status.servers
    lines.append(f"{len(servers)} server{'s' if len(servers) != 1 else ''}"
                 + (":" if servers else " registered"))
    lines += [f"  {escape(s.key)} at {escape(host_port(s.address))}" for s in servers[:SERVERS_SHOWN]]
    if len(servers) > SERVERS_SHOWN:
        lines.append(f"  … and {len(servers) - SERVERS_SHOWN} more")
    return lines


def host_port(address: str) -> str:
    """The tracker reports a server's address as [host, port], which ServerInfo keeps as text: host:port."""
    try:
        host, port = ast.literal_eval(address)
    except (ValueError, SyntaxError, TypeError):
        return address
    return f"{host}:{port}"
