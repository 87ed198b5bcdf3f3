"""Forks over the fleet (rollouts): a live fork of a sandbox, or N sandboxes from one checkpoint, spread over the
nodes. The checkpoint goes through the fleet's store once to each node that gets children, and each node makes
its share in one call (its daemon's own all-or-none fork of a checkpoint); if any share fails, every child made
is removed. And the rollouts' end: many sandboxes removed in one call, each node removing its own."""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..errors import CheckpointNotFound, InvalidRequest, SandboxNotFound, StasisError
from ..models import ForkRequest, RemoveRequest, build
from . import quotas
from .nodes import Nodes, SandboxLost
from .placement import place
from .requests import small_json as _small_json
from .tenants import as_caller, key_of, not_found

log = logging.getLogger(__name__)
LOOKUPS_AT_ONCE = 16  # of a bulk removal: each asks every node


class ForkFailed(StasisError):
    status_code = 502


def spread(nodes: list[dict[str, Any]], times: int, cpus: float, memory_mb: int) -> dict[str, int]:
    """How many children each node gets: one placement per child, each counting the ones placed before it."""
    room = {n["name"]: dict(n) for n in nodes}
    plan: collections.Counter[str] = collections.Counter()
    for _ in range(times):
        chosen = place(list(room.values()))
        plan[chosen["name"]] += 1
        chosen["free_cpus"] -= cpus
        chosen["free_memory_mb"] -= memory_mb
        chosen["sandboxes"] += 1
    return dict(plan)


def fork_routes(app: FastAPI, nodes: Nodes) -> None:
    @app.post("/v1/sandboxes/{ref}/fork", status_code=201)
    async def fork_sandbox(ref: str, request: Request) -> JSONResponse:
        """A live fork: a MEMORY checkpoint of this instant on its node, its children spread, the checkpoint gone."""
        times = build(ForkRequest, **(await _small_json(request) or {})).times
        source = await found(nodes, request, "sandboxes", ref)
        taken = await nodes.client(source).post(
            f"/v1/sandboxes/{ref}/checkpoints", json={"type": "memory", "metadata": {"fleet_fork_of": ref}},
            headers=as_caller(request),
        )  # fmt: skip
        if not taken.is_success:
            return JSONResponse(taken.json(), status_code=taken.status_code)
        checkpoint = taken.json()
        try:
            async with quotas.admitted(nodes, request, forking=(checkpoint["spec"], times)):
                return JSONResponse(await _fork(nodes, request, source, checkpoint, times), status_code=201)
        finally:
            await _drop(nodes, checkpoint["id"])

    @app.post("/v1/sandboxes/remove")
    async def remove_many(request: Request) -> JSONResponse:
        """Many sandboxes (a rollout's forks) in one call: each node removes its own, all nodes at once."""
        body = await _small_json(request)
        if not isinstance(body, dict):
            raise InvalidRequest('give {"refs": [NAME-OR-ID, ...]}')
        refs = list(dict.fromkeys(build(RemoveRequest, **body).refs))
        looking = asyncio.Semaphore(LOOKUPS_AT_ONCE)

        async def holder(ref: str) -> dict[str, Any]:
            async with looking:  # where each is now: a removal brings nothing back from the store first
                return await nodes.holder("sandboxes", ref, as_caller(request) or None)

        where = await asyncio.gather(*(holder(ref) for ref in refs), return_exceptions=True)
        failed = {ref: str(node) for ref, node in zip(refs, where, strict=True) if isinstance(node, BaseException)}
        per_node: dict[str, list[str]] = {}
        by_name: dict[str, dict[str, Any]] = {}
        for ref, node in zip(refs, where, strict=True):
            if isinstance(node, dict):
                per_node.setdefault(node["name"], []).append(ref)
                by_name[node["name"]] = node
        answers = await asyncio.gather(*(_call(nodes, by_name[name], "/v1/sandboxes/remove", {"refs": mine},
                                               as_caller(request)) for name, mine in per_node.items()),
                                       return_exceptions=True)  # fmt: skip
        removed: list[str] = []
        for (name, mine), answer in zip(per_node.items(), answers, strict=True):
            if isinstance(answer, BaseException):
                failed |= {ref: f"node {name}: {answer}" for ref in mine}
            else:
                removed += answer["removed"]
                failed |= answer["failed"]
        nodes.forget(*refs, *removed)
        return JSONResponse({"removed": removed, "failed": failed})

    @app.post("/v1/checkpoints/{ref}/fork", status_code=201)
    async def fork_checkpoint(ref: str, request: Request) -> JSONResponse:
        """Rollouts: ``times`` sandboxes from one checkpoint, spread over the nodes."""
        times = build(ForkRequest, **(await _small_json(request) or {})).times
        source = await found(nodes, request, "checkpoints", ref)
        checkpoint = (await nodes.client(source).get(f"/v1/checkpoints/{ref}", headers=as_caller(request))).json()
        async with quotas.admitted(nodes, request, forking=(checkpoint["spec"], times)):
            return JSONResponse(await _fork(nodes, request, source, checkpoint, times), status_code=201)


async def found(nodes: Nodes, request: Request, kind: str, ref: str) -> dict[str, Any]:
    """Its node; for a team's key, looked for with the key, and not found in the door's own words."""
    try:
        return await nodes.found(kind, ref, as_caller(request) or None)
    except (SandboxNotFound, CheckpointNotFound, SandboxLost):
        if key_of(request) is None:
            raise
        raise not_found(kind, ref) from None


async def _fork(
    nodes: Nodes, request: Request, source: dict[str, Any], checkpoint: dict[str, Any], times: int
) -> list[dict[str, Any]]:
    """``times`` children of ``checkpoint`` over the nodes: the checkpoint carried through the store (the fleet's
    own doing), each node's share made as the caller (a team key's children are its team's, checked there)."""
    spec = checkpoint["spec"]
    plan = spread(await nodes.live(), times, spec["cpus"], spec["memory_mb"])
    by_name = {n["name"]: n for n in await nodes.live()}
    elsewhere = [name for name in plan if name != source["name"]]
    if elsewhere:  # to the store once, then into each node that makes children (a node's creates then find it)
        handed = {"ref": checkpoint["id"], "kind": "checkpoint"}
        await _call(nodes, source, "/v1/remote/push", handed)
        await asyncio.gather(*(_call(nodes, by_name[name], "/v1/remote/pull", handed) for name in elsewhere))
    shares = await asyncio.gather(
        *(_call(nodes, by_name[name], f"/v1/checkpoints/{checkpoint['id']}/fork", {"times": count},
                as_caller(request)) for name, count in plan.items()),
        return_exceptions=True,
    )  # fmt: skip
    made = [(name, child) for name, share in zip(plan, shares, strict=True) if isinstance(share, list)
            for child in share]  # fmt: skip
    failed = [share for share in shares if isinstance(share, BaseException)]
    if failed:
        await asyncio.gather(*(nodes.client(by_name[name]).delete(f"/v1/sandboxes/{c['id']}") for name, c in made),
                             return_exceptions=True)  # fmt: skip
        raise failed[0]
    for name, child in made:
        nodes.remember(name, child["id"], child.get("name"))
    log.info("forked %s into %d sandboxes over %s", checkpoint["id"], times, dict(plan))
    return [{**child, "node": name} for name, child in made]


async def _call(
    nodes: Nodes, node: dict[str, Any], path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Any:
    answer = await nodes.client(node).post(path, json=body, headers=headers)
    if not answer.is_success:
        message = answer.json().get("message", answer.text) if answer.content else answer.reason_phrase
        raise ForkFailed(f"node {node['name']}: {path}: {message}")
    return answer.json()


async def _drop(nodes: Nodes, checkpoint_id: str) -> None:
    """A live fork's passing checkpoint, gone from every node that has it (the store keeps its copy)."""
    live = await nodes.live()
    await asyncio.gather(*(nodes.client(n).delete(f"/v1/checkpoints/{checkpoint_id}") for n in live),
                         return_exceptions=True)  # fmt: skip
