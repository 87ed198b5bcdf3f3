"""What a request to E2B's API says about the sandbox it is for, and the tokens derived from the API key:
shared by the daemon's E2B face and the fleet's router in front of several of them."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping

SANDBOX_HEADER = "e2b-sandbox-id"
PORT_HEADER = "e2b-sandbox-port"
TOKEN_HEADER = "x-access-token"
TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"
API_KEY_HEADER = "x-api-key"
ENVD_PORT = 49983
BASE_IMAGE = "e2b-base"  # E2B's `base` template: stasis' default image as E2B's `user` (`stasis e2b serve` builds it)
CODE_IMAGE = "e2b-code-interpreter"  # E2B's `code-interpreter-v1`: stasis' code-interpreter image as E2B's `user`
UNAUTHORIZED = (
    "a sandbox request needs the sandbox's envd access token (X-Access-Token), for a port other than envd's "
    "its traffic access token (e2b-traffic-access-token), or the API key (X-API-Key)"
)
HOST_FORM = re.compile(r"^(\d{1,5})-([A-Za-z0-9][A-Za-z0-9_.-]{0,127}?)\.")


def derived_token(api_key: str, kind: str, sandbox_id: str) -> str:
    """A sandbox's token of ``kind`` ("envd" or "traffic"): an HMAC of its id under the API key, so nothing is
    stored and a new key revokes every token."""
    return hmac.new(api_key.encode(), f"{kind}:{sandbox_id}".encode(), hashlib.sha256).hexdigest()[:40]


def sandbox_target(headers: Mapping[str, str], domain: str | None) -> tuple[str, int] | None:
    """(sandbox ref, port) a request names, or None for the control plane: with ``E2B_SANDBOX_URL`` set the SDKs
    name it in two headers; without, in the Host, ``PORT-ID.DOMAIN``. A port that is not a number is -1."""
    if (sandbox := headers.get(SANDBOX_HEADER)) is not None:
        port = headers.get(PORT_HEADER, str(ENVD_PORT))
        return sandbox, int(port) if port.isascii() and port.isdigit() and len(port) <= 5 else -1
    host = headers.get("host", "").rpartition(":")[0] or headers.get("host", "")
    if domain and host.lower().endswith("." + domain_host(domain)) and (m := HOST_FORM.match(host)):
        return m.group(2), int(m.group(1))
    return None


def domain_host(domain: str) -> str:
    """A sandbox domain's name without its port: ``localhost:3000`` (the listener's own) is ``localhost``."""
    name, sep, port = domain.rpartition(":")
    return (name if sep and port.isdigit() else domain).lower()


def local_domain(host: str, port: int) -> str | None:
    """The domain a listener on ``host:port`` hands out when none was given: ``localhost:PORT``, whose names
    (``8000-ID.localhost``) resolve to this machine (systemd-resolved, nss-myhostname, curl, browsers), for a
    listener that loopback reaches; None for one on another address (give it ``--domain``)."""
    return f"localhost:{port}" if host in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "::", "") else None


def code_template_name(backend: str) -> str:
    """The warm template of E2B's ``code-interpreter-v1`` on ``backend`` (its kernel already running)."""
    return f"{CODE_IMAGE}-{backend}"
