"""Who an envd request is for: the sandbox (named by the dispatcher in ``e2b-sandbox-id``) and the user (envd's
HTTP Basic ``Authorization: Basic base64(user:)``; none means the image's default user)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext

from ....e2b_wire import PORT_HEADER, SANDBOX_HEADER, TOKEN_HEADER, TRAFFIC_TOKEN_HEADER
from ....errors import InvalidRequest, StasisError, clip
from ....models import SandboxStatus
from ....validation import validate_user
from ...core.service import SandboxService

__all__ = ["PORT_HEADER", "SANDBOX_HEADER", "TOKEN_HEADER", "TRAFFIC_TOKEN_HEADER", "user_of"]


def user_of(headers: Mapping[str, str]) -> str | None:
    """The user envd's Basic authorization names; InvalidRequest if it is malformed or not a user name."""
    value = headers.get("authorization")
    if not value:
        return None
    scheme, _, encoded = value.partition(" ")
    if scheme.lower() != "basic":
        raise InvalidRequest("envd's Authorization header must be Basic base64(user:)")
    try:
        user = base64.b64decode(encoded, validate=True).decode().partition(":")[0]
    except (binascii.Error, UnicodeDecodeError):
        raise InvalidRequest("envd's Authorization header must be Basic base64(user:)") from None
    if not user:
        return None
    try:
        return validate_user(user)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


def caller(ctx: RequestContext[Any, Any]) -> tuple[str, str | None]:
    headers = ctx.request_headers
    try:
        return headers[SANDBOX_HEADER], user_of(headers)
    except InvalidRequest as exc:
        raise ConnectError(Code.INVALID_ARGUMENT, clip(str(exc))) from None


def home_of(user: str | None) -> str:
    """Where a user's relative paths and commands start, as in E2B's images (``None``: root)."""
    return "/root" if user in (None, "root", "0") else f"/home/{user}"


def absolute(path: str, user: str | None) -> str:
    if not path:
        raise InvalidRequest("path is empty")
    return path if path.startswith("/") else f"{home_of(user).rstrip('/')}/{path}"


def rpc_error(exc: StasisError) -> ConnectError:
    """A stasis error as the Connect code the SDKs turn into their own exception (404: NotFoundException...)."""
    code = {
        400: Code.INVALID_ARGUMENT, 404: Code.NOT_FOUND, 409: Code.FAILED_PRECONDITION, 507: Code.RESOURCE_EXHAUSTED,
        502: Code.UNAVAILABLE, 503: Code.UNAVAILABLE,
    }.get(exc.status_code, Code.INTERNAL)  # fmt: skip
    return ConnectError(code, clip(str(exc)))


def sandbox_error(core: SandboxService, sandbox_id: str, exc: StasisError) -> ConnectError:
    """What failed under an envd call, in the SDKs' terms: a sandbox that went away (killed, its lifetime over) is
    E2B's proxy's UNAVAILABLE "was not found", which they raise as SandboxNotRunningException."""
    try:
        status = core.lookup(sandbox_id).status
    except StasisError:
        status = None
    if status is None or status in (SandboxStatus.TERMINATING, SandboxStatus.TERMINATED, SandboxStatus.FAILED):
        gone = status.value if status is not None else "gone"
        return ConnectError(Code.UNAVAILABLE, f"sandbox {sandbox_id} was not found (it is {gone})")
    return rpc_error(exc)
