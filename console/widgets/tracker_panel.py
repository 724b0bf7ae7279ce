"""The RPC tracker as the Tuning view shows it: its address and key, whether it answers, its servers and queue."""

from __future__ import annotations

import ast

from textual.markup import escape
from textual.widgets import Static

from core.tuning.rpc import TrackerStatus

SERVERS_SHOWN = 4


class TrackerPanel(Static):
    """Attributes down: the owner calls show() with the settings' tracker and the last status read (None: not yet)."""

    def show(self, address: str, key: str, status: TrackerStatus | None) -> None:
        self.update("\n".join(tracker_lines(address, key, status)))


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
