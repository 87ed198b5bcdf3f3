"""What a command gives back: its result (:class:`CommandResult`), its output as it comes (:class:`OutputEvent`),
and the collector that turns a run's event stream into both."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import GuestDisconnected
from ..models import RunResult

OutputCallback = Callable[[bytes], None]


@dataclass(frozen=True)
class CommandResult:
    """The outcome of ``run``. ``stdout``/``stderr`` are decoded; ``*_bytes`` are exact."""

    exec_id: str
    exit_code: int
    stdout_bytes: bytes
    stderr_bytes: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    duration: float
    limit: str | None = None  # a sandbox limit it ran into (processes, memory), said for a user

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode(errors="replace")

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated

    @classmethod
    def from_wire(cls, result: RunResult) -> CommandResult:
        return cls(
            exec_id=result.exec_id,
            exit_code=result.exit_code,
            stdout_bytes=base64.b64decode(result.stdout_b64),
            stderr_bytes=base64.b64decode(result.stderr_b64),
            stdout_truncated=result.stdout_truncated,
            stderr_truncated=result.stderr_truncated,
            timed_out=result.timed_out,
            duration=result.duration,
            limit=result.limit,
        )


@dataclass(frozen=True)
class OutputEvent:
    """One piece of a streamed run: output on ``stdout``/``stderr``, or (last) the ``exit`` event."""

    kind: str  # "stdout" | "stderr" | "exit"
    data: bytes = b""
    exit_code: int | None = None
    timed_out: bool = False
    exec_id: str = ""
    truncated: tuple[bool, bool] = (False, False)  # (stdout, stderr): the daemon could not keep up
    limit: str | None = None  # exit: a sandbox limit the command ran into


def stream_event(event: dict[str, Any]) -> OutputEvent | None:
    for kind in ("stdout", "stderr"):
        if kind in event:
            return OutputEvent(kind, base64.b64decode(event[kind]))
    if "exit_code" in event:
        truncated = (bool(event.get("stdout_truncated")), bool(event.get("stderr_truncated")))
        return OutputEvent(
            "exit", b"", event["exit_code"], event["timed_out"], event["exec_id"], truncated, event.get("limit")
        )
    return None  # the opening {"exec_id"} line


class Collector:
    """Builds a CommandResult from streamed events, feeding the callbacks on the way.

    Like a plain run, it keeps the last ``max_output`` bytes of each stream; callbacks see every byte."""

    def __init__(self, on_stdout: OutputCallback | None, on_stderr: OutputCallback | None, max_output: int) -> None:
        self.parts: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.cut = {"stdout": False, "stderr": False}
        self.callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self.max_output = max_output
        self.started = time.monotonic()
        self.result: CommandResult | None = None

    def finish(self) -> CommandResult:
        if self.result is None:
            raise GuestDisconnected("the command's output stream ended before its exit status arrived")
        return self.result

    def feed(self, event: OutputEvent) -> None:
        if event.kind == "exit":
            self.result = CommandResult(
                exec_id=event.exec_id, exit_code=event.exit_code if event.exit_code is not None else -1,
                stdout_bytes=bytes(self.parts["stdout"]), stderr_bytes=bytes(self.parts["stderr"]),
                stdout_truncated=self.cut["stdout"] or event.truncated[0],
                stderr_truncated=self.cut["stderr"] or event.truncated[1],
                timed_out=event.timed_out, duration=time.monotonic() - self.started, limit=event.limit,
            )  # fmt: skip
            return
        part = self.parts[event.kind]
        part += event.data
        if len(part) > self.max_output:
            del part[: len(part) - self.max_output]
            self.cut[event.kind] = True
        callback = self.callbacks[event.kind]
        if callback is not None:
            callback(event.data)
