"""The one exception hierarchy, shared by the daemon and the SDK.

    StasisError
    ├── InvalidRequest (ValueError)          400  fix the request: a bad name, spec, path or signal
    │   ├── Unsupported                          asks for what this host or build cannot do
    │   ├── BuildError                           an image build step failed (its output is in the message)
    │   └── TemplateNotReady                     a template's ready command did not pass in time
    ├── NotFound (LookupError)               404
    │   ├── SandboxNotFound
    │   ├── ImageNotFound
    │   ├── ProcessNotFound
    │   ├── CheckpointNotFound
    │   ├── VolumeNotFound
    │   ├── RunNotFound                      an agent run
    │   └── FileNotFound (FileNotFoundError)
    ├── FileError (OSError)                  400  the path exists but is the wrong kind of thing
    ├── NoSpace (OSError)                    507  a disk is full (the sandbox's, or the host's)
    ├── Conflict                             409
    │   ├── NameTaken
    │   ├── StateError                           wrong lifecycle state; carries ``status`` and ``required``
    │   ├── Incompatible                         made by another runtime build, or its kernel/machine is gone
    │   ├── DaemonRunning                        another daemon serves this STASIS_HOME
    │   └── CheckpointCorrupt                    its bytes changed since it was sealed
    ├── BackendError                         500  runsc/QEMU failed; the message has its output
    │   ├── StartupError
    │   └── StoreUnreachable                     the remote store (S3) did not answer or refused
    ├── GuestError                           502  the agent inside the sandbox failed
    │   ├── GuestDisconnected (ConnectionError)
    │   └── GuestTimeout (TimeoutError)
    ├── PoolNotReady                         504  a pool did not fill in time
    ├── ModelError                           502  the harness's model endpoint failed after its retries
    └── DaemonUnavailable (ConnectionError)  503  the SDK could not reach or start the daemon

Over HTTP an error travels as ``{"type": ..., "message": ..., "details": {...}}`` with
the status code above; the SDK turns it back into the class named by ``type``. What a client sent
can come back in a message (a name that is not there): ``to_payload`` clips every long run of it,
so a response never echoes more than ``ECHO_KEEP`` characters of one value.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

ECHO_KEEP = 80
LONG_RUN = re.compile(r"[^ \n]{121,}")  # a run ends only at a plain space or newline (\x85 is a \s too)
MESSAGE_LIMIT = 4000


def clip(text: str) -> str:
    """``text`` with each run of over 120 characters without a space or newline cut to ``ECHO_KEEP`` (saying
    how much was left out), and at most ``MESSAGE_LIMIT`` characters in all."""
    text = LONG_RUN.sub(lambda m: f"{m.group()[:ECHO_KEEP]}…[{len(m.group()) - ECHO_KEEP} more characters]", text)
    if len(text) > MESSAGE_LIMIT:
        text = f"{text[:MESSAGE_LIMIT]}…[{len(text) - MESSAGE_LIMIT} more characters]"
    return text


def echo(value: str) -> str:
    """A value a client sent, quoted for a message: at most ``ECHO_KEEP`` characters of it."""
    return repr(value) if len(value) <= ECHO_KEEP else f"{value[:ECHO_KEEP]!r}…"


class StasisError(Exception):
    status_code: ClassVar[int] = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return self.message

    def to_payload(self) -> dict[str, Any]:
        details = {k: clip(v) if isinstance(v, str) else v for k, v in self.details.items()}
        return {"type": type(self).__name__, "message": clip(self.message), "details": details}


class InvalidRequest(StasisError, ValueError):
    status_code = 400


class Unauthorized(InvalidRequest):
    """No token or key, or one that does not work (wrong, expired, revoked)."""

    status_code = 401


class Unsupported(InvalidRequest):
    pass


class WorkdirNotFound(InvalidRequest):
    """A command's working directory is not in the sandbox (frameworks answer it with an exit code)."""


class NotFound(StasisError, LookupError):
    status_code = 404


class SandboxNotFound(NotFound):
    pass


class ImageNotFound(NotFound):
    pass


class ProcessNotFound(NotFound):
    pass


class CheckpointNotFound(NotFound):
    pass


class VolumeNotFound(NotFound):
    pass


class RunNotFound(NotFound):
    pass


class FileNotFound(NotFound, FileNotFoundError):
    pass


class FileError(StasisError, OSError):
    status_code = 400


class NoSpace(StasisError, OSError):
    status_code = 507


class Conflict(StasisError):
    status_code = 409


class NameTaken(Conflict):
    pass


class StateError(Conflict):
    """The sandbox is in the wrong lifecycle state: ``details`` has its ``status`` and the ``required`` one."""


class Incompatible(Conflict):
    pass


class DaemonRunning(Conflict):
    pass


class CheckpointCorrupt(Conflict):
    pass


class BackendError(StasisError):
    status_code = 500


class StartupError(BackendError):
    pass


class StoreUnreachable(BackendError):
    status_code = 502


class GuestError(StasisError):
    status_code = 502


class GuestDisconnected(GuestError, ConnectionError):
    pass


class GuestTimeout(GuestError, TimeoutError):
    pass


class DaemonUnavailable(StasisError, ConnectionError):
    status_code = 503


class BuildError(InvalidRequest):
    """A build step failed: its output and exit code are in the message."""


class PoolNotReady(StasisError):
    """The pool did not fill in time; the message says how far it got and why it last failed."""

    status_code = 504


class TemplateNotReady(InvalidRequest):
    """The ready command did not pass in time; the message has its output and the start command's."""


class QuotaExceeded(StasisError):
    """A team's quota would be passed: the message says what is used, the limit, and what to do."""

    status_code = 429


class Forbidden(StasisError):
    """The key is good but lacks the scope (or the route is the daemon owner's)."""

    status_code = 403


class ModelError(StasisError):
    """The agent harness's model endpoint failed after its retries."""

    status_code = 502


def _all_subclasses(cls: type[StasisError]) -> dict[str, type[StasisError]]:
    found = {cls.__name__: cls}
    for sub in cls.__subclasses__():
        found.update(_all_subclasses(sub))
    return found


ERROR_TYPES: dict[str, type[StasisError]] = _all_subclasses(StasisError)


def error_from_payload(payload: dict[str, Any], status_code: int) -> StasisError:
    """Rebuild an error sent by the daemon; unknown types become the base class."""
    cls = ERROR_TYPES.get(str(payload.get("type")), StasisError)
    details = payload.get("details") or {}
    return cls(str(payload.get("message") or f"daemon answered HTTP {status_code}"), **details)
