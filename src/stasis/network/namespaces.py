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
nftables table with it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pyroute2 import NetlinkError, NetNS, netns

log = logging.getLogger(__name__)

INNER_ADDRESS = "10.200.0.2"
GATEWAY_ADDRESS = "10.200.0.1"
PREFIX = 30
INNER_DEVICE = "eth0"
GATEWAY_DEVICE = "gw0"
MTU = 1500
NETNS_DIR = Path("/run/netns")
PREFIX_NAME = "stasis-"

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


def _up(ns: NetNS, ifname: str) -> int:
    index = ns.link_lookup(ifname=ifname)[0]
    ns.link("set", index=index, state="up")
    return index


def _add_address(ns: NetNS, index: int, address: str) -> None:
    try:
        ns.addr("add", index=index, address=address, prefixlen=PREFIX)
    except NetlinkError as exc:
        if exc.code != errno.EEXIST:
            raise


def create(net: SandboxNet, device: Device) -> None:
    """Both namespaces and the device between them; idempotent (finishes a creation cut off half-way)."""
    for name in (net.gateway, *((net.inner,) if device == "veth" else ())):
        if not _exists(name):
            netns.create(name)
    with NetNS(net.gateway) as gw:
        _up(gw, "lo")
        if not gw.link_lookup(ifname=GATEWAY_DEVICE):
            if device == "veth":
                peer = {"ifname": INNER_DEVICE, "net_ns_fd": net.inner}
                gw.link("add", ifname=GATEWAY_DEVICE, kind="veth", peer=peer)
            else:
                gw.link("add", ifname=GATEWAY_DEVICE, kind="tuntap", mode="tap")
        index = _up(gw, GATEWAY_DEVICE)
        _add_address(gw, index, GATEWAY_ADDRESS)
        # The host route back to the sandbox: everything not for the gateway goes through the forward
        # hook, where nftables rejects it at once (nothing is ever forwarded).
        with contextlib.suppress(NetlinkError):
            gw.route("add", dst="0.0.0.0/0", gateway=INNER_ADDRESS)
    with inside(net.gateway):
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
    if device == "veth":
        with NetNS(net.inner) as inner:
            _up(inner, "lo")


def configure_inner(net: SandboxNet) -> None:
    """``eth0``'s address and default route, which runsc reads (and removes) when it boots or restores."""
    with NetNS(net.inner) as inner:
        index = _up(inner, INNER_DEVICE)
        _add_address(inner, index, INNER_ADDRESS)
        try:
            inner.route("add", dst="0.0.0.0/0", gateway=GATEWAY_ADDRESS)
        except NetlinkError as exc:
            if exc.code != errno.EEXIST:
                raise


def remove(net: SandboxNet) -> None:
    """Both namespaces, with their devices and firewall; fine if they are gone already."""
    for name in (net.inner, net.gateway):
        if _exists(name):
            try:
                netns.remove(name)
            except OSError as exc:
                log.warning("could not remove network namespace %s: %s", name, exc)


def sandbox_ids(tag: str) -> set[str]:
    """Ids of the sandboxes that have namespaces under this tag."""
    prefix = f"{PREFIX_NAME}{tag}-"
    names = [p.name for p in NETNS_DIR.iterdir()] if NETNS_DIR.is_dir() else []
    return {name.removeprefix(prefix).removesuffix("-gw") for name in names if name.startswith(prefix)}


@contextlib.contextmanager
def inside(name: str) -> Iterator[None]:
    """Run the block (this thread only) in namespace ``name``: a socket made there stays there."""
    netns.pushns(name)
    try:
        yield
    finally:
        netns.popns()
