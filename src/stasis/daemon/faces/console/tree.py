"""The checkpoint tree: which sandbox and checkpoint each sandbox and checkpoint came from."""

from __future__ import annotations

from dataclasses import dataclass, field

from ....models import CheckpointInfo, SandboxInfo


@dataclass
class Node:
    kind: str  # "sandbox" or "checkpoint"
    id: str
    label: str
    detail: str
    status: str = ""
    children: list[Node] = field(default_factory=list)


def lineage(sandboxes: list[SandboxInfo], checkpoints: list[CheckpointInfo]) -> list[Node]:
    """Roots first (sandboxes from an image, checkpoints whose sandbox is gone), each with its descendants:
    a sandbox's checkpoints and forks, a checkpoint's restores."""
    nodes: dict[str, Node] = {}
    for s in sandboxes:
        nodes[s.id] = Node("sandbox", s.id, s.name or s.id, f"{s.spec.backend}, {s.spec.image}", s.status.value)
    for c in checkpoints:
        nodes[c.id] = Node("checkpoint", c.id, c.name or c.id, f"{c.type.value}, of {c.sandbox_name or c.sandbox_id}")
    roots: list[Node] = []
    for s in sandboxes:
        parent = s.forked_from or s.from_checkpoint
        (nodes[parent].children if parent in nodes else roots).append(nodes[s.id])
    for c in checkpoints:
        (nodes[c.sandbox_id].children if c.sandbox_id in nodes else roots).append(nodes[c.id])
    return [root for root in roots if root.kind == "checkpoint" or root.children or root.status != "terminated"]
