"""The egress proxy of one sandbox: every TCP connection it opens arrives here (nftables redirects it).

Each connection is judged once, when it opens, by the policy as it is then (a live update applies
to the next connection): by its address, the names the sandbox resolved to that address, and on
ports 80 and 443 the name it claims in its HTTP Host header or TLS SNI. Allowed, the daemon makes
the connection from the host and copies bytes both ways; denied, the sandbox's connection is reset.

HTTPS to a host one of the sandbox's secrets is bound to is not copied but served by the secrets' broker
(:mod:`stasis.credentials.broker`), which puts the secrets in; plain HTTP to such a host is refused.

A sandbox holds at most ``MAX_OPEN`` connections through its proxy at once (each costs the daemon two
descriptors), and all sandboxes together ``DAEMON_MAX_OPEN``. Over that, a new connection is reset as soon as it
is accepted, before anything is read or opened for it; the first refusal is audited and logged once, and the rest
are only counted until the sandbox is back well under the cap (three quarters of it). A connection the sandbox
resets is logged at debug level only, one that fails otherwise in a single line, never with a traceback. A
connection one side has ended is torn down once the other has been silent for a minute (:func:`.relay.relay`): a
remote that never closes holds no slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import resource
import socket
import struct
import time
from collections.abc import Callable
from secrets import token_hex
from typing import Any, ClassVar, Protocol

from ..netpolicy import IPAddress, NetworkPolicy
from . import sniff
from .relay import abort, relay
from .resolver import ResolvedNames

log = logging.getLogger(__name__)

SO_ORIGINAL_DST = 80
MAX_OPEN = 1024  # connections one sandbox holds through its proxy at once
DAEMON_MAX_OPEN = 8192  # all sandboxes' at once, at most: two descriptors each (see daemon_cap)
PEEK_TIMEOUT = 15.0  # seconds for a client to send its ClientHello or request head (a slow microVM under load)
CONNECT_TIMEOUT = 10.0


def original_destination(sock: socket.socket) -> tuple[IPAddress, int]:
    """Where the sandbox meant to connect, before nftables redirected it here."""
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, address = struct.unpack_from("!2xH4s", raw)
    return ipaddress.IPv4Address(address), port


class Interceptor(Protocol):
    """What the egress proxy asks of the secrets' broker."""

    def bound(self, sandbox_id: str, host: str) -> bool: ...

    async def intercept(
        self,
        sandbox_id: str,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        first: bytes,
        destination: tuple[IPAddress, int],
        host: str,
        on_data: Callable[[], None],
    ) -> dict[str, Any]: ...


def daemon_cap() -> int:
    """All sandboxes' connections at once: two descriptors each, within the daemon's own limit, a third of which
    stays for everything else it holds (sandboxes, clients, files)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, min(DAEMON_MAX_OPEN, soft // 3))


class EgressProxy:
    all_open: ClassVar[int] = 0  # connections every sandbox's proxy in this daemon handles now

    def __init__(
        self,
        label: str,
        policy: Callable[[], NetworkPolicy],
        resolved: ResolvedNames,
        is_host_address: Callable[[IPAddress], bool],
        on_activity: Callable[[], None],
        audit: Callable[[dict[str, Any]], None] = lambda entry: None,
        secrets: Callable[[], Interceptor | None] = lambda: None,
        max_open: int = MAX_OPEN,
        daemon_max_open: int | None = None,
    ) -> None:
        self.label = label  # the sandbox's id
        self.policy = policy
        self.resolved = resolved
        self.is_host_address = is_host_address
        self.on_activity = on_activity
        self.audit = audit  # one line per connection (network.audit)
        self.secrets = secrets
        self.max_open = max_open
        self.daemon_max_open = daemon_max_open or daemon_cap()
        self.open = 0  # connections being handled now
        self.instance = token_hex(6)  # its byte counters start at zero with it (:mod:`..daemon.rooms.meter`)
        self.bytes_out = 0  # sent by the sandbox through connections it was allowed, counted as they go
        self.bytes_in = 0
        self.refused: int | None = None  # refused since the cap was reached; None: under the cap
        self.daemon_wide = False  # the cap reached was the daemon's (all sandboxes'), not this sandbox's

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= self.max_open or EgressProxy.all_open >= self.daemon_max_open:
            self._refuse(writer)
            return
        self.open += 1
        EgressProxy.all_open += 1
        try:
            await self._handle(reader, writer)
        except ConnectionError as exc:  # the sandbox reset it or went away: its own business
            log.debug("%s: egress connection ended by the sandbox: %s", self.label, exc)
            abort(writer)
        except (OSError, TimeoutError) as exc:
            log.info("%s: egress connection failed: %s", self.label, exc)
            abort(writer)
        except Exception:
            log.exception("%s: egress connection failed", self.label)
            abort(writer)
        finally:
            self.open -= 1
            EgressProxy.all_open -= 1
            held, cap = (EgressProxy.all_open, self.daemon_max_open) if self.daemon_wide else (self.open, self.max_open)
            if self.refused is not None and held <= cap * 3 // 4:
                # well under the cap (not one below it, or a sandbox holding it would log each churn)
                log.info(
                    "%s: back under the cap of %d open connections; %d were refused", self.label, cap, self.refused
                )
                self.refused = None

    def _sent(self, size: int) -> None:
        self.bytes_out += size

    def _received(self, size: int) -> None:
        self.bytes_in += size

    def _refuse(self, writer: asyncio.StreamWriter) -> None:
        """Over the cap: reset at once. Audited and logged for the first refusal only, until back under it."""
        if self.refused is not None:
            self.refused += 1
            abort(writer)
            return
        self.refused = 1
        self.daemon_wide = self.open < self.max_open  # the daemon's cap, not this sandbox's, was reached
        try:
            ip, port = original_destination(writer.get_extra_info("socket"))
            where: dict[str, Any] = {"destination": str(ip), "port": port}
        except OSError:
            where = {"destination": "unknown", "port": 0}
        abort(writer)
        cap = (
            f"the daemon's cap of {self.daemon_max_open} open connections of all sandboxes"
            if self.daemon_wide
            else f"the cap of {self.max_open} open connections"
        )
        why = (f"over {cap}: new ones are refused until some close "
               "(the first is recorded here, the others counted in the daemon's log)")  # fmt: skip
        log.warning("%s: %s", self.label, why)
        self.audit({"time": time.time(), **where, "name": None, "verdict": "denied", "rule": why})

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ip, port = original_destination(writer.get_extra_info("socket"))
        first = b""
        kind = sniff.PEEK_PORTS.get(port)
        if kind:  # a client that speaks first: read enough of it to know which name it asks for
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PEEK_TIMEOUT):
                    while not sniff.complete(kind, first) and (data := await reader.read(sniff.PEEK_BYTES)):
                        first += data
        claimed = [name] if kind and (name := sniff.claimed_name(kind, first)) else []
        resolved = self.resolved.names(ip)
        policy = self.policy()
        opened = time.monotonic()
        line: dict[str, Any] = {"time": time.time(), "destination": str(ip), "port": port,
                                "name": claimed[0] if claimed else ", ".join(sorted(resolved)) or None}  # fmt: skip
        if kind and not sniff.complete(kind, first) and policy.decides_by_name():
            # A policy by name cannot judge a connection that has not said its name: refused, never let through.
            why: str | None = f"no {kind} request with a name arrived within {PEEK_TIMEOUT:.0f}s"
        else:
            local = {ip} if self.is_host_address(ip) else set()  # asked now: an address added a moment ago counts
            why = policy.judge(ip, resolved, claimed, local)
        broker = self.secrets() if claimed else None
        bound = broker is not None and broker.bound(self.label, claimed[0])
        if not why and bound and kind == "http":
            why = f"a secret is bound to {claimed[0]}: plain HTTP is refused (a secret never goes in clear); use HTTPS"
        if why:
            log.info("%s: denied %s:%d%s: %s", self.label, ip, port, f" ({claimed[0]})" if claimed else "", why)
            self.audit(line | {"verdict": "denied", "rule": why})
            abort(writer)
            return
        line |= {"verdict": "allowed", "rule": policy.allowing_rule(ip, resolved)}
        if bound and broker is not None:
            self.on_activity()
            extra = await broker.intercept(
                self.label, (reader, writer), first, (ip, port), claimed[0], self.on_activity
            )
            self.audit(line | {"seconds": round(time.monotonic() - opened, 3), "bytes_out": 0, "bytes_in": 0} | extra)
            return
        try:
            upstream = await asyncio.wait_for(asyncio.open_connection(str(ip), port), CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            log.info("%s: %s:%d unreachable from the host: %s", self.label, ip, port, exc)
            self.audit(line | {"error": f"unreachable from the host: {exc}", "bytes_out": 0, "bytes_in": 0})
            abort(writer)
            return
        self.on_activity()
        upstream[1].write(first)
        self.bytes_out += len(first)
        forth, back = await relay((reader, writer), upstream, self.on_activity, (self._sent, self._received))
        seconds = round(time.monotonic() - opened, 3)
        self.audit(line | {"bytes_out": len(first) + forth, "bytes_in": back, "seconds": seconds})
