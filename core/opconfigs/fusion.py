"""NNFusion's element-wise kernel fusion, replayed on a model of the compiler's graph: which element-wise nodes
become part of a kernel of NNFusion's own (ElementWiseFused), so that the compiler never looks them up in the DB.

Facts from NNFusion's KernelFusionPass (src/nnfusion/engine/pass/graph/kernel_fusion_pass.cpp, main branch),
checked against the real compiler by tests/test_nnfusion_compiler.py:

- The pass walks the graph in waves: every node whose inputs are all done and that is not element-wise is run
  at once (a FIFO queue, from the graph's sources in its reverse-DFS order); then the element-wise nodes that
  became ready (ElementwiseArithmetic ops, and Reshapes that neither transpose nor resize) are taken
  last-in-first-out, each one's element-wise consumers right after it, cut into a new group whenever the
  output size changes. The groups of one wave stay together only when the wave held more than one node.
- Level 2 and up: Reshapes that feed no element-wise op of their group leave it; a Broadcast that is inner or
  outer (its broadcast axes all lead or all trail) joins the group of the element-wise node it feeds.
- Level 3 and up: each group is split into its connected parts (a node joins the parts of the inputs seen
  before it); a part of one node is left alone.
- Every group (part) of two or more nodes becomes one ElementWiseFused kernel: its nodes are never looked up.
  Level 0 fuses nothing.

Comparisons, logical ops, Select and Convert are not ElementwiseArithmetic: they are never fused. Softmax is,
and the pass keeps it out by name (it is modelled as OTHER).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

# Kinds of graph nodes, as the pass tells them apart.
SOURCE = "source"  # a Parameter or Constant: no inputs
ELEMENTWISE = "elementwise"  # an ElementwiseArithmetic op
RESHAPE = "reshape"  # a Reshape that neither transposes nor changes the size: element-wise to the pass
BROADCAST = "broadcast"
OTHER = "other"


@dataclass(frozen=True)
class GraphNode:
    name: str
    kind: str
    size: int = 0  # elements of its output
    inputs: tuple[str, ...] = ()  # the producing node of each input slot
    fusible: bool = False  # a broadcast that is inner or outer (it may join its consumer's group)


def broadcast_fusible(shape: list[int], axes: Iterable[int]) -> bool:
    """NNFusion's Broadcast::inner_or_outer_broadcast: the broadcast axes (dims of 1 aside) all lead or all
    trail the output shape."""
    axes = set(axes)
    leading: set[int] = set()
    ones = 0
    for i, dim in enumerate(shape):
        if i not in axes and dim != 1:
            break
        leading.add(i)
        ones += dim == 1
    if len(leading) == len(axes) + ones:
        return True
    trailing = 0
    for i in range(len(shape) - 1, -1, -1):
        if i in axes:
            trailing += 1
        elif shape[i] != 1:
            break
    return trailing == len(axes)


def substitute(nodes: list[GraphNode], patterns: Iterable[tuple[str, ...]]) -> list[GraphNode]:
    """The graph after pattern substitution: each pattern's nodes (first the convolution) become one node
    (Matched_Pattern, which is no element-wise op), fed by the inputs the pattern takes from outside."""
    into: dict[str, str] = {}
    for members in patterns:
        into.update((m, members[0]) for m in members)
    out: list[GraphNode] = []
    merged: dict[str, list[str]] = {}
    for node in nodes:
        head = into.get(node.name)
        inputs = [into.get(i, i) for i in node.inputs]
        if head is None:
            out.append(GraphNode(node.name, node.kind, node.size, tuple(inputs), node.fusible))
            continue
        merged.setdefault(head, []).extend(i for i in inputs if i != head)
        if node.name == head:
            out.append(GraphNode(head, OTHER))
    return [GraphNode(n.name, OTHER, n.size, tuple(dict.fromkeys(merged[n.name]))) if n.name in merged else n
            for n in out]


def fused_nodes(nodes: list[GraphNode], outputs: list[str], level: int) -> set[str]:
    """Names of the element-wise nodes NNFusion fuses into kernels of its own at -fkernel_fusion_level=level."""
    if level <= 0:
        return set()
    by_name = {n.name: n for n in nodes}
    order = _reverse_dfs_order(by_name, outputs)
    live = set(order)
    consumers: dict[str, list[str]] = {n: [] for n in order}
    for name in order:
        for i in by_name[name].inputs:
            if i in consumers:
                consumers[i].append(name)
    groups = _waves(by_name, order, consumers)
    fused: set[str] = set()
    for wave in groups:
        for group in wave:
            if level >= 2:
                group = _reshapes_and_broadcasts(by_name, group, live)
            parts = _connected_parts(by_name, group) if level >= 3 else [group]
            for part in parts:
                if len(part) > 1:
                    fused.update(n for n in part if isinstance(n, str) and by_name[n].kind == ELEMENTWISE)
    return fused


def _reverse_dfs_order(by_name: dict[str, GraphNode], outputs: list[str]) -> list[str]:
    """Graph::get_ordered_ops: a DFS from the outputs (the last pushed input first), each node after its inputs."""
    stack: list[tuple[str, bool]] = [(o, False) for o in outputs if o in by_name]
    seen: set[str] = set()
    order: list[str] = []
    while stack:
        name, leaving = stack.pop()
        if leaving:
            order.append(name)
            continue
        if name in seen:
            continue
        seen.add(name)
        stack.append((name, True))
        stack.extend((i, False) for i in by_name[name].inputs if i in by_name and i not in seen)
    return order


def _waves(by_name: dict[str, GraphNode], order: list[str],
           consumers: dict[str, list[str]]) -> list[list[list[str]]]:
    """ExtractFusionGroups: per wave of element-wise nodes, its groups (by output size), kept when the wave
    held more than one node."""
    ready: deque[str] = deque(n for n in order if not by_name[n].inputs)
    elem_ready: deque[str] = deque()
    done_inputs: dict[str, int] = dict.fromkeys(order, 0)
    visited: set[str] = set()
    waves: list[list[list[str]]] = []

    def finish(name: str) -> None:
        visited.add(name)
        for c in consumers[name]:
            done_inputs[c] += 1
            if c not in visited and done_inputs[c] >= len(by_name[c].inputs):
                if by_name[c].kind in (ELEMENTWISE, RESHAPE):
                    elem_ready.appendleft(c)
                else:
                    ready.append(c)

    while ready or elem_ready:
        while ready:
            finish(ready.popleft())
        wave: list[list[str]] = []
        group: list[str] = []
        size = None
        while elem_ready:
            name = elem_ready.popleft()
            if group and by_name[name].size != size:
                wave.append(group)
                group = []
            group.append(name)
            size = by_name[name].size
            finish(name)
        if group:
            wave.append(group)
        if sum(len(g) for g in wave) > 1:
            waves.append(wave)
    return waves


# A broadcast joined to a group, as the pass makes it: the broadcast (duplicated per consumer when it has several)
# feeding one element-wise node.
BroadcastCopy = tuple[str, str]  # (broadcast, consumer)


def _reshapes_and_broadcasts(by_name: dict[str, GraphNode], group: list[str],
                             live: set[str]) -> list[str | BroadcastCopy]:
    """FuseReshapeAndBroadcast: keep the element-wise nodes and the reshapes on their input paths; put the inner
    and outer broadcasts that feed them in front."""
    kept: set[str] = set()
    for name in group:
        if by_name[name].kind != ELEMENTWISE:
            continue
        kept.add(name)
        for i in by_name[name].inputs:
            while i in by_name and by_name[i].kind == RESHAPE:
                kept.add(i)
                i = by_name[i].inputs[0] if by_name[i].inputs else ""
    members: list[str | BroadcastCopy] = [n for n in group if n in kept]
    copies: list[str | BroadcastCopy] = []
    for name in members:
        assert isinstance(name, str)
        for i in by_name[name].inputs:
            if i in live and by_name[i].kind == BROADCAST and by_name[i].fusible:
                copies.append((i, name))
    return copies + members


def _connected_parts(by_name: dict[str, GraphNode],
                     group: list[str | BroadcastCopy]) -> list[list[str | BroadcastCopy]]:
    """SplitIndependentGroups: a node joins (and merges) the parts of those of its inputs seen before it."""
    part_of: dict[str, int] = {}  # node, or "broadcast->consumer" for a copy -> part id
    parts: dict[int, list[str | BroadcastCopy]] = {}
    for number, member in enumerate(group):
        if isinstance(member, tuple):
            bc, consumer = member
            key, inputs = f"{bc}->{consumer}", by_name[bc].inputs
        else:
            key = member
            inputs = tuple(f"{i}->{member}" if i in by_name and by_name[i].kind == BROADCAST else i
                           for i in by_name[member].inputs)
        joined: int | None = None
        for i in inputs:
            if i in part_of:
                if joined is None:
                    joined = part_of[i]
                elif part_of[i] != joined:
                    other = part_of[i]
                    parts[joined].extend(parts.pop(other))
                    for k, v in part_of.items():
                        if v == other:
                            part_of[k] = joined
        if joined is None:
            joined = number
            parts[joined] = []
        parts[joined].append(member)
        part_of[key] = joined
    return list(parts.values())
