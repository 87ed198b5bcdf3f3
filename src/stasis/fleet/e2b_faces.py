"""Each node's own E2B face, as the fleet's E2B router uses them: opened on a node's daemon (on loopback, its
``/v1/e2b/serve``) the first time a request needs that node, and held open (its stream) for as long as the
router lives. Every node's face has the same API key, the fleet's token, so a sandbox's envd and traffic tokens
(derived from it) are the same on whichever node it runs."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

import httpx

from ..errors import DaemonUnavailable
from .nodes import FORWARD_TIMEOUT, Nodes

log = logging.getLogger(__name__)


@dataclass
class Face:
    url: str  # where the node's E2B listener answers
    daemon: str  # the node's daemon it belongs to (a node that came back has a new one)
    stream: httpx.Response  # the listener lives as long as this stream is open
    held: asyncio.Task[None]
    client: httpx.AsyncClient


class NodeFaces:
    def __init__(self, nodes: Nodes, ask: dict[str, Any]) -> None:
        self.nodes, self.ask = nodes, ask
        self._faces: dict[str, Face] = {}
        self._opening: dict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)

    async def client(self, node: dict[str, Any]) -> httpx.AsyncClient:
        """A client of ``node``'s E2B face, opened first if it is not (or no longer) open."""
        async with self._opening[node["name"]]:
            face = self._faces.get(node["name"])
            if face is not None and not face.held.done() and face.daemon == node["url"]:
                return face.client
            if face is not None:
                await self._close(node["name"])
            face = await self._open(node)
            self._faces[node["name"]] = face
            return face.client

    async def _open(self, node: dict[str, Any]) -> Face:
        await asyncio.to_thread(_e2b_images, node["url"], self.nodes.token, self.ask.get("backend", "gvisor"))
        daemon = self.nodes.client(node)
        host = httpx.URL(node["url"]).host  # where the door reaches the node's daemon reaches its face too
        ask = {**self.ask, "listen": f"[{host}]:0" if ":" in host else f"{host}:0"}
        stream = await daemon.send(daemon.build_request("POST", "/v1/e2b/serve", json=ask), stream=True)
        lines = stream.aiter_lines()
        try:
            first = json.loads(await anext(lines)) if stream.is_success else None
            url = str(first["listening"]) if isinstance(first, dict) else None
        except (StopAsyncIteration, ValueError, KeyError, httpx.HTTPError):
            url = None
        if url is None:
            await stream.aclose()
            raise DaemonUnavailable(f"node {node['name']} did not open its E2B face (HTTP {stream.status_code}); "
                                    "its daemon's log says why")  # fmt: skip
        log.info("node %s: its E2B face is on %s", node["name"], url)
        client = httpx.AsyncClient(base_url=url, timeout=FORWARD_TIMEOUT, trust_env=False,
                                   limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))  # fmt: skip
        return Face(url, node["url"], stream, asyncio.create_task(_hold(lines)), client)

    async def _close(self, name: str) -> None:
        face = self._faces.pop(name)
        face.held.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await face.held
        with contextlib.suppress(httpx.HTTPError):
            await face.stream.aclose()
        await face.client.aclose()

    async def close(self) -> None:
        for name in list(self._faces):
            await self._close(name)


async def _hold(lines: Any) -> None:
    """Read the listener's heartbeats until its stream ends (the node's daemon went away)."""
    with contextlib.suppress(httpx.HTTPError):
        async for _ in lines:
            pass


def _e2b_images(url: str, token: str, backend: str) -> None:
    """E2B's templates' images and code-interpreter-v1's warm template on the node (made there once, as
    `stasis e2b serve` makes them on one host)."""
    from ..sdk import Client
    from ..sdk.e2b import base_image, code_template

    client = Client(url=url, token=token)
    try:
        base_image(client)
        code_template(backend, client)
    finally:
        client.close()
