"""The network namespaces of one sandbox, through pyroute2 (netlink, no `ip` command lines).

Every sandbox sees the same addresses (``10.200.0.2/30``, gateway ``10.200.0.1``): a checkpoint
restores, and forks, anywhere without re-addressing. What makes them distinct is where they
live: each sandbox has its own *gateway* namespace, holding ``gw0`` (the gateway address) and
nothing else, no route to the host or to any other namespace. The daemon listens in it (its
DNS resolver and its egress proxy, :mod:`.engine`); nftables there sends every TCP connection to
that proxy. A sandbox reaches the world only through the daemon, which judges each connection.

- gVisor (``veth``): runsc runs in a second, *inner* namespace holding ``eth0``, the veth peer of
  ``gw0``. runsc takes the device over and removes its address from the namespace, so the address
  is put back before every `runsc run` and `runsc restore` (:func:`configure_inner`).
- microVM (``tap``): ``gw0`` is a tap device that QEMU, started in the gateway namespace, opens.

Namespaces are bind mounts under /run/netns (tmpfs): a host reboot removes them, and the daemon
makes them again before the sandbox boots. Removing a namespace removes its devices and its
nftables table with it. They are made and removed with `ip netns` (pyroute2's own helpers fork and
wait for a child, which the daemon's reaper of children, :mod:`stasis.procs`, would take from them);
devices, addresses and routes are set with pyroute2 from a thread that entered the namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pyroute2 import IPRoute, NetlinkError

from .. import procs
from ..errors import BackendError

log = logging.getLogger(__name__)

INNER_ADDRESS = "10.200.0.2"
GATEWAY_ADDRESS = "10.200.0.1"
PREFIX = 30
INNER_DEVICE = "eth0"
GATEWAY_DEVICE = "gw0"
# Fixed link addresses too: a restored or forked guest keeps its neighbour cache, which must still
# name the gateway of the new link (a random MAC left a fork's packets dropped until ARP re-probed).
GATEWAY_MAC = "02:00:0a:c8:00:01"
INNER_MAC = "02:00:0a:c8:00:02"
MTU = 1500
NETNS_DIR = Path("/run/netns")
PREFIX_NAME = "stasis-"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

Device = Literal["veth", "tap"]


@dataclass(frozen=True)
class SandboxNet:
    """The names of one sandbox's namespaces; ``tag`` keeps two daemons' (two homes') apart."""

    tag: str
    sandbox_id: str

    @property
    def gateway(self) -> str:
        return f"{PREFIX_NAME}{self.tag}-{self.sandbox_id}-gw"

    @property
    def inner(self) -> str:
        return f"{PREFIX_NAME}{self.tag}-{self.sandbox_id}"

    @property
    def gateway_path(self) -> Path:
        return NETNS_DIR / self.gateway

    @property
    def inner_path(self) -> Path:
        return NETNS_DIR / self.inner


def _exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def _up(ns: IPRoute, ifname: str) -> int:
    index = ns.link_lookup(ifname=ifname)[0]
    ns.link("set", index=index, state="up")
    return index


def _add(action: object) -> None:
    """Run a netlink "add"; already there is fine (every step is idempotent)."""
    try:
        action()  # type: ignore[operator]
    except NetlinkError as exc:
        if exc.code != errno.EEXIST:
            raise


async def _ip_netns(*args: str) -> None:
    result = await procs.run(["ip", "netns", *args], timeout=30)
    if result.returncode != 0 and not (args[0] == "add" and "File exists" in result.output):
        raise BackendError(f"`ip netns {' '.join(args)}` failed: {result.output}")


async def create(net: SandboxNet, device: Device) -> None:
    """Both namespaces and the device between them; idempotent (finishes a creation cut off half-way)."""
    for name in (net.gateway, *((net.inner,) if device == "veth" else ())):
        if not _exists(name):
            await _ip_netns("add", name)
    await asyncio.to_thread(_configure_gateway, net, device)


def _configure_gateway(net: SandboxNet, device: Device) -> None:
    with inside(net.gateway), IPRoute() as gw:
        _up(gw, "lo")
        added = not gw.link_lookup(ifname=GATEWAY_DEVICE)
        if added:
            if device == "veth":
                fd = os.open(net.inner_path, os.O_RDONLY)
                try:
                    peer = {"ifname": INNER_DEVICE, "net_ns_fd": fd}
                    gw.link("add", ifname=GATEWAY_DEVICE, kind="veth", peer=peer)
                finally:
                    os.close(fd)
            else:
                gw.link("add", ifname=GATEWAY_DEVICE, kind="tuntap", mode="tap")
            gw.link("set", index=gw.link_lookup(ifname=GATEWAY_DEVICE)[0], address=GATEWAY_MAC)  # still down
        index = _up(gw, GATEWAY_DEVICE)
        _add(lambda: gw.addr("add", index=index, address=GATEWAY_ADDRESS, prefixlen=PREFIX))
        # The route back to the sandbox: everything not for the gateway goes through the forward
        # hook, where nftables rejects it at once (nothing is ever forwarded).
        _add(lambda: gw.route("add", dst="0.0.0.0/0", gateway=INNER_ADDRESS))
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")  # this namespace's (the thread is in it)
    if device == "veth":
        with inside(net.inner), IPRoute() as inner:
            _up(inner, "lo")
            if added:
                inner.link("set", index=inner.link_lookup(ifname=INNER_DEVICE)[0], address=INNER_MAC)


def configure_inner(net: SandboxNet) -> None:
    """``eth0``'s address and default route, which runsc reads (and removes) when it boots or restores."""
    with inside(net.inner), IPRoute() as inner:
        index = _up(inner, INNER_DEVICE)
        _add(lambda: inner.addr("add", index=index, address=INNER_ADDRESS, prefixlen=PREFIX))
        _add(lambda: inner.route("add", dst="0.0.0.0/0", gateway=GATEWAY_ADDRESS))


async def remove(net: SandboxNet) -> None:
    """Both namespaces, with their devices and firewall; fine if they are gone already."""
    for name in (net.inner, net.gateway):
        if _exists(name):
            await _ip_netns("delete", name)


def sandbox_ids(tag: str) -> set[str]:
    """Ids of the sandboxes that have namespaces under this tag."""
    prefix = f"{PREFIX_NAME}{tag}-"
    names = [p.name for p in NETNS_DIR.iterdir()] if NETNS_DIR.is_dir() else []
    return {name.removeprefix(prefix).removesuffix("-gw") for name in names if name.startswith(prefix)}


@contextlib.contextmanager
def inside(name: str) -> Iterator[None]:
    """Run the block (this thread only) in namespace ``name``: a socket made there stays there."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(NETNS_DIR / name, os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns: {os.strerror(code)}")
