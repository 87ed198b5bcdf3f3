"""The host agent: one per node, a Ray actor pinned to that node by a custom resource (``stasis-node-NAME``),
that owns the node's stasis daemon: its own home (and so its runsc root, network namespaces and ports), on
loopback TCP with the fleet's token. The daemon dies with the agent (a host's loss takes both); sandboxes
the daemon ran are ended with it only when the agent is stopped on purpose (:meth:`NodeAgent.stop`)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from ..errors import StasisError

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
READY_TIMEOUT = 120.0  # seconds a node's daemon may take to answer (recovery of what it had runs first)
STOP_TIMEOUT = 60.0
LEAVE_ROUNDS = 5  # of pushes, until one finds nothing new
NAMESPACE = "stasis"  # Ray's namespace of the fleet's named actors
AGENT_CONCURRENCY = 8  # calls an agent serves at once: a describe answers while a leave runs for minutes
AGENT_PREFIX = "stasis-node-"  # an agent's actor name and the custom resource that pins it: this + node name


def resource_of(node: str) -> str:
    return AGENT_PREFIX + node


def _die_with_parent() -> None:
    """In the daemon, before exec: SIGKILL when the agent that started it dies (a host's loss takes both)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def listening_socket(host: str) -> socket.socket:
    """A port held from the start and handed to the daemon (``--tcp fd:N``): no other process can take it between
    a choice and a bind, and so none can be sent the fleet's token. ``host`` is the node's address in the Ray
    cluster: loopback on one machine, the host's address on the cluster's network on several."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.bind((host, 0))
    sock.listen(128)
    return sock


class NodeAgent:
    """Made by Ray as an actor (``ray.remote(NodeAgent)``); every method runs in the actor's process."""

    def __init__(self, node: str, home: str, token: str, env: dict[str, str] | None = None) -> None:
        self.node, self.home, self.token = node, Path(home), token
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        import ray

        host = ray.util.get_node_ip_address()
        sock = listening_socket(host)
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{sock.getsockname()[1]}"
        # Ray's token stays with Ray: nothing the daemon starts (runsc, QEMU) sees it
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "STASIS_FLEET", "STASIS_URL"))}
        ours = {"STASIS_HOME": str(self.home), "STASIS_TOKEN": token, "STASIS_NODE": node}
        daemon_env = {**inherited, **(env or {}), **ours}
        with sock, open(self.home / "daemon-fleet.log", "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "stasis", "serve", "--tcp", f"fd:{sock.fileno()}"], pass_fds=(sock.fileno(),),
                env=daemon_env, stdout=out, stderr=out, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
            )  # fmt: skip
        self.state = "up"  # then "leaving" and "left" (`stasis fleet leave`): no new sandbox is placed here
        self.http = httpx.Client(base_url=self.url, headers={"authorization": f"Bearer {token}"}, timeout=60,
                                 trust_env=False)  # fmt: skip
        self._wait_ready()
        log.info("node %s: daemon pid %d on %s", node, self.process.pid, self.url)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise StasisError(f"node {self.node}: its daemon exited with {self.process.returncode}; see "
                                  f"{self.home / 'daemon-fleet.log'}")  # fmt: skip
            try:
                self.http.get("/v1/health", timeout=5).raise_for_status()
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise StasisError(f"node {self.node}: its daemon did not answer in {READY_TIMEOUT:.0f} s") from None
                time.sleep(0.1)

    def describe(self) -> dict[str, Any]:
        """The node as the front door places by: where its daemon answers, what it holds, what is left."""
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        if self.state == "left":  # its daemon stopped: nothing here to place on or route to
            return {"name": self.node, "url": None, "pid": None, "ray_node_id": node_id, "sandboxes": 0, "running": 0,
                    "cpus": 0.0, "memory_mb": 0, "free_cpus": 0.0, "free_memory_mb": 0, "state": "left"}  # fmt: skip
        resources = next((n["Resources"] for n in ray.nodes() if n["NodeID"] == node_id), {})
        sandboxes = self.http.get("/v1/sandboxes").json()
        live = [s for s in sandboxes if s["status"] in ("running", "pending", "resuming", "snapshotting")]
        cpus, memory_mb = float(resources.get("CPU", 0.0)), int(resources.get("memory", 0)) >> 20
        used_cpus = sum(s["spec"]["cpus"] for s in live)
        used_mb = sum(s["spec"]["memory_mb"] for s in live)
        return {
            "name": self.node, "url": self.url, "pid": self.process.pid, "ray_node_id": node_id,
            "sandboxes": len(sandboxes), "running": len(live), "cpus": cpus, "memory_mb": memory_mb,
            "free_cpus": cpus - used_cpus, "free_memory_mb": memory_mb - used_mb, "state": self.state,
        }  # fmt: skip

    def current_state(self) -> str:
        return self.state

    def leave(self) -> dict[str, Any]:
        """Leave on purpose, losing nothing: every checkpoint pushed to the fleet's store, every sandbox
        suspended and handed to it (memory and processes kept: any request brings it back on a live node), again
        until a round finds nothing new (a fork or checkpoint made meanwhile), then the daemon stopped with only
        a pool's spares removed. If anything could not be handed over, the node stays up and says what."""
        self.state = "leaving"
        kept: dict[str, str] = {}
        handed: list[str] = []
        pushed: set[str] = set()
        for _ in range(LEAVE_ROUNDS):
            checkpoints = [c["id"] for c in self.http.get("/v1/checkpoints").json() if c["id"] not in pushed]
            sandboxes = [s for s in self.http.get("/v1/sandboxes").json()
                         if s.get("pool") is None and s["status"] != "failed"]  # fmt: skip
            if not checkpoints and not sandboxes:
                break
            for ref, kind in [*((c, "checkpoint") for c in checkpoints), *((s["id"], "sandbox") for s in sandboxes)]:
                if error := self._push(kind, ref):
                    kept[ref] = error
                elif kind == "sandbox":
                    handed.append(next(s["name"] or s["id"] for s in sandboxes if s["id"] == ref))
                pushed.add(ref)
            if kept:
                self.state = "up"
                return {"left": False, "handed": handed, "kept": kept}
        else:
            self.state = "up"
            return {"left": False, "handed": handed, "kept": {"-": f"still busy after {LEAVE_ROUNDS} rounds"}}
        for spare in self.http.get("/v1/sandboxes").json():  # a pool's: made again on a live node, never moved
            with contextlib.suppress(httpx.HTTPError):
                self.http.delete(f"/v1/sandboxes/{spare['id']}", timeout=STOP_TIMEOUT)
        self._stop_daemon()
        self.state = "left"
        return {"left": True, "handed": handed, "checkpoints": len(pushed) - len(handed), "kept": {}}

    def _push(self, kind: str, ref: str) -> str | None:
        """None once the store has it, else why not."""
        try:
            answer = self.http.post("/v1/remote/push", json={"ref": ref, "kind": kind}, timeout=STOP_TIMEOUT * 10)
        except httpx.HTTPError as exc:
            return str(exc)
        return None if answer.is_success else answer.text[:300]

    def stop(self) -> int:
        """Leave on purpose: every sandbox of this node removed, then its daemon stopped. The count removed."""
        if self.process.poll() is not None:
            return 0
        removed = 0
        for sandbox in self.http.get("/v1/sandboxes").json():
            try:
                self.http.delete(f"/v1/sandboxes/{sandbox['id']}", timeout=STOP_TIMEOUT).raise_for_status()
                removed += 1
            except httpx.HTTPError as exc:
                log.warning("node %s: removing %s failed: %s", self.node, sandbox["id"], exc)
        self._stop_daemon()
        return removed

    def _stop_daemon(self) -> None:
        self.http.close()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
