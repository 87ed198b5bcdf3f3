"""A sandbox's DNS resolver: the daemon answers its queries at the gateway address, port 53.

Only a standard query (opcode QUERY, not a response) with exactly one question of class IN is
answered; UPDATE, NOTIFY, zone transfers, ANY and anything else are refused here and never reach
the upstream. A permitted question is sent upstream as a new query built from it alone (nothing
else of the sandbox's message leaves), and the answer is built anew from the upstream's records.
A name the policy does not permit is REFUSED (the sandbox's lookup fails at once). A permitted one
is asked of the upstream resolver (``STASIS_DNS_UPSTREAM``, else the host's first nameserver), and
the addresses in the answer are remembered as that name's: the egress proxy opens an address to a
hostname rule only if the sandbox resolved it here. AAAA queries get an empty answer: a sandbox
has IPv4 only, so its clients go straight to the A record.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import dns.asyncquery
import dns.exception
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype

from ..netpolicy import IPAddress, NetworkPolicy

log = logging.getLogger(__name__)

UPSTREAM_TIMEOUT = 3.0
MIN_REMEMBER = 300.0  # seconds an answer is remembered at least: clients cache longer than its TTL
MAX_REMEMBERED = 4096
# Questions no sandbox needs answered through its resolver: zone transfers, ANY, and meta types.
REFUSED_TYPES = frozenset(
    {dns.rdatatype.AXFR, dns.rdatatype.IXFR, dns.rdatatype.ANY, dns.rdatatype.OPT, dns.rdatatype.TSIG,
     dns.rdatatype.TKEY, dns.rdatatype.MAILA, dns.rdatatype.MAILB}
)  # fmt: skip


def upstream_from_env() -> tuple[str, int]:
    """``STASIS_DNS_UPSTREAM`` (``ip`` or ``ip:port``), else the host's first nameserver."""
    configured = os.environ.get("STASIS_DNS_UPSTREAM", "").strip()
    if not configured:
        try:
            for line in Path("/etc/resolv.conf").read_text().splitlines():
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    configured = parts[1]
                    break
        except OSError:
            pass
    text = configured or "127.0.0.1"
    if text.count(":") == 1:  # ip:port (an IPv6 address has more colons)
        host, port = text.split(":")
        return host, int(port)
    return text, 53


@dataclass
class ResolvedNames:
    """Which names the sandbox's resolver answered with an address (until when)."""

    by_address: dict[IPAddress, dict[str, float]] = field(default_factory=dict)

    def remember(self, address: IPAddress, name: str, ttl: float) -> None:
        if len(self.by_address) >= MAX_REMEMBERED:
            self.forget_expired()
        self.by_address.setdefault(address, {})[name] = time.monotonic() + max(ttl, MIN_REMEMBER)

    def names(self, address: IPAddress) -> list[str]:
        now = time.monotonic()
        return [name for name, until in self.by_address.get(address, {}).items() if until > now]

    def forget_expired(self) -> None:
        now = time.monotonic()
        for address in list(self.by_address):
            live = {n: t for n, t in self.by_address[address].items() if t > now}
            if live:
                self.by_address[address] = live
            else:
                del self.by_address[address]


class Resolver(asyncio.DatagramProtocol):
    """Serves one sandbox; ``policy`` is read at each query (a live update applies to the next one)."""

    def __init__(self, label: str, policy: Callable[[], NetworkPolicy], upstream: tuple[str, int]) -> None:
        self.label = label
        self.policy = policy
        self.upstream = upstream
        self.resolved = ResolvedNames()
        self.transport: asyncio.DatagramTransport | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        task = asyncio.get_running_loop().create_task(self._answer(data, addr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        for task in self._tasks:
            task.cancel()

    async def _answer(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            query = dns.message.from_wire(data)
        except dns.exception.DNSException:
            return  # not DNS: no answer
        reply = await self.reply(query)
        if reply is not None and self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(reply.to_wire(), addr)

    async def reply(self, query: dns.message.Message) -> dns.message.Message | None:
        """The answer to send back, or None for a message that is itself a response (never answered)."""
        if query.flags & dns.flags.QR:
            return None
        if query.opcode() != dns.opcode.QUERY:
            return self._error(query, dns.rcode.REFUSED)
        if len(query.question) != 1:
            return self._error(query, dns.rcode.FORMERR)
        question = query.question[0]
        if question.rdclass != dns.rdataclass.IN or question.rdtype in REFUSED_TYPES:
            return self._error(query, dns.rcode.REFUSED)
        name = question.name.to_text(omit_final_dot=True).lower()
        if not self.policy().permits_name(name):
            log.info("%s: DNS refused for %s (not permitted by the network policy)", self.label, name)
            return self._error(query, dns.rcode.REFUSED)
        if question.rdtype == dns.rdatatype.AAAA:
            return dns.message.make_response(query)
        host, port = self.upstream
        ours = dns.message.make_query(question.name, question.rdtype, dns.rdataclass.IN)
        try:
            answer = await dns.asyncquery.udp(ours, host, timeout=UPSTREAM_TIMEOUT, port=port)
        except (dns.exception.DNSException, OSError) as exc:
            log.warning("%s: upstream DNS %s:%d failed for %s: %s", self.label, host, port, name, exc)
            return self._error(query, dns.rcode.SERVFAIL)
        response = dns.message.make_response(query)
        response.set_rcode(answer.rcode())
        response.answer = list(answer.answer)
        for rrset in answer.answer:
            if rrset.rdtype == dns.rdatatype.A:
                for record in rrset:
                    self.resolved.remember(ipaddress.ip_address(record.address), name, rrset.ttl)
        return response

    @staticmethod
    def _error(query: dns.message.Message, rcode: dns.rcode.Rcode) -> dns.message.Message:
        response = dns.message.make_response(query)
        response.set_rcode(rcode)
        return response
