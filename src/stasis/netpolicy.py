"""What a sandbox may connect to: the egress policy, shared by the SDK and the daemon.

A rule is an IP address (``203.0.113.7``), a CIDR (``203.0.113.0/24``), a hostname
(``pypi.org``), a wildcard (``*.github.com``: the name's subdomains, not the name itself) or
``*`` (everything). How a destination is judged, in this order:

1. the host's own addresses and loopback: never (the daemon listens there);
2. a ``deny_out`` rule matches: denied (**deny wins** over allow);
3. ``allow_out`` is not empty: allowed only if one of its rules matches (default deny);
4. otherwise (the public internet): allowed unless it is a private, link-local or otherwise
   special address (RFC 1918, 169.254.0.0/16 with the cloud metadata service, CGNAT, ...),
   which only an ``allow_out`` rule opens: an address or CIDR (or ``*``), never a hostname rule,
   since whoever runs a name's DNS chooses its addresses.

A hostname rule matches the name the sandbox resolved through its DNS resolver (which answers
only names the policy permits) or the name it sends in TLS SNI or the HTTP Host header.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){LABEL}(\.{LABEL})*$")

# Not the public internet: opened only by an allow_out rule that names them.
SPECIAL_NETWORKS = tuple(
    ipaddress.ip_network(cidr)
    for cidr in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
        "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
        "::/128", "::1/128", "::ffff:0:0/96", "fc00::/7", "fe80::/10", "ff00::/8",
    )
)  # fmt: skip


def normalise_rule(rule: str) -> str:
    """One rule in canonical form, or a ValueError that says what a rule may be."""
    text = rule.strip().lower().rstrip(".")
    if text == "*":
        return text
    try:
        return str(ipaddress.ip_network(text, strict=False)) if "/" in text else str(ipaddress.ip_address(text))
    except ValueError:
        pass
    name = text.removeprefix("*.")
    if HOSTNAME.fullmatch(name) and not name.replace(".", "").isdigit():
        return text
    raise ValueError(
        f"invalid network rule {rule[:80]!r}: use an IP address (203.0.113.7), a CIDR (203.0.113.0/24), "
        "a hostname (pypi.org), a wildcard (*.github.com) or * for everything"
    )


def name_matches(rule: str, name: str) -> bool:
    if rule.startswith("*."):
        return name.endswith(rule[1:])
    return name == rule


class NetworkPolicy(BaseModel):
    """Where a sandbox may connect. ``NetworkPolicy()`` is the public internet; see the module's doc."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_out: list[str] = Field(default_factory=list, description="only these (default deny) when not empty")
    deny_out: list[str] = Field(default_factory=list, description="never these; deny wins over allow")
    note: str | None = Field(
        None, max_length=500, description="said wherever the policy is shown: why it is what it is (E2B's allowOut "
        "without denyOut, which narrows nothing)",
    )  # fmt: skip

    @field_validator("allow_out", "deny_out")
    @classmethod
    def _valid_rules(cls, rules: list[str]) -> list[str]:
        return list(dict.fromkeys(normalise_rule(rule) for rule in rules))

    @classmethod
    def no_egress(cls) -> NetworkPolicy:
        """A network device (so ports can be exposed) but no connection out."""
        return cls(deny_out=["*"])

    def describe(self) -> str:
        parts = []
        if self.allow_out:
            parts.append("allow " + ", ".join(self.allow_out) + " (everything else denied)")
        else:
            parts.append("public internet")
        if self.deny_out:
            parts.append("deny " + ", ".join(self.deny_out))
        if self.note:
            parts.append(f"note: {self.note}")
        return "; ".join(parts)

    # ------------------------------------------------------------ judging

    def _matches(self, rules: list[str], ip: IPAddress | None, names: Iterable[str]) -> str | None:
        names = [n.lower().rstrip(".") for n in names]
        for rule in rules:
            if rule == "*":
                return rule
            if rule[0].isdigit() or ":" in rule:
                if ip is not None and ip in ipaddress.ip_network(rule, strict=False):
                    return rule
            elif any(name_matches(rule, name) for name in names):
                return rule
        return None

    def permits_name(self, name: str) -> bool:
        """Whether the sandbox's resolver answers for ``name`` (before any address is known)."""
        if self._matches(self.deny_out, None, [name]):
            return False
        if not self.allow_out:
            return True
        return self._matches(self.allow_out, None, [name]) is not None

    def judge(
        self,
        ip: IPAddress,
        resolved: Iterable[str] = (),
        claimed: Iterable[str] = (),
        host_addresses: Iterable[IPAddress] = (),
    ) -> str | None:
        """None if a connection to ``ip`` is allowed, else why not. ``resolved``: names the sandbox's
        resolver answered with this address; ``claimed``: the name in its TLS SNI or HTTP Host. A claimed
        name can only deny (anyone can write any name there); a name opens an address only if resolved."""
        resolved, claimed = list(resolved), list(claimed)
        if ip.is_loopback or ip.is_unspecified or ip in set(host_addresses):
            return f"{ip} is the host itself"
        if rule := self._matches(self.deny_out, ip, resolved + claimed):
            return f"denied by the rule {rule!r}"
        if self.allow_out:
            if self._matches(self.allow_out, ip, []):
                return None
            unpermitted = [name for name in claimed if not self.permits_name(name)]
            if self._matches(self.allow_out, None, resolved) and not unpermitted:
                if is_special(ip):  # a name's owner chooses its addresses: never the sandbox's own side
                    return f"{ip} is a private or special address; a name never opens one (add a CIDR rule for it)"
                return None
            shown = ", ".join(resolved + claimed) or "no hostname resolved through the sandbox's DNS"
            return f"{ip} ({shown}) matches no allow_out rule"
        if is_special(ip):
            return f"{ip} is a private or special address (open it with an allow_out rule)"
        return None

    def allowing_rule(self, ip: IPAddress, resolved: Iterable[str] = ()) -> str:
        """For the audit: which rule let an allowed connection through."""
        if not self.allow_out:
            return "no allow_out list: the public internet"
        rule = self._matches(self.allow_out, ip, []) or self._matches(self.allow_out, None, list(resolved))
        return f"allow_out {rule}"

    def decides_by_name(self) -> bool:
        """Whether a name rule can allow or deny (so a connection that never says its name is refused)."""
        return any(rule != "*" and not (rule[0].isdigit() or ":" in rule) for rule in self.allow_out + self.deny_out)


def is_special(ip: IPAddress) -> bool:
    return any(ip in network for network in SPECIAL_NETWORKS if network.version == ip.version)


def as_policy(value: Any) -> NetworkPolicy | None:
    """``network=`` as users write it: True (the internet), False/None (no network), a policy or its dict."""
    if value is None or value is False:
        return None
    if value is True:
        return NetworkPolicy()
    if isinstance(value, NetworkPolicy):
        return value
    return NetworkPolicy.model_validate(value)
