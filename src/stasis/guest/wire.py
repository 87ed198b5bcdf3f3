"""The guest protocol's framing vocabulary: its version, the error kinds, and how a dataclass becomes a
wire dict and back. Standard library only (shipped into every sandbox beside the agent)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Generic, TypeVar

R = TypeVar("R")

VERSION = 4  # 2: boot ids (requests sent before the agent booted are refused); 3: expiry ("expires"); 4: cancel lines

# A line ``{"cancel":"<request id>"}`` (no reply): the host gave up on that request. The agent drops a request
# whose cancel arrives with it, so a request that waited in the channel while the guest was stopped never runs,
# whatever the guest's clock says.
CANCEL_PREFIX = b'{"cancel":'


def cancel_line(request_id: str) -> bytes:
    return b'{"cancel":"' + request_id.encode() + b'"}\n'


class ErrorKind:
    """The ``type`` of an error reply: what went wrong, named for what the caller can do."""

    FILE_NOT_FOUND = "FileNotFoundError"
    IS_A_DIRECTORY = "IsADirectoryError"
    NOT_A_DIRECTORY = "NotADirectoryError"
    FILE_EXISTS = "FileExistsError"
    PERMISSION = "PermissionError"
    NO_SPACE = "NoSpace"  # ENOSPC/EDQUOT: the sandbox's disk is full
    OS_ERROR = "OSError"
    PROCESS_NOT_FOUND = "ProcessNotFound"
    PROCESS_EXITED = "ProcessExited"
    INVALID = "ValueError"
    NO_WORKDIR = "NoWorkdir"  # a command's working directory is not there
    REFUSED = "ConnectionRefused"  # nothing listens on that port in the sandbox
    COMMAND_NOT_FOUND = "CommandNotFound"
    UNKNOWN_OPERATION = "UnknownOperation"  # the agent is older than the host's request
    STALE = "StaleRequest"  # sent to an earlier boot of the agent; never executed
    EXPIRED = "ExpiredRequest"  # reached the agent after the host stopped waiting for it; never executed
    AGENT_BUG = "AgentError"


def decode(cls: type[Any], data: dict[str, Any]) -> Any:
    """A dataclass from its wire dict: unknown keys are ignored, nested results follow ``metadata['of']``."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} must be a JSON object, got {type(data).__name__}")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, inner = data[f.name], f.metadata.get("of")
        if inner is not None and isinstance(value, list):
            value = [decode(inner, item) for item in value]
        elif inner is not None and value is not None:
            value = decode(inner, value)
        values[f.name] = value
    return cls(**values)


def encode(obj: Any, keep_none: bool = False) -> dict[str, Any]:
    """The wire dict of a dataclass. A request leaves ``None`` out (the agent's default applies);
    a result keeps it (``None`` means something there: no exit code yet, no name)."""
    fields = dataclasses.asdict(obj)
    return fields if keep_none else {k: v for k, v in fields.items() if v is not None}


class Operation(Generic[R]):
    """A request's arguments. ``op`` names it on the wire; ``result`` the dataclass of its reply."""

    op: ClassVar[str]
    result: ClassVar[type]


@dataclasses.dataclass
class Empty:
    """The result of an operation that answers nothing but "done"."""
