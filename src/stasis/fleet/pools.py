"""Warm pools through the fleet's door: a pool is made on every live node (or the one ``node`` names), each
node keeping ``size`` members of its own started, so a create placed on any node claims one there instead of
booting. Read back, a pool is the sum of its nodes' (``spec.size`` the fleet's total, ``nodes`` each one's)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..errors import DaemonUnavailable, InvalidRequest, NotFound, StasisError
from .nodes import Nodes, checked
from .placement import place
from .requests import small_json


def pool_routes(app: FastAPI, nodes: Nodes) -> None:
    changing = asyncio.Lock()  # one pool change at a time reaches its nodes

    @app.post("/v1/pools", status_code=201)
    async def create(request: Request) -> JSONResponse:
        body = await small_json(request)
        if not isinstance(body, dict):
            raise InvalidRequest("a pool's request is a JSON object: name, size, image, ...")
        wanted = body.pop("node", None)
        targets = [place(await nodes.live(), wanted)] if wanted else await nodes.live()
        if not targets:
            raise DaemonUnavailable("no live node in the fleet: `stasis fleet nodes` says what became of them")
        async with changing:
            made = [(node, await nodes.client(node).post("/v1/pools", json=body)) for node in targets]
        refused = [(node, answer) for node, answer in made if not answer.is_success]
        if refused:
            node, answer = refused[0]
            done = [n["name"] for n, a in made if a.is_success]
            raise StasisError(f"pool {body.get('name')!r}: node {node['name']} refused it: {answer.text[:300]}"
                              + (f"; it was made on {', '.join(done)} (remove it there, or fix and make it again)"
                                 if done else ""))  # fmt: skip
        return JSONResponse(_summed([(n["name"], a.json()) for n, a in made]), status_code=201)

    @app.get("/v1/pools")
    async def listing() -> list[dict[str, Any]]:
        per_name: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for node, pools in await _every_node(nodes, "/v1/pools"):
            for pool in pools:
                per_name.setdefault(pool["name"], []).append((node, pool))
        return [_summed(found) for _, found in sorted(per_name.items())]

    @app.get("/v1/pools/{name}")
    async def one(name: str) -> dict[str, Any]:
        return _summed(await _holding(nodes, "GET", name))

    @app.delete("/v1/pools/{name}")
    async def remove(name: str) -> dict[str, Any]:
        async with changing:
            return _summed(await _holding(nodes, "DELETE", name))


async def _every_node(nodes: Nodes, path: str) -> list[tuple[str, Any]]:
    live = await nodes.live()
    answers = await asyncio.gather(*(nodes.client(n).get(path) for n in live))
    for answer in answers:
        answer.raise_for_status()
    return [(n["name"], a.json()) for n, a in zip(live, answers, strict=True)]


async def _holding(nodes: Nodes, method: str, name: str) -> list[tuple[str, dict[str, Any]]]:
    """``method`` on pool ``name`` on every live node that has it; NotFound if none does."""
    live = await nodes.live()
    path = f"/v1/pools/{checked(name)}"
    answers = await asyncio.gather(*(nodes.client(n).request(method, path) for n in live))
    found = [(n["name"], a.json()) for n, a in zip(live, answers, strict=True) if a.status_code == 200]
    if not found:
        raise NotFound(f"no pool named {name[:80]!r} on any live node; `stasis pool ls` lists them")
    return found


def _summed(found: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One pool as the fleet has it: its nodes' counts added, each node's own under ``nodes``."""
    first = found[0][1]
    spec = {**first["spec"], "size": sum(p["spec"]["size"] for _, p in found)}
    errors = [p["last_error"] for _, p in found if p.get("last_error")]
    return {
        "name": first["name"], "spec": spec,
        "ready": sum(p["ready"] for _, p in found), "starting": sum(p["starting"] for _, p in found),
        "claimed": sum(p.get("claimed", 0) for _, p in found), "last_error": errors[0] if errors else None,
        "members": [m for _, p in found for m in p.get("members", [])],
        "nodes": {n: {"ready": p["ready"], "starting": p["starting"], "size": p["spec"]["size"]} for n, p in found},
    }  # fmt: skip
