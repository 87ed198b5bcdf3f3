"""The code interpreter's room: ``run_code`` and its contexts, carried to the kernel server in the sandbox.

The server (:mod:`stasis.kernels.server`) speaks E2B's code-interpreter API on port 49999; E2B's SDKs reach it
through the E2B face's port proxy, stasis' SDK through the routes over this room. This room finds the server, or
starts it (a background process of the sandbox, so it is suspended, checkpointed and forked with it), then
relays one request over the connection exposed ports use (which resumes a suspended sandbox first). While an
execution streams, the sandbox counts as in use: idle suspend waits for it. An execution's lines are passed on as
they come; an answer read whole (a context, a listing, an error) is bounded by ``ANSWER_LIMIT``: the server is a
process of the sandbox, and what it says is untrusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import h11

from ...code_models import CodeRequest
from ...errors import GuestError, InvalidRequest, NotFound, StasisError
from ...kernels import IMAGE, PORT, SERVER_NAME, bootstrap
from ..core.service import SandboxService
from .operations import GuestOperations
from .ports import Ports
from .resident import Resident

log = logging.getLogger(__name__)

START_TIMEOUT = 120.0  # seconds for the server to answer after it was started (a loaded TCG guest is slow)
READ_SIZE = 1 << 16
ANSWER_LIMIT = 4 << 20  # bytes of an answer the daemon reads whole (a context listing is a few hundred)


class CodeRoom:
    def __init__(self, core: SandboxService, ports: Ports, ops: GuestOperations) -> None:
        self.core = core
        self.server = Resident(core, ports, ops, name=SERVER_NAME, port=PORT, what="the code interpreter",
                               argv=lambda _: bootstrap(), exited=_exited, start_timeout=START_TIMEOUT)  # fmt: skip

    async def execute(
        self, ref: str, request: CodeRequest, failed: Callable[[StasisError], dict[str, Any]]
    ) -> AsyncIterator[bytes]:
        """An execution's JSON lines as they come. An error before the first (no such context, no Jupyter) raises,
        for the caller to answer with an HTTP error; one after it becomes the line ``failed(error)``."""
        chunks = self.stream(ref, "POST", "/execute", request.model_dump(exclude_none=True))
        first = await anext(chunks, b"")

        async def lines() -> AsyncIterator[bytes]:
            yield first
            try:
                async for chunk in chunks:
                    yield chunk
            except StasisError as exc:
                yield b"\n" + json.dumps(failed(exc)).encode() + b"\n"

        return lines()

    async def call(self, ref: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A request whose answer is one JSON document."""
        return json.loads(await _whole(self.stream(ref, method, path, body), f"{method} {path}") or b"null")

    async def stream(
        self, ref: str, method: str, path: str, body: dict[str, Any] | None = None
    ) -> AsyncGenerator[bytes, None]:
        """The answer's body as it comes; an error answer raises before the first chunk."""
        info = self.core.lookup(ref)
        with self.core.activity.busy(info.id):
            reader, writer = await self.server.connect(info.id)
            try:
                connection = h11.Connection(h11.CLIENT)
                data = json.dumps(body).encode() if body is not None else b""
                headers = [("host", "stasis"), ("content-type", "application/json"), ("content-length", str(len(data)))]
                writer.write(connection.send(h11.Request(method=method, target=path, headers=headers)))
                writer.write(connection.send(h11.Data(data=data)) + connection.send(h11.EndOfMessage()))
                await writer.drain()
                status, events = await _response(connection, reader)
                if status >= 400:
                    raise _error(status, await _whole(events, f"{method} {path}"))
                async for chunk in events:
                    yield chunk
            finally:
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()

    async def ensure(self, sandbox_id: str) -> None:
        """The server answering in the sandbox, started if it was not."""
        await self.server.ensure(sandbox_id)


def _exited(said: str) -> str:
    return (
        f"run_code needs Jupyter in the sandbox; the `{IMAGE}` image has it "
        f"(Sandbox.create(image={IMAGE!r})). Its kernel server exited: {said}"
    )


async def _response(
    connection: h11.Connection, reader: asyncio.StreamReader
) -> tuple[int, AsyncGenerator[bytes, None]]:
    """The status, and the body as it arrives (the server ends it by closing)."""
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await reader.read(READ_SIZE))
            continue
        if isinstance(event, h11.Response):
            break
        if isinstance(event, h11.ConnectionClosed):
            raise StasisError("the code interpreter closed the connection without an answer")

    async def body() -> AsyncGenerator[bytes, None]:
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(await reader.read(READ_SIZE))
            elif isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return

    return event.status_code, body()


async def _whole(chunks: AsyncGenerator[bytes, None], what: str) -> bytes:
    """An answer read whole, up to ANSWER_LIMIT bytes (an answer over that is an error, read no further)."""
    data = bytearray()
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            data += chunk
            if len(data) > ANSWER_LIMIT:
                raise GuestError(
                    f"the code interpreter's answer to {what} passed {ANSWER_LIMIT >> 20} MiB and was not read "
                    "further: its server in the sandbox misbehaves (`stasis logs` on its process shows what it said)"
                )
    return bytes(data)


def _error(status: int, text: bytes) -> StasisError:
    try:
        message = str(json.loads(text)["message"])
    except (ValueError, KeyError, TypeError):
        message = text.decode(errors="replace") or f"the code interpreter answered HTTP {status}"
    return NotFound(message) if status == 404 else InvalidRequest(message)
