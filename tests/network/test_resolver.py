"""The sandbox's DNS resolver against a recording upstream on loopback: only one standard question ever
leaves, as a query built anew; everything else is answered (refused) without the upstream."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import dns.flags
import dns.message
import dns.opcode
import dns.query
import dns.rcode
import dns.rdatatype
import dns.rrset
import dns.update
import pytest

from stasis import NetworkPolicy
from stasis.network.resolver import Resolver

pytestmark = pytest.mark.fast


class Upstream(asyncio.DatagramProtocol):
    """Answers every A question with 203.0.113.7, and keeps what it was sent."""

    def __init__(self) -> None:
        self.received: list[dns.message.Message] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        query = dns.message.from_wire(data)
        self.received.append(query)
        answer = dns.message.make_response(query)
        question = query.question[0]
        answer.answer.append(dns.rrset.from_text(question.name, 60, "IN", "A", "203.0.113.7"))
        answer.additional.append(dns.rrset.from_text("extra.test.", 60, "IN", "A", "203.0.113.8"))
        self.transport.sendto(answer.to_wire(), addr)  # type: ignore[attr-defined]


def with_resolver(policy: NetworkPolicy, scenario) -> Upstream:  # type: ignore[no-untyped-def]
    async def main() -> Upstream:
        upstream = Upstream()
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: upstream, local_addr=("127.0.0.1", 0), family=socket.AF_INET
        )
        resolver = Resolver("test", lambda: policy, transport.get_extra_info("sockname"))
        try:
            await scenario(resolver)
        finally:
            transport.close()
        return upstream

    return asyncio.run(main())


def test_only_one_standard_question_reaches_the_upstream_and_as_a_new_query() -> None:
    policy = NetworkPolicy(allow_out=["ok.test"], deny_out=["bad.test"])

    async def scenario(resolver: Resolver) -> None:
        query = dns.message.make_query("ok.test", "A", use_edns=0, payload=4096)
        reply = await resolver.reply(query)
        assert reply.rcode() == dns.rcode.NOERROR and reply.id == query.id
        assert [r.to_text() for r in reply.answer[0]] == ["203.0.113.7"] and not reply.additional
        assert resolver.resolved.names(ipaddress.ip_address("203.0.113.7")) == ["ok.test"]
        two = dns.message.make_query("ok.test", "A")
        two.question.append(dns.message.make_query("bad.test", "A").question[0])  # a denied name in second place
        assert (await resolver.reply(two)).rcode() == dns.rcode.FORMERR
        update = dns.update.UpdateMessage("ok.test")
        update.add("www", 60, "A", "10.0.0.1")
        notify = dns.message.make_query("ok.test", "SOA")
        notify.set_opcode(dns.opcode.NOTIFY)
        response = dns.message.make_response(dns.message.make_query("ok.test", "A"))  # QR=1: never answered
        assert await resolver.reply(response) is None
        refused = [update, notify]
        refused += [dns.message.make_query("ok.test", kind) for kind in ("AXFR", "IXFR", "ANY")]
        refused.append(dns.message.make_query("ok.test", "A", rdclass="CH"))
        refused.append(dns.message.make_query("bad.test", "A"))
        for message in refused:
            answer = await resolver.reply(message)
            assert answer.rcode() in (dns.rcode.REFUSED, dns.rcode.FORMERR), message

    upstream = with_resolver(policy, scenario)
    assert len(upstream.received) == 1
    sent = upstream.received[0]
    assert [q.name.to_text() for q in sent.question] == ["ok.test."]
    assert sent.opcode() == dns.opcode.QUERY and not sent.flags & dns.flags.QR and sent.edns < 0
