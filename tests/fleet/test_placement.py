"""Where the front door puts a create: the roomier of K nodes drawn at random, or the node asked for."""

from __future__ import annotations

import pytest

from stasis.errors import DaemonUnavailable, InvalidRequest
from stasis.fleet.placement import place

pytestmark = pytest.mark.fast


def node(name: str, free_cpus: float, free_mb: int, sandboxes: int = 0, state: str = "up") -> dict[str, object]:
    return {"name": name, "state": state, "cpus": 4.0, "memory_mb": 8192, "free_cpus": free_cpus,
            "free_memory_mb": free_mb, "sandboxes": sandboxes}  # fmt: skip


def test_the_roomier_of_the_drawn_nodes_wins_by_its_scarcer_resource() -> None:
    nodes = [node("cpu-full", 0.5, 8000), node("roomy", 3.0, 6000)]  # 12% of CPU left against 73% of memory
    assert {place(nodes)["name"] for _ in range(20)} == {"roomy"}
    tied = [node("busy", 2.0, 4096, sandboxes=5), node("quiet", 2.0, 4096, sandboxes=1)]
    assert {place(tied)["name"] for _ in range(20)} == {"quiet"}


def test_a_lost_node_is_never_chosen_and_a_named_one_must_be_live() -> None:
    nodes = [node("gone", 4.0, 8192, state="lost"), node("here", 0.1, 100)]
    assert {place(nodes)["name"] for _ in range(20)} == {"here"}
    assert place(nodes, wanted="here")["name"] == "here"
    with pytest.raises(InvalidRequest, match=r"no live node named 'gone'.*live nodes: here"):
        place(nodes, wanted="gone")
    with pytest.raises(DaemonUnavailable, match="no live node"):
        place([node("gone", 4.0, 8192, state="lost")])


def test_best_of_k_draws_k_nodes_so_no_single_node_takes_every_create() -> None:
    nodes = [node(f"n{i}", 4.0 - i * 0.1, 8192) for i in range(8)]  # n0 the roomiest, by a little
    chosen = [place(nodes, k=2)["name"] for _ in range(400)]
    assert "n0" in chosen and len(set(chosen)) >= 4  # the roomiest often, never always
