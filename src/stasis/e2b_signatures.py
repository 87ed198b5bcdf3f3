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
import time
from collections.abc import Iterable

from starlette.datastructures import QueryParams

FILES_PATH = "/files"
OPERATIONS = {"GET": "read", "POST": "write"}


def signature(path: str, operation: str, user: str, token: str, expiration: int | None) -> str:
    raw = f"{path}:{operation}:{user}:{token}" + ("" if expiration is None else f":{expiration}")
    return "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()


def signed_with(token: str, method: str, path: str, query_string: bytes) -> bool:
    """Whether a request for ``path`` carries a valid, unexpired signature made with the envd ``token``."""
    if path != FILES_PATH or (operation := OPERATIONS.get(method)) is None:
        return False
    query = QueryParams(query_string)
    presented = query.get("signature")
    # one of each: the file and user the signature covers must be the ones the request acts on
    if not presented or any(len(query.getlist(name)) > 1 for name in ("path", "username", "signature_expiration")):
        return False
    file, user, expiration = query.get("path"), query.get("username", ""), query.get("signature_expiration")
    if file is None:
        return False
    expires = None
    if expiration is not None:
        if not (expiration.isascii() and expiration.isdigit() and len(expiration) <= 12):
            return False
        expires = int(expiration)
        if expires < time.time():
            return False
    expected = signature(file, operation, user, token, expires)
    return hmac.compare_digest(expected.encode(), presented.encode())


def signer(candidates: Iterable[tuple[str, str]], method: str, path: str, query_string: bytes) -> str | None:
    """The sandbox id among ``(id, envd token)`` pairs whose token signed the request, or None."""
    if path != FILES_PATH or b"signature=" not in query_string:
        return None
    for sandbox_id, token in candidates:
        if signed_with(token, method, path, query_string):
            return sandbox_id
    return None
