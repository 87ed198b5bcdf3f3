"""`stasis fleet local`: a real Ray cluster on this machine (a head and N nodes, each its own raylet with its
own resources, ``ray.cluster_utils.Cluster``), a host agent and a daemon per node, and the front door,
until Ctrl-C or SIGTERM; then every sandbox it made is removed and everything it started is stopped.

Ray's address is an authority (whoever reaches the dashboard's Jobs API runs code), so this fleet binds
Ray to loopback only, keeps the dashboard off and turns Ray's token authentication on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from .. import mountns
from ..errors import InvalidRequest, Unsupported
from ..fsutil import atomic_write
from ..network.engine import NetworkEngine
from ..paths import Paths
from .agent import AGENT_CONCURRENCY, AGENT_PREFIX, NAMESPACE, NodeAgent, resource_of
from .door import create_door
from .nodes import Nodes

log = logging.getLogger(__name__)

OBJECT_STORE = 80 << 20  # bytes per node: the fleet passes no large objects through Ray
RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # one machine: every Ray address on loopback, never the host's
    "RAY_AUTH_MODE": "token",
    "RAY_USAGE_STATS_ENABLED": "0",
}


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: the fleet stops on its signals, then cleans up."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return contextlib.nullcontext()


@dataclass
class LocalFleet:
    home: Path
    images: Path  # one machine: every node's daemon uses this machine's images
    nodes: int = 2
    cpus_per_node: int = 1
    store: str | None = None  # the fleet's store; default a directory in its home (one machine)
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    cluster: Any = None
    ray_nodes: dict[str, Any] = field(default_factory=dict)  # node name -> cluster_utils' node handle
    agents: dict[str, Any] = field(default_factory=dict)  # node name -> agent actor

    @property
    def ray_token_path(self) -> Path:
        return self.home / "ray-token"

    def start(self) -> None:
        """The cluster, then an agent (and its daemon) per node; returns once every daemon answers."""
        if not 1 <= self.nodes <= 16:
            raise InvalidRequest(f"--nodes must be 1 to 16 on one machine, got {self.nodes}")
        private_home(self.home)
        ray_token = secrets.token_hex(32)
        atomic_write(self.ray_token_path, ray_token.encode(), mode=0o600)  # for Ray clients of this cluster
        os.environ.update({**RAY_ENV, "RAY_AUTH_TOKEN": ray_token})
        try:
            import ray
            from ray.cluster_utils import Cluster
        except ImportError:
            raise InvalidRequest("a fleet runs on Ray, which is not installed: pip install 'stasis[fleet]'") from None

        # Ray makes its temp directories 0777: under the fleet's own 0700 home, no other user reaches them. Ray's
        # test cluster writes its address to the host-wide default directory (a new machine may not have it yet),
        # where any plain `ray.init()` of this host would find the fleet's cluster and join it: it is taken back.
        from ray._common.utils import get_default_ray_temp_dir, reset_ray_address
        from ray._private.utils import read_ray_address

        os.makedirs(get_default_ray_temp_dir(), mode=0o700, exist_ok=True)
        head = {"num_cpus": 0, "include_dashboard": False, "object_store_memory": OBJECT_STORE,
                "temp_dir": str(self.home / "r")}  # fmt: skip
        self.cluster = Cluster(initialize_head=True, head_node_args=head)
        if read_ray_address() == self.cluster.address:
            reset_ray_address()
        for number in range(1, self.nodes + 1):
            name = f"n{number}"
            self.ray_nodes[name] = self.cluster.add_node(
                num_cpus=self.cpus_per_node, object_store_memory=OBJECT_STORE, resources={resource_of(name): 1}
            )
        if not self.cluster.address.startswith("127.0.0.1:"):  # Ray read the host's address: never serve on it
            raise InvalidRequest(f"Ray bound {self.cluster.address}, not loopback: was ray imported before the fleet?")
        ray.init(address=self.cluster.address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
        remote_agent = ray.remote(NodeAgent)
        # one machine: the nodes share its images, and a directory as the store sandboxes move through
        # and idle sandboxes go on to the store, so they outlive their node
        env = {"STASIS_IMAGE_DIR": str(self.images), "STASIS_REMOTE": self.store or f"file://{self.home / 'store'}",
               "STASIS_IDLE_TO_STORE": "1"}  # fmt: skip
        for name in self.ray_nodes:
            self.agents[name] = remote_agent.options(  # type: ignore[attr-defined]
                name=AGENT_PREFIX + name, namespace=NAMESPACE, num_cpus=0, resources={resource_of(name): 0.001},
                max_restarts=0, max_concurrency=AGENT_CONCURRENCY,
            ).remote(name, str(self.home / "nodes" / name), self.token, env)  # fmt: skip
        ray.get([agent.describe.remote() for agent in self.agents.values()])  # each daemon answers
        log.info("local fleet: %d nodes up", len(self.agents))

    async def kill_node(self, name: str) -> None:
        """A host's loss: its raylet and every process of it (the agent, and with it the daemon) killed, then
        its sandboxes' processes, and what it held of this machine (network namespaces, its mount namespace's
        pin): a real host's loss takes all of it with the host."""
        if name not in self.ray_nodes:
            raise Unsupported(
                f"node {name[:80]!r} joined from elsewhere (`stasis fleet join`): only this local "
                "fleet's own nodes can be killed; stop that host, or `stasis fleet leave` it"
            )
        await asyncio.to_thread(self.cluster.remove_node, self.ray_nodes.pop(name))
        self.agents.pop(name, None)
        await bury(Paths(self.home / "nodes" / name, self.images))

    def stop(self) -> None:
        """Every sandbox removed, every daemon, agent, raylet and the head stopped."""
        import ray

        for name, agent in list(self.agents.items()):
            try:
                ray.get(agent.stop.remote(), timeout=300)
            except Exception as exc:
                log.warning("node %s did not stop cleanly: %s", name, exc)
            ray.kill(agent)
        self.agents.clear()
        ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None
        self.ray_token_path.unlink(missing_ok=True)


def private_home(home: Path) -> None:
    """The fleet's home, made 0700, or made so if it exists (Ray's 0777 socket directories live inside it); one of
    another user's is refused."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    found = os.lstat(home)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        raise InvalidRequest(f"the fleet's home {home} must be a directory of this user's (not a link); pick another")
    if found.st_mode & 0o077:
        os.chmod(home, 0o700)


async def bury(paths: Paths) -> None:
    """What a lost node left on this machine: every process naming its home or runtime directory (runsc, QEMU)
    killed, its network namespaces and firewall removed, its mount namespace unpinned."""
    marks = (str(paths.home) + "/", str(paths.runtime) + "/")
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if any(mark in (entry / "cmdline").read_bytes().decode(errors="replace") for mark in marks):
                    os.kill(int(entry.name), signal.SIGKILL)
    network = NetworkEngine(paths.runtime.name, lambda _sandbox_id: None)
    try:
        await network.sweep(set())
    finally:
        network.close()
    if mountns.pinned(paths.mount_pin):
        await asyncio.to_thread(subprocess.run, ["umount", "--lazy", str(paths.mount_pin)], check=False)
        paths.mount_pin.unlink(missing_ok=True)
    shutil.rmtree(paths.runtime, ignore_errors=True)


def listening_socket(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1") or not port.isdigit():
        raise InvalidRequest(f"--listen wants a loopback HOST:PORT (127.0.0.1:0 for any free port), got {listen!r}")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepted sockets: no 40 ms Nagle stalls
    sock.bind((host, int(port)))
    sock.listen(128)
    return sock


@contextlib.contextmanager
def running(fleet: LocalFleet) -> Iterator[LocalFleet]:
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


def serve(fleet: LocalFleet, listen: str, announce: Callable[[dict[str, str]], None]) -> None:
    """Start the fleet, serve its front door on ``listen`` until SIGINT or SIGTERM, then stop it all.
    ``announce`` gets the variables a client exports, once the door listens."""
    sock = listening_socket(listen)
    with running(fleet):
        door = create_door(Nodes(fleet.token), fleet.token, kill_node=fleet.kill_node)
        server = QuietServer(uvicorn.Config(door, log_level="warning", lifespan="off"))

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            while not server.started and not serving.done():
                await asyncio.sleep(0.05)
            host, port = sock.getsockname()[:2]
            announce(
                {
                    "STASIS_FLEET": f"http://{host}:{port}",
                    "STASIS_TOKEN": fleet.token,
                    "RAY_ADDRESS": fleet.cluster.address,
                    "RAY_AUTH_TOKEN_PATH": str(fleet.ray_token_path),
                }
            )
            await serving

        asyncio.run(main())
