"""One delivery of a lifecycle event to a webhook: the body, its signature, and where the request may go.

The signature is Stripe's scheme: ``Stasis-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>" under the
webhook's secret>``; a receiver recomputes it and refuses a ``t`` too old (a replay). A webhook added without
``allow_private`` reaches public addresses only: its host is resolved at each delivery, every address it has must
be global and not one of this host's own, and the request goes to the address that was checked (so a name that
changes its answer between the check and the connection cannot send it to the sandbox network, a private range or
this host's ports).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import json
import socket
import subprocess
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from ...errors import InvalidRequest
from ...netpolicy import is_special

TIMEOUT = 10.0  # each read or write
DEADLINE = 30.0  # one attempt, all told
NAT64 = ipaddress.ip_network("64:ff9b::/96")
_own: list[object] = [float("-inf"), frozenset()]


def body_of(event: dict[str, Any]) -> bytes:
    document = {
        "id": event["event_id"], "type": event["event_type"], "at": event["event_at"], "reason": event["reason"],
        "sandbox": {"id": event["sandbox_id"], "name": event["sandbox_name"], "team": event["team"]},
        "delivery_id": event["id"],
    }  # fmt: skip
    return json.dumps(document, sort_keys=True).encode()


E2B_TYPES = {"created": "created", "forked": "created", "resumed": "resumed", "suspended": "paused",
             "checkpointed": "checkpointed", "updated": "updated", "killed": "killed", "failed": "killed"}  # fmt: skip


def e2b_body(event: dict[str, Any], context: dict[str, Any]) -> bytes:
    """E2B's webhook payload (version v2) of an event; ``context``: what the E2B face knows of the sandbox."""
    kind = E2B_TYPES.get(str(event["event_type"]), "updated")
    data: dict[str, Any] = {"sandbox_metadata": context.get("metadata", {})}
    if kind in ("killed", "paused"):
        data["execution"] = {"vcpu_count": context.get("cpus"), "memory_mb": context.get("memory_mb")}
    document = {
        "version": "v2", "id": event["event_id"], "type": f"sandbox.lifecycle.{kind}", "eventData": data,
        "sandboxId": event["sandbox_id"], "sandboxTeamId": event["team"] or "", "sandboxBuildId": "",
        "sandboxExecutionId": event["sandbox_id"], "sandboxTemplateId": context.get("template", ""),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(event["event_at"]))),
    }  # fmt: skip
    return json.dumps(document, sort_keys=True).encode()


def e2b_signature(secret: str, body: bytes) -> str:
    """E2B's: the unpadded base64 of SHA-256 over the secret followed by the body."""
    return base64.b64encode(hashlib.sha256(secret.encode() + body).digest()).decode().rstrip("=")


def signature(secret: str, body: bytes, at: int) -> str:
    mac = hmac.new(secret.encode(), f"{at}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={at},v1={mac}"


def check_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a webhook URL, or a clear error."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        raise InvalidRequest(
            f"a webhook URL is http:// or https://HOST[:PORT]/PATH without credentials, not {url[:80]!r}"
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise InvalidRequest(f"the webhook URL's port is not a number: {url[:80]!r}") from None
    return parts.scheme, parts.hostname, port


async def public_address(host: str, port: int) -> str:
    """An address ``host`` resolves to, if every one it resolves to is public (never this host's own)."""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise InvalidRequest(f"the webhook's host {host!r} does not resolve: {exc}") from None
    addresses = [ipaddress.ip_address(info[4][0]) for info in found]
    for address in addresses:
        if not _public(address) or str(address) in own_addresses():
            raise InvalidRequest(
                f"the webhook's host {host!r} resolves to {address}, which is not a public address; a webhook reaches "
                "private ranges, loopback and this host only if added with --allow-private (by the daemon's owner)"
            )
    return str(addresses[0])


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Global, and so is any IPv4 address an IPv6 one carries (mapped, 6to4, NAT64's 64:ff9b::/96)."""
    if is_special(address) or not address.is_global:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour
        if inner is None and address in NAT64:
            inner = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if inner is not None:
            return _public(inner)
    return True


def own_addresses() -> frozenset[str]:
    """This host's own interface addresses (a public one included), looked up at most once a minute: a webhook
    never reaches its ports."""
    now = time.monotonic()
    if now - _own[0] > 60:
        try:
            shown = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, timeout=10).stdout
            found = frozenset(a["local"] for link in json.loads(shown or "[]") for a in link.get("addr_info", []))
        except (OSError, ValueError, subprocess.TimeoutExpired):
            found = frozenset()
        _own[:] = [now, found]
    return _own[1]  # type: ignore[no-any-return]


async def post(url: str, allow_private: bool, body: bytes, headers: dict[str, str]) -> tuple[int | None, str | None]:
    """(the receiver's status, an error) of one POST, within DEADLINE all told (the name's lookup too); the
    receiver's answer is not read past its status. Never raises for the receiver's failures."""
    try:
        return await asyncio.wait_for(_post(url, allow_private, body, headers), DEADLINE)
    except TimeoutError:
        return None, f"no answer within {DEADLINE:.0f} s"


async def _post(url: str, allow_private: bool, body: bytes, headers: dict[str, str]) -> tuple[int | None, str | None]:
    scheme, host, port = check_url(url)
    extensions: dict[str, Any] = {}
    target = url
    try:
        if not allow_private:
            address = await public_address(host, port)
            shown = f"[{address}]" if ":" in address else address
            parts = urlsplit(url)
            target = urlunsplit((scheme, f"{shown}:{port}", parts.path or "/", parts.query, ""))
            headers = {**headers, "host": parts.netloc}
            if scheme == "https":
                extensions["sni_hostname"] = host
        async with (
            httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False, trust_env=False) as client,
            client.stream("POST", target, content=body, headers=headers, extensions=extensions) as answer,
        ):
            return answer.status_code, None if answer.is_success else f"HTTP {answer.status_code}"
    except InvalidRequest as exc:
        return None, exc.message
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:300]
