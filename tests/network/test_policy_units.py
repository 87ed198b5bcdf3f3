"""The pieces of the network engine that need no sandbox: the policy's verdicts, the names a client
claims, the firewall's rules, the port tokens."""

from __future__ import annotations

import ipaddress
import ssl

import pytest

from stasis import InvalidRequest, NetworkPolicy
from stasis.daemon.rooms.ports import PortGate, _strip_token
from stasis.models import SandboxSpec, build
from stasis.network import firewall, sniff

pytestmark = pytest.mark.fast
ip = ipaddress.ip_address


def test_rules_are_validated_and_normalised() -> None:
    policy = NetworkPolicy(allow_out=["PyPI.org.", "10.1.2.3/8", "*.GitHub.com", "*", "::1"])
    assert policy.allow_out == ["pypi.org", "10.0.0.0/8", "*.github.com", "*", "::1"]
    for bad in ("not a host", "999.1.1.1/33", "http://x", "*x.com", ""):
        with pytest.raises(InvalidRequest, match="invalid network rule"):
            build(NetworkPolicy, deny_out=[bad])


def test_network_true_false_and_policies_in_a_spec() -> None:
    assert SandboxSpec(network=True).network == NetworkPolicy()
    assert SandboxSpec(network=False).network is None
    assert SandboxSpec().network is None  # the default: no network device at all
    assert SandboxSpec.model_validate_json('{"network": false}').network is None  # a record made before
    assert SandboxSpec(network={"deny_out": ["*"]}).network == NetworkPolicy.no_egress()


def test_deny_wins_and_allow_lists_deny_by_default() -> None:
    policy = NetworkPolicy(allow_out=["203.0.113.0/24", "*.ok.test"], deny_out=["203.0.113.9", "bad.ok.test"])
    assert policy.judge(ip("203.0.113.8")) is None
    assert "denied" in policy.judge(ip("203.0.113.9"))
    assert "denied" in policy.judge(ip("198.51.100.1"), resolved=["bad.ok.test"])
    assert policy.judge(ip("198.51.100.1"), resolved=["a.ok.test"]) is None
    assert "no allow_out" in policy.judge(ip("198.51.100.1"))
    assert "no allow_out" in policy.judge(ip("198.51.100.1"), claimed=["a.ok.test"])  # claimed only denies
    assert "no allow_out" in policy.judge(ip("198.51.100.1"), resolved=["a.ok.test"], claimed=["x.test"])
    assert not policy.permits_name("bad.ok.test") and policy.permits_name("a.ok.test")
    assert not policy.permits_name("ok.test")  # *.ok.test is the subdomains only


def test_the_internet_excludes_private_special_and_host_addresses() -> None:
    internet = NetworkPolicy()
    assert internet.judge(ip("203.0.113.5")) is None
    for address in ("10.1.1.1", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "fd00::1"):
        assert "private" in internet.judge(ip(address)), address
    for address in ("127.0.0.1", "0.0.0.0", "::1"):
        assert "host itself" in internet.judge(ip(address))
    assert "host itself" in internet.judge(ip("203.0.113.5"), host_addresses={ip("203.0.113.5")})
    assert NetworkPolicy(allow_out=["10.0.0.0/8"]).judge(ip("10.1.1.1")) is None  # opened by naming it
    assert "host itself" in NetworkPolicy(allow_out=["*"]).judge(ip("10.0.0.5"), host_addresses={ip("10.0.0.5")})


def client_hello(server_name: str) -> bytes:
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_names_claimed_in_sni_and_host() -> None:
    hello = client_hello("Example.TEST")
    assert sniff.complete("tls", hello) and not sniff.complete("tls", hello[:10])
    assert sniff.claimed_name("tls", hello) == "example.test"
    assert sniff.claimed_name("tls", b"GET / HTTP/1.1\r\n\r\n") is None
    request = b"GET /x HTTP/1.1\r\nUser-Agent: t\r\nHOST: Site.test:8080\r\n\r\n"
    assert sniff.complete("http", request) and sniff.claimed_name("http", request) == "site.test"
    assert sniff.claimed_name("http", b"GET / HTTP/1.0\r\n\r\n") is None


def test_firewall_refuses_denied_networks_at_once() -> None:
    assert firewall.denied_networks(NetworkPolicy(deny_out=["203.0.113.7", "198.51.100.0/24", "x.test"])) == [
        "203.0.113.7/32",
        "198.51.100.0/24",
    ]
    assert firewall.denied_networks(NetworkPolicy(deny_out=["*"])) == ["0.0.0.0/0"]
    rules = str(firewall.ruleset(NetworkPolicy()))
    assert "'redirect': {'port': 15001}" in rules and "tcp reset" in rules


def test_port_tokens_and_what_reaches_the_app() -> None:
    gate = PortGate(b"k" * 32)
    token, _ = gate.token("sb-a", 8000, 60)
    assert gate.valid("sb-a", 8000, token)
    assert not gate.valid("sb-a", 8001, token) and not gate.valid("sb-b", 8000, token)
    assert not gate.valid("sb-a", 8000, "1." + token.split(".")[1])  # expired (and forged)
    assert not PortGate(b"other key" * 4).valid("sb-a", 8000, token)
    head = f"GET /p?a=1&stasis_token={token} HTTP/1.1\r\nHost: x\r\nX-Stasis-Token: t2\r\n\r\n".encode()
    rebuilt, tokens, from_query = _strip_token(head, "stasis_token_1")
    assert rebuilt == b"GET /p?a=1 HTTP/1.1\r\nHost: x\r\n\r\n"
    assert tokens == [token, "t2"] and from_query
    # the app's own cookies go through; stasis's never do (this port's, another port's, the console's)
    cookie = (b"GET / HTTP/1.1\r\nCookie: a=b; stasis_token_1=t3; stasis_token_2=t4; stasis_console=s; c=d\r\n"
              b"Authorization: Bearer app\r\n\r\n")  # fmt: skip
    rebuilt, tokens, from_query = _strip_token(cookie, "stasis_token_1")
    assert rebuilt == b"GET / HTTP/1.1\r\nCookie: a=b; c=d\r\nAuthorization: Bearer app\r\n\r\n"
    assert tokens == ["t3", "app"] and not from_query
    only_ours = b"GET / HTTP/1.1\r\nCookie: stasis_token_1=t3\r\n\r\n"
    assert _strip_token(only_ours, "stasis_token_1")[0] == b"GET / HTTP/1.1\r\n\r\n"


def test_a_name_never_opens_a_private_or_link_local_address() -> None:
    """Whoever runs a name's DNS picks its addresses: `*.x.test` resolving to the metadata service or a private
    range stays closed, unless a CIDR rule opens that range by itself."""
    by_name = NetworkPolicy(allow_out=["*.x.test"])
    for address in ("169.254.169.254", "10.77.0.2", "192.168.1.1", "100.64.0.1", "172.16.0.1"):
        assert "a name never opens" in by_name.judge(ip(address), resolved=["a.x.test"]), address
    assert by_name.judge(ip("203.0.113.9"), resolved=["a.x.test"]) is None
    opened = NetworkPolicy(allow_out=["*.x.test", "10.77.0.0/16"])
    assert opened.judge(ip("10.77.0.2"), resolved=["a.x.test"]) is None
    assert "a name never opens" in opened.judge(ip("10.78.0.2"), resolved=["a.x.test"])
    assert by_name.decides_by_name() and NetworkPolicy(deny_out=["bad.test"]).decides_by_name()
    assert not NetworkPolicy(allow_out=["10.0.0.0/8", "*"]).decides_by_name() and not NetworkPolicy().decides_by_name()
