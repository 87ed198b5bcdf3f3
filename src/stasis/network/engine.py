"""The daemon's side of every networked sandbox: its namespaces, firewall, resolver and egress proxy.

One engine for both backends: a backend only asks for its device (a veth for runsc, a tap for
QEMU, see :mod:`.namespaces`); the policy is enforced here, on the host, where the sandbox's own
kernel cannot reach. The namespaces outlive the daemon (a restarted daemon re-attaches: it opens
its sockets in them again); the sockets do not, so connections under way when the daemon dies
are cut, and the sandbox's next ones go through the new daemon.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute

from .. import faults
from ..netpolicy import IPAddress, NetworkPolicy
from . import firewall, namespaces
from .audit import EgressAudit
from .egress import EgressProxy, Interceptor
from .namespaces import GATEWAY_ADDRESS, INNER_ADDRESS, Device, SandboxNet
from .resolver import Resolver, upstream_from_env

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0


def host_addresses() -> set[IPAddress]:
    """Every address of the host's own interfaces (a sandbox may never connect to one)."""
    with IPRoute() as ipr:
        return {ipaddress.ip_address(a.get_attr("IFA_ADDRESS")) for a in ipr.get_addr() if a.get_attr("IFA_ADDRESS")}


def is_host_address(ip: IPAddress) -> bool:
    """Whether ``ip`` is one of the host's own addresses right now (one that appeared a moment ago too): only
    a local address can be bound. Where the host lets any address be bound (``ip_nonlocal_bind``), the
    host's interfaces are read instead."""
    if _nonlocal_bind(ip.version):
        return ip in host_addresses()
    with socket.socket(socket.AF_INET if ip.version == 4 else socket.AF_INET6, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((str(ip), 0))
        except OSError:
            return False
    return True


def _nonlocal_bind(version: int) -> bool:
    try:
        return Path(f"/proc/sys/net/ipv{version}/ip_nonlocal_bind").read_text().strip() != "0"
    except OSError:
        return False


@dataclass
class Attached:
    """What the daemon holds open for one sandbox."""

    net: SandboxNet
    policy: NetworkPolicy
    resolver: Resolver
    proxy: EgressProxy
    server: asyncio.Server | None = None  # the proxy's listener

    def close(self) -> None:
        self.resolver.close()
        if self.server is not None:
            self.server.close()


class NetworkEngine:
    def __init__(self, tag: str, on_activity: Callable[[str], None], audit: EgressAudit | None = None) -> None:
        self.tag = tag
        self.on_activity = on_activity
        self.audit = audit
        self.secrets: Interceptor | None = None  # the secrets' broker, set by the room above that owns it
        self.upstream = upstream_from_env()
        self._attached: dict[str, Attached] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def net(self, sandbox_id: str) -> SandboxNet:
        return SandboxNet(self.tag, sandbox_id)

    # ------------------------------------------------------------ lifecycle

    async def attach(self, sandbox_id: str, policy: NetworkPolicy, device: Device) -> SandboxNet:
        """Namespaces, firewall and the daemon's sockets in them; idempotent, and cheap when attached."""
        async with self._locks.setdefault(sandbox_id, asyncio.Lock()):
            attached = self._attached.get(sandbox_id)
            net = self.net(sandbox_id)
            if attached is not None and net.gateway_path.exists():
                return net
            if attached is not None:  # its namespace vanished under it: start over
                attached.close()
                del self._attached[sandbox_id]
            started = time.monotonic()
            await namespaces.create(net, device)
            faults.point("network.attach.after_namespaces")
            await firewall.apply(net, policy)
            faults.point("network.attach.after_firewall")
            self._attached[sandbox_id] = await self._open(sandbox_id, net, policy)
            log.info("network of %s attached in %.3fs: %s", sandbox_id, time.monotonic() - started, policy.describe())
            return net

    async def _open(self, sandbox_id: str, net: SandboxNet, policy: NetworkPolicy) -> Attached:
        def current() -> NetworkPolicy:
            return self._attached[sandbox_id].policy if sandbox_id in self._attached else policy

        resolver = Resolver(sandbox_id, current, self.upstream)

        def audited(entry: dict[str, Any]) -> None:
            if self.audit is not None:
                self.audit.record(sandbox_id, entry)

        proxy = EgressProxy(sandbox_id, current, resolver.resolved, is_host_address,
                            lambda: self.on_activity(sandbox_id), audited, lambda: self.secrets)  # fmt: skip
        with namespaces.inside(net.gateway):
            dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        attached = Attached(net, policy, resolver, proxy)
        try:
            dns.bind((GATEWAY_ADDRESS, firewall.DNS_PORT))
            dns.setblocking(False)
            await asyncio.get_running_loop().create_datagram_endpoint(lambda: resolver, sock=dns)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((GATEWAY_ADDRESS, firewall.PROXY_PORT))
            listener.listen(512)
            listener.setblocking(False)
            attached.server = await asyncio.start_server(proxy.handle, sock=listener)
        except BaseException:
            attached.close()
            dns.close()
            listener.close()
            raise
        return attached

    def traffic(self, sandbox_id: str) -> tuple[str, int, int] | None:
        """(its proxy's instance, bytes the sandbox sent out, bytes it got back) through its egress proxy so far;
        None when it has no network attached here."""
        attached = self._attached.get(sandbox_id)
        if attached is None:
            return None
        return attached.proxy.instance, attached.proxy.bytes_out, attached.proxy.bytes_in

    async def update(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        """A live policy change: the firewall at once, the proxy and resolver from their next connection."""
        attached = self._attached.get(sandbox_id)
        if attached is None:
            return  # not attached (suspended before this daemon started): the next attach applies it
        await firewall.apply(attached.net, policy)
        attached.policy = policy
        log.info("network of %s updated: %s", sandbox_id, policy.describe())

    async def detach(self, sandbox_id: str) -> None:
        """Close the daemon's sockets and remove the namespaces (the sandbox is gone); idempotent."""
        async with self._locks.setdefault(sandbox_id, asyncio.Lock()):
            attached = self._attached.pop(sandbox_id, None)
            if attached is not None:
                attached.close()
            faults.point("network.detach.after_close")
            await namespaces.remove(self.net(sandbox_id))
        self._locks.pop(sandbox_id, None)

    async def sweep(self, live: set[str]) -> list[str]:
        """Remove namespaces that no live sandbox of this daemon owns."""
        orphans = sorted(namespaces.sandbox_ids(self.tag) - live)
        for sandbox_id in orphans:
            log.warning("removing the network namespaces of %s: no live sandbox owns them", sandbox_id)
            await self.detach(sandbox_id)
        return orphans

    def close(self) -> None:
        """The daemon stops: its sockets close; the namespaces stay for the next daemon."""
        for attached in self._attached.values():
            attached.close()
        self._attached.clear()

    # ------------------------------------------------------------ reaching into the sandbox

    async def connect(self, sandbox_id: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection to ``port`` in the sandbox, made from its gateway namespace."""
        net = self.net(sandbox_id)
        with namespaces.inside(net.gateway):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            loop = asyncio.get_running_loop()
            await asyncio.wait_for(loop.sock_connect(sock, (INNER_ADDRESS, port)), CONNECT_TIMEOUT)
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock)
