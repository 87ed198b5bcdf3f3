"""`stasis fleet join`: this host becomes a node of a fleet: a raylet of its own in the fleet's Ray cluster (with
the custom resource that pins the node's agent here), the agent and its daemon. It stays until Ctrl-C, SIGTERM
or `stasis fleet leave NAME`; then every sandbox is handed to the fleet's store (memory and processes kept,
brought back on a live node by its next request) and all it started stops.

The raylet is started as `ray start --block` starts one (``ray._private.node.Node``, the class `ray start` and
``ray.cluster_utils`` use), in this process: it stops with this process, and only it, even with other nodes on
this machine (where `ray stop` would stop them all).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidRequest, StasisError
from .agent import AGENT_CONCURRENCY, AGENT_PREFIX, NAMESPACE, NodeAgent, resource_of
from .local import OBJECT_STORE, RAY_ENV

log = logging.getLogger(__name__)

NODE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,30}")
JOIN_TIMEOUT = 120.0  # seconds for this host's raylet to be seen by the cluster
POLL = 2.0  # seconds between looks at whether the node was asked to leave


def _loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class Join:
    address: str  # the cluster's GCS, HOST:PORT
    name: str
    home: Path
    token: str  # the fleet's: the front door sends it to this node's daemon
    store: str  # the fleet's store, which sandboxes move through and outlive their host in
    cpus: int | None = None
    images: Path | None = None
    node: Any = None  # Ray's node (its raylet and helpers, children of this process)
    agent: Any = None
    left: threading.Event = field(default_factory=threading.Event)

    def check(self) -> None:
        if not NODE_NAME.fullmatch(self.name):
            raise InvalidRequest(f"--name {self.name[:40]!r}: lower-case letters, digits and '-', 31 at most")
        host, _, port = self.address.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidRequest(f"--address {self.address[:80]!r}: give the cluster's HOST:PORT (RAY_ADDRESS)")
        if not self.store.startswith(("s3://", "file://")):
            raise InvalidRequest("a node needs the fleet's store: --store s3://BUCKET/PREFIX or file:///shared/dir")
        if not (os.environ.get("RAY_AUTH_TOKEN_PATH") or os.environ.get("RAY_AUTH_TOKEN")):
            raise InvalidRequest("the fleet's Ray takes only its token: export RAY_AUTH_TOKEN_PATH (or RAY_AUTH_TOKEN) "
                                 "as the fleet printed it")  # fmt: skip

    def start(self) -> dict[str, Any]:
        """This host's raylet, then the agent and its daemon; the node as the door describes it."""
        self.check()
        os.environ.update(RAY_ENV)
        if not _loopback(self.address):  # a real fleet: Ray picks this host's address on the cluster's network
            os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        try:
            import ray
            from ray._private.node import Node
            from ray._private.parameter import RayParams
        except ImportError:
            raise InvalidRequest("a fleet runs on Ray, which is not installed: pip install 'stasis[fleet]'") from None
        params = RayParams(
            gcs_address=self.address, num_cpus=self.cpus, num_gpus=0, resources={resource_of(self.name): 1},
            object_store_memory=OBJECT_STORE, min_worker_port=0, max_worker_port=0, node_manager_port=0,
            include_log_monitor=False, dashboard_agent_listen_port=None,
        )  # fmt: skip
        self.node = Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
        ray.init(address=self.address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
        self._wait_seen(ray)
        if self.name in {a["name"].removeprefix(AGENT_PREFIX) for a in ray.util.list_named_actors(all_namespaces=True)
                         if a.get("namespace") == NAMESPACE}:  # fmt: skip
            raise InvalidRequest(f"the fleet has a node named {self.name!r} already; choose another --name")
        env = {"STASIS_REMOTE": self.store, "STASIS_IDLE_TO_STORE": "1"}
        if self.images is not None:
            env["STASIS_IMAGE_DIR"] = str(self.images)
        self.agent = ray.remote(NodeAgent).options(  # type: ignore[attr-defined]
            name=AGENT_PREFIX + self.name, namespace=NAMESPACE, num_cpus=0,
            resources={resource_of(self.name): 0.001}, max_restarts=0, max_concurrency=AGENT_CONCURRENCY,
        ).remote(self.name, str(self.home), self.token, env)  # fmt: skip
        return ray.get(self.agent.describe.remote())  # type: ignore[no-any-return]

    def _wait_seen(self, ray: Any) -> None:
        deadline = time.monotonic() + JOIN_TIMEOUT
        resource = resource_of(self.name)
        while not any(n["Alive"] and resource in n["Resources"] for n in ray.nodes()):
            if time.monotonic() > deadline:
                raise StasisError(f"the cluster at {self.address} did not see this host's raylet in "
                                  f"{JOIN_TIMEOUT:.0f} s")  # fmt: skip
            time.sleep(0.2)

    def wait(self, stop: threading.Event) -> None:
        """Until ``stop`` is set (a signal here) or the node left through the door (`stasis fleet leave`)."""
        import ray
        from ray.exceptions import GetTimeoutError

        while not stop.wait(POLL):
            try:
                if ray.get(self.agent.current_state.remote(), timeout=60) == "left":
                    self.left.set()
                    return
            except GetTimeoutError:  # busy (a loaded host): ask again
                continue
            except Exception as exc:  # the agent is gone: its daemon died with it
                raise StasisError(f"node {self.name}: its agent is gone ({exc}); this host left the fleet") from None

    def leave(self) -> dict[str, Any]:
        """Every sandbox handed to the store, then the daemon stopped (what the door's leave does)."""
        import ray

        result: dict[str, Any] = ray.get(self.agent.leave.remote())
        if result["left"]:
            self.left.set()
        return result

    def stop(self) -> None:
        """The agent (and with it the daemon) and this host's raylet stopped; nothing of Ray's left running here."""
        import ray

        if not self.left.is_set() and self.agent is not None:
            log.warning("node %s stops without leaving: its sandboxes stay in %s; join again with the same --name "
                        "and --home to bring them back", self.name, self.home)  # fmt: skip
        if self.agent is not None:
            ray.kill(self.agent)
            self.agent = None
        if ray.is_initialized():
            ray.shutdown()
        if self.node is not None:
            self.node.kill_all_processes(check_alive=False, allow_graceful=True)
            self.node = None
