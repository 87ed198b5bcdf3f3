"""The host's typed client of the guest agent: ``await channel.call(P.Exec(cmd=[...]))``.

Every request is a :mod:`protocol` dataclass and every reply comes back as its
result dataclass; errors the agent reports become the matching :mod:`stasis.errors`
class. This is the only place that puts operation names on the wire.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from ..errors import (
    FileError,
    FileNotFound,
    GuestError,
    GuestTimeout,
    InvalidRequest,
    NoSpace,
    ProcessNotFound,
    StasisError,
    StateError,
    Unsupported,
    WorkdirNotFound,
)
from . import protocol as P
from .channel import JsonLinesChannel

R = TypeVar("R")
K = P.ErrorKind

GUEST_ERRORS: dict[str, type[StasisError]] = {
    K.FILE_NOT_FOUND: FileNotFound,
    K.IS_A_DIRECTORY: FileError,
    K.NOT_A_DIRECTORY: FileError,
    K.FILE_EXISTS: FileError,
    K.PERMISSION: FileError,
    K.OS_ERROR: FileError,
    K.NO_SPACE: NoSpace,
    K.PROCESS_NOT_FOUND: ProcessNotFound,
    K.PROCESS_EXITED: StateError,
    K.INVALID: InvalidRequest,
    K.REFUSED: GuestError,
    K.NO_WORKDIR: WorkdirNotFound,
    K.COMMAND_NOT_FOUND: InvalidRequest,
    K.UNKNOWN_OPERATION: Unsupported,
    K.STALE: GuestError,
    K.EXPIRED: GuestTimeout,
    K.AGENT_BUG: GuestError,
}


def error_from_guest(error: dict[str, Any]) -> StasisError:
    kind = str(error.get("type", K.AGENT_BUG))
    cls = GUEST_ERRORS.get(kind, GuestError)
    message = str(error.get("message", kind))
    if kind == K.NO_SPACE:
        message += "; the sandbox's disk is full: delete files in it, or create it with a larger disk_mb"
    return cls(message, guest_error=kind)


class GuestChannel(JsonLinesChannel):
    boot_id = ""  # of the agent this channel talks to, learnt from its health reply

    async def call(self, request: P.Operation[R], timeout: float | None = 30.0) -> R:
        """Send one request and wait for its reply; raise the mapped error if the agent failed."""
        message: dict[str, Any] = {"op": request.op, "args": P.encode(request)}
        if self.boot_id:
            message["boot"] = self.boot_id  # a rebooted agent refuses it instead of running it
        reply = await self._request(message, timeout)
        if not reply.get("ok"):
            raise error_from_guest(reply.get("error") or {})
        try:
            result = P.decode(request.result, reply.get("result") or {})
        except TypeError as exc:
            raise GuestError(f"the agent in {self.label} sent a malformed {request.op!r} reply: {exc}") from exc
        if isinstance(result, P.HealthInfo | P.IdentityInfo) and result.boot_id:
            self.boot_id = result.boot_id
        return result  # type: ignore[no-any-return]

    async def wait_ready(self, timeout: float) -> P.HealthInfo:
        """Poll ``health`` until the agent answers (it may still be starting)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                health = await self.call(P.Health(), timeout=max(0.05, min(1.0, deadline - loop.time())))
            except GuestTimeout:
                if loop.time() >= deadline:
                    raise GuestTimeout(f"the agent in {self.label} did not start within {timeout:.0f}s") from None
                continue
            return health
