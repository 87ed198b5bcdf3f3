"""The nftables table of a sandbox's gateway namespace, as nft's JSON, applied in one transaction.

- every TCP connection from the sandbox is redirected to the daemon's egress proxy (which judges it
  by the policy, hostnames included, and makes it from the host);
- a connection to an address a ``deny_out`` CIDR names is not redirected but refused right away
  (a TCP reset: ``connect`` fails with "connection refused");
- UDP to the gateway's port 53 reaches the daemon's resolver; any other packet is rejected at once
  (UDP and ICMP go nowhere: the sandbox has TCP and DNS).
"""

from __future__ import annotations

import ipaddress
import json
import tempfile
from typing import Any

from .. import procs
from ..errors import BackendError
from ..netpolicy import NetworkPolicy
from .namespaces import GATEWAY_ADDRESS, GATEWAY_DEVICE, SandboxNet

TABLE = "stasis"
PROXY_PORT = 15001
DNS_PORT = 53


def _rule(chain: str, *expr: dict[str, Any]) -> dict[str, Any]:
    return {"add": {"rule": {"family": "inet", "table": TABLE, "chain": chain, "expr": list(expr)}}}


def _match(left: dict[str, Any], right: Any, op: str = "==") -> dict[str, Any]:
    return {"match": {"op": op, "left": left, "right": right}}


def _meta(key: str) -> dict[str, Any]:
    return {"meta": {"key": key}}


def _payload(protocol: str, field: str) -> dict[str, Any]:
    return {"payload": {"protocol": protocol, "field": field}}


def _chain(name: str, kind: str, hook: str, priority: int, policy: str) -> dict[str, Any]:
    chain = {"family": "inet", "table": TABLE, "name": name, "type": kind, "hook": hook, "prio": priority}
    return {"add": {"chain": chain | {"policy": policy}}}


def denied_networks(policy: NetworkPolicy) -> list[str]:
    """The IPv4 networks of deny_out (a hostname rule is the proxy's and the resolver's to judge)."""
    networks = []
    for rule in policy.deny_out:
        if rule == "*":
            return ["0.0.0.0/0"]
        with_prefix = rule if "/" in rule else rule + "/32"
        try:
            network = ipaddress.ip_network(with_prefix, strict=False)
        except ValueError:
            continue  # a hostname
        if network.version == 4:
            networks.append(str(network))
    return networks


def ruleset(policy: NetworkPolicy) -> dict[str, Any]:
    from_sandbox = _match(_meta("iifname"), GATEWAY_DEVICE)
    to_gateway = _match(_payload("ip", "daddr"), GATEWAY_ADDRESS)
    denied = [
        {"prefix": {"addr": str(n.network_address), "len": n.prefixlen}}
        for n in map(ipaddress.ip_network, denied_networks(policy))
    ]
    commands: list[dict[str, Any]] = [
        {"add": {"table": {"family": "inet", "name": TABLE}}},
        {"delete": {"table": {"family": "inet", "name": TABLE}}},  # replaced whole, in the same transaction
        {"add": {"table": {"family": "inet", "name": TABLE}}},
        {"add": {"set": {"family": "inet", "table": TABLE, "name": "denied", "type": "ipv4_addr",
                         "flags": ["interval"], **({"elem": denied} if denied else {})}}},
        _chain("prerouting", "nat", "prerouting", -100, "accept"),
        _rule("prerouting", from_sandbox, to_gateway, {"accept": None}),
        _rule("prerouting", from_sandbox, _match(_payload("ip", "daddr"), "@denied"), {"accept": None}),
        _rule("prerouting", from_sandbox, _match(_meta("l4proto"), "tcp"), {"redirect": {"port": PROXY_PORT}}),
        _chain("input", "filter", "input", 0, "drop"),
        _rule("input", _match(_meta("iifname"), "lo"), {"accept": None}),
        _rule("input", _match({"ct": {"key": "state"}}, ["established", "related"], "in"), {"accept": None}),
        _rule("input", from_sandbox, _match(_payload("udp", "dport"), DNS_PORT), {"accept": None}),
        _rule("input", from_sandbox, _match(_payload("tcp", "dport"), PROXY_PORT), {"accept": None}),
        _rule("input", _match(_meta("l4proto"), "tcp"), {"reject": {"type": "tcp reset"}}),
        _rule("input", {"reject": {"type": "icmpx", "expr": "admin-prohibited"}}),
        _chain("forward", "filter", "forward", 0, "drop"),
        _rule("forward", _match(_meta("l4proto"), "tcp"), {"reject": {"type": "tcp reset"}}),
        _rule("forward", {"reject": {"type": "icmpx", "expr": "admin-prohibited"}}),
    ]  # fmt: skip
    return {"nftables": commands}


async def apply(net: SandboxNet, policy: NetworkPolicy) -> None:
    """Replace the gateway namespace's table atomically (a live policy update is this call too)."""
    with tempfile.NamedTemporaryFile("w", prefix="stasis-nft-", suffix=".json") as rules:
        json.dump(ruleset(policy), rules)
        rules.flush()
        argv = ["nsenter", f"--net={net.gateway_path}", "nft", "-j", "-f", rules.name]
        result = await procs.run(argv, timeout=30)
    if result.returncode != 0:
        raise BackendError(f"nft refused the firewall of {net.gateway}: {result.output}")
