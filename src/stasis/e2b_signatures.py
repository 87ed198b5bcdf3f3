"""envd's signed file URLs (the SDKs' ``download_url`` / ``upload_url``), checked by the daemon's E2B face and
by a fleet's router in front of several: ``?path=P&username=U&signature=v1_S``
with S the unpadded base64 of sha256(``P:OPERATION:U:ENVD_TOKEN[:EXPIRATION]``). A signature is a credential for
that one file, that one operation (GET reads, POST writes), as that user, until ``signature_expiration``.

With ``E2B_SANDBOX_URL`` pointing at the listener such a URL names no sandbox (a browser or curl sends no
``E2b-Sandbox-Id``), so the sandbox it is for is the one whose envd token signed it."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.datastructures import QueryParams

FILES_PATH = "/files"
OPERATIONS = {"GET": "read", "POST": "write"}
SIGNED_SCOPE = "stasis.signed"  # set in a request's ASGI scope admitted by a signature alone (never a header)
MAX_QUERY = 8192  # bytes of a signed URL's query: checked against every candidate, so bounded first
SIGNATURE = re.compile(r"\Av1_[A-Za-z0-9+/]{43}\Z")  # sha256 in unpadded base64


@dataclass(frozen=True)
class Claim:
    """What a signed URL claims, parsed and checked once: the file, operation, user and expiry it covers."""

    file: str
    operation: str
    user: str
    expires: int | None
    signature: str


def signature(path: str, operation: str, user: str, token: str, expiration: int | None) -> str:
    raw = f"{path}:{operation}:{user}:{token}" + ("" if expiration is None else f":{expiration}")
    return "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()


def claim(method: str, path: str, query_string: bytes) -> Claim | None:
    """A well-formed, unexpired signed URL's claim, or None. One of each parameter (the file and user it covers
    must be the ones the request acts on), and a user without a ``:`` (the signed text has no escaping)."""
    if path != FILES_PATH or (operation := OPERATIONS.get(method)) is None or len(query_string) > MAX_QUERY:
        return None
    query = QueryParams(query_string)
    if any(len(query.getlist(name)) > 1 for name in ("path", "username", "signature", "signature_expiration")):
        return None
    presented, file = query.get("signature", ""), query.get("path")
    user, expiration = query.get("username", ""), query.get("signature_expiration")
    if not SIGNATURE.match(presented) or file is None or ":" in user:
        return None
    expires = None
    if expiration is not None:
        if not (expiration.isascii() and expiration.isdigit() and len(expiration) <= 12):
            return None
        expires = int(expiration)
        if expires < time.time():
            return None
    return Claim(file, operation, user, expires, presented)


def signed_by(token: str, made: Claim) -> bool:
    expected = signature(made.file, made.operation, made.user, token, made.expires)
    return hmac.compare_digest(expected.encode(), made.signature.encode())


def signed_with(token: str, method: str, path: str, query_string: bytes) -> bool:
    """Whether a request for ``path`` carries a valid, unexpired signature made with the envd ``token``."""
    made = claim(method, path, query_string)
    return made is not None and signed_by(token, made)


def signer(candidates: Iterable[tuple[str, str]], method: str, path: str, query_string: bytes) -> str | None:
    """The sandbox id among ``(id, envd token)`` pairs whose token signed the request, or None: the request is
    parsed and checked once, then each candidate costs one hash."""
    if path != FILES_PATH or b"signature=" not in query_string or (made := claim(method, path, query_string)) is None:
        return None
    for sandbox_id, token in candidates:
        if signed_by(token, made):
            return sandbox_id
    return None
