"""The fleet's nodes as the front door sees them: found through Ray (each node's agent is a named actor), each
described on demand, and which node holds which sandbox or checkpoint (a cache: the nodes' own daemons are
the truth, asked again whenever the cache does not answer)."""

from __future__ import annotations

import asyncio
import collections
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from ..errors import CheckpointNotFound, InvalidRequest, SandboxNotFound, StasisError
from .agent import AGENT_PREFIX, NAMESPACE
from .placement import place

log = logging.getLogger(__name__)

DESCRIBE_TIMEOUT = 30.0
FORWARD_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=None, pool=None)  # a run may take as long as it takes


REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")  # a name, an id, one segment of an API path
REMEMBERED = 100_000  # ids and names whose node the door keeps in mind (the oldest go first)


def checked(ref: str) -> str:
    """``ref`` if it can only be one path segment of a node's API (no dot segments, slashes, escapes)."""
    if not REF.fullmatch(ref) or ".." in ref:
        raise InvalidRequest(f"{ref[:80]!r} is not a sandbox's or checkpoint's name or id")
    return ref


def node_path(kind: str, ref: str, rest: str) -> str:
    """A node's API path rebuilt from checked segments: a request about one sandbox never reaches another endpoint."""
    segments = [checked(ref), *(checked(part) for part in rest.split("/") if rest)]
    return f"/v1/{kind}/" + "/".join(segments)


class SandboxLost(StasisError):
    status_code = 410  # Gone: it was, and will not be again


class Nodes:
    def __init__(self, token: str) -> None:
        self.token = token
        self._agents: dict[str, Any] = {}  # node name -> its agent's actor handle
        self._described: dict[str, dict[str, Any]] = {}  # node name -> its last description
        self._clients: dict[str, httpx.AsyncClient] = {}  # node url -> a client of its daemon
        self._where: collections.OrderedDict[str, str] = collections.OrderedDict()  # id or name -> node name
        self.on_join: Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]] | None = None  # (new, from)
        self._welcomed: set[str] = set()
        self._welcoming = asyncio.Lock()

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()

    # ------------------------------------------------------------ the nodes

    def _find_agents(self) -> dict[str, Any]:
        import ray

        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a.get("namespace") == NAMESPACE and a["name"].startswith(AGENT_PREFIX)]  # fmt: skip
        return {name.removeprefix(AGENT_PREFIX): ray.get_actor(name, namespace=NAMESPACE) for name in names}

    async def describe(self) -> list[dict[str, Any]]:
        """Every node the fleet has known, live ones described now; a node whose agent does not answer is
        ``lost`` (its host is gone, or Ray says its actor died)."""
        self._agents |= await asyncio.to_thread(self._find_agents)
        names = sorted(self._agents)
        answers = await asyncio.gather(*(self._describe(name) for name in names), return_exceptions=True)
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, BaseException):
                previous = self._described.get(name, {"name": name, "url": None, "sandboxes": 0})
                if previous.get("state") in ("leaving", "left"):  # it left on purpose: gone, and nothing lost
                    self._described[name] = {**previous, "state": "left", "sandboxes": 0, "running": 0}
                    continue
                log.warning("node %s does not answer: %s", name, answer)
                self._described[name] = {**previous, "state": "lost", "error": str(answer)[:200]}
            else:
                self._described[name] = answer
        self._welcomed -= {name for name in names if self._described[name]["state"] != "up"}  # welcomed again
        await self._welcome([self._described[name] for name in names if self._described[name]["state"] == "up"])
        return [self._described[name] for name in names]

    async def _welcome(self, up: list[dict[str, Any]]) -> None:
        """Give each node seen up for the first time what the fleet has (its teams and keys), from one that has."""
        if self.on_join is None or all(node["name"] in self._welcomed for node in up):
            return
        async with self._welcoming:
            reference = next((n for n in up if n["name"] in self._welcomed), up[0])
            self._welcomed.add(reference["name"])
            for node in up:
                if node["name"] in self._welcomed:
                    continue
                try:
                    await self.on_join(node, reference)
                except Exception as exc:  # tried again at the next look
                    log.warning("could not give node %s the fleet's teams and keys: %s", node["name"], exc)
                    continue
                self._welcomed.add(node["name"])

    async def _describe(self, name: str) -> dict[str, Any]:
        return await asyncio.wait_for(self._agents[name].describe.remote(), DESCRIBE_TIMEOUT)  # type: ignore[no-any-return]

    async def live(self) -> list[dict[str, Any]]:
        """The nodes new sandboxes may go to."""
        return [n for n in await self.describe() if n["state"] == "up"]

    async def reachable(self) -> list[dict[str, Any]]:
        """The nodes whose sandboxes answer: live ones, and those leaving (until each sandbox is handed over)."""
        return [n for n in await self.describe() if n["state"] in ("up", "leaving")]

    def agent(self, name: str) -> Any:
        return self._agents[name]

    def client(self, node: dict[str, Any]) -> httpx.AsyncClient:
        url = node["url"]
        if url not in self._clients:
            headers = {"authorization": f"Bearer {self.token}"}
            self._clients[url] = httpx.AsyncClient(
                base_url=url, headers=headers, timeout=FORWARD_TIMEOUT, trust_env=False,  # no proxy sees the token
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),  # long runs starve nothing
            )  # fmt: skip
        return self._clients[url]

    def known(self) -> dict[str, dict[str, Any]]:
        """The last description of each node, live or not (no call to any of them)."""
        return dict(self._described)

    # ------------------------------------------------------------ what is where

    def remember(self, node: str, *refs: str | None) -> None:
        for ref in refs:
            if ref:
                self._where[ref] = node
                self._where.move_to_end(ref)
        while len(self._where) > REMEMBERED:
            self._where.popitem(last=False)

    def remembered(self) -> list[str]:
        """The refs the door knows the node of (newest last), for what must find its sandbox among them."""
        return list(self._where)

    def cached(self, ref: str) -> dict[str, Any] | None:
        """The live node the cache says holds ``ref`` (unchecked: a 404 from it sends the door asking all)."""
        node = self._described.get(self._where.get(ref, ""))
        return node if node is not None and node["state"] in ("up", "leaving") else None

    def mark_lost(self, node: dict[str, Any], why: str) -> None:
        """A node whose daemon stopped answering is lost until its agent describes it again."""
        log.warning("node %s does not answer: %s", node["name"], why)
        self._described[node["name"]] = {**node, "state": "lost", "error": why[:200]}

    def mark(self, name: str, state: str) -> None:
        """A node ``leaving`` (no creates go there; its sandboxes still answer) or ``left`` (it handed everything
        to the store and stopped: gone, nothing lost)."""
        gone = {"url": None, "sandboxes": 0, "running": 0} if state == "left" else {}
        self._described[name] = {**self._described[name], "state": state, **gone}

    def last_seen_on(self, ref: str) -> dict[str, Any] | None:
        """The node the cache last saw ``ref`` on, live or lost."""
        return self._described.get(self._where.get(ref, ""))

    def forget(self, *refs: str | None) -> None:
        for ref in refs:
            if ref:
                self._where.pop(ref, None)

    async def holder(self, kind: str, ref: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
        """The live node holding the sandbox (``kind`` "sandboxes") or checkpoint ("checkpoints") ``ref``: the
        cached one if it still has it, else the one of all live nodes that does (``headers``: a team key's, asked
        with: another team's is held nowhere)."""
        checked(ref)
        if not self._described:
            await self.describe()
        cached = self._described.get(self._where.get(ref, ""))
        if (
            cached is not None
            and cached["state"] in ("up", "leaving")
            and await self._holds(cached, kind, ref, headers)
        ):
            return cached
        nodes = await self.reachable()
        holds = await asyncio.gather(*(self._holds(n, kind, ref, headers) for n in nodes))
        for node, held in zip(nodes, holds, strict=True):
            if held:
                self.remember(node["name"], ref)
                return node
        missing = SandboxNotFound if kind == "sandboxes" else CheckpointNotFound
        raise missing(f"no {kind[:-1]} named or with id {ref[:80]!r} on any live node of the fleet; "
                      f"`stasis {'ls' if kind == 'sandboxes' else 'checkpoints'}` lists them")  # fmt: skip

    async def found(self, kind: str, ref: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
        """The live node holding ``ref``; for a sandbox no live node holds, one that takes it back from the store
        (a sandbox whose node was lost after it went there idle), or a clear word that it is lost with its node.
        ``headers``: a team key's, which the take-back is asked with (a key never pulls from the store)."""
        try:
            return await self.holder(kind, checked(ref), headers)
        except SandboxNotFound:
            if kind != "sandboxes":
                raise
            was_on = self.last_seen_on(ref)
        target = place(await self.live())
        answer = await self.client(target).post(f"/v1/sandboxes/{ref}/resume", headers=headers)
        if answer.is_success:
            revived = answer.json()
            self.remember(target["name"], ref, revived["id"], revived.get("name"))
            log.info("sandbox %s came back from the store on node %s", ref, target["name"])
            return target
        if was_on is not None and was_on["state"] == "lost" and answer.status_code == 404:
            raise SandboxLost(
                f"sandbox {ref[:80]!r} was on node {was_on['name']}, which was lost, and nothing of it was saved in "
                "the fleet's store (it was running: never idle-suspended, pushed or checkpointed there); it is gone",
                node=was_on["name"],
            )
        raise SandboxNotFound(f"no sandbox named or with id {ref[:80]!r} on any live node or in the fleet's store; "
                              "`stasis ls` lists them")  # fmt: skip

    async def _holds(self, node: dict[str, Any], kind: str, ref: str, headers: dict[str, str] | None = None) -> bool:
        try:
            answer = await self.client(node).get(f"/v1/{kind}/{ref}", timeout=DESCRIBE_TIMEOUT, headers=headers)
        except httpx.HTTPError:
            return False
        if answer.status_code == 200 and kind == "sandboxes":
            return answer.json().get("status") != "terminated"
        return answer.status_code == 200
