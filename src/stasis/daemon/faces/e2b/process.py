"""envd's ``process.Process`` service over the guest agent: commands, PTYs and their streams, by pid.

A command started here is an agent process (id ``e2b-…``, its tag as its name; a PTY is an agent terminal), so
stasis' own API sees it too. Its output streams from the agent's buffers: a client that connects later
(``Connect``) gets what comes from then on, as from envd. Each call holds the sandbox in use for as long as it
streams (never idle-suspended under a running ``commands.run``), and resumes a paused sandbox first.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.process import process_pb as pb
from protobuf import Oneof

from ....errors import StasisError, echo
from ....guest import protocol as P
from ...core.service import SandboxService
from ...rooms.operations import GuestOperations
from .records import Records
from .requests import absolute, caller, home_of, rpc_error, sandbox_error

log = logging.getLogger(__name__)

OUTPUT_BUFFER = 16 << 20  # bytes of each stream the agent keeps for a reader that lags
READ_WAIT = 10.0  # seconds a read waits for output before a keepalive goes out
SIGNALS = {pb.Signal.SIGKILL: "SIGKILL", pb.Signal.SIGTERM: "SIGTERM"}


class ProcessService:
    def __init__(self, core: SandboxService, ops: GuestOperations, records: Records) -> None:
        self.core = core
        self.ops = ops
        self.records = records

    # -- starting and following

    async def start(self, request: pb.StartRequest, ctx: RequestContext[Any, Any]) -> AsyncIterator[pb.StartResponse]:
        sandbox_id, user = caller(ctx)
        config = request.process or pb.ProcessConfig()
        if not config.cmd:
            raise ConnectError(Code.INVALID_ARGUMENT, "process.cmd is empty: name the program to run")
        record = self.records.get(sandbox_id)
        env = {**(record.envs if record else {}), **dict(config.envs)}
        defaults = self.ops.command_defaults(sandbox_id, env, None, user)
        if config.has_field("cwd") and config.cwd:  # envd's: a relative cwd starts at the user's home
            defaults["cwd"] = absolute(config.cwd, defaults["user"])
        elif user is not None:
            defaults["cwd"] = home_of(user)
        cmd = [config.cmd, *config.args]
        start: P.OpenPty | P.StartProcess
        if request.pty is not None:
            size = request.pty.size or pb.PTY.Size(cols=80, rows=24)
            start = P.OpenPty(cmd=cmd, cols=size.cols, rows=size.rows, **defaults)
        else:
            start = P.StartProcess(
                cmd=cmd, id=f"e2b-{secrets.token_hex(6)}", name=request.tag if request.has_field("tag") else None,
                stdin=bool(request.stdin), max_output=OUTPUT_BUFFER, paced=True, **defaults,
            )  # fmt: skip
        async with self._guest(sandbox_id) as channel:
            state = await self._call(channel, start)
            yield pb.StartResponse(event=event("start", pb.ProcessEvent.StartEvent(pid=state.pid)))
            async for update in self._follow(channel, state.id, 0, 0, pty=request.pty is not None):
                yield pb.StartResponse(event=update)

    async def connect(
        self, request: pb.ConnectRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.ConnectResponse]:
        sandbox_id, _ = caller(ctx)
        async with self._guest(sandbox_id) as channel:
            state = await self._find(channel, request.process)
            yield pb.ConnectResponse(event=event("start", pb.ProcessEvent.StartEvent(pid=state.pid)))
            pty = state.id.startswith("t")  # the agent's terminals are t1, t2...
            following = self._follow(channel, state.id, state.stdout_bytes, state.stderr_bytes, pty=pty)
            async for update in following:
                yield pb.ConnectResponse(event=update)

    async def _follow(
        self, channel: Any, process_id: str, out: int, err: int, pty: bool = False
    ) -> AsyncIterator[pb.ProcessEvent]:
        """Its output from these offsets, then its end; a keepalive whenever it is quiet for READ_WAIT. A
        terminal's output is all on stdout, and goes out as ``pty`` data."""
        while True:
            read = P.ReadStreams(process_id, out, err, max_bytes=1 << 20, wait=READ_WAIT)
            reply = await channel.call(read, timeout=READ_WAIT + 60)
            quiet = True
            for name, part in (("stdout", reply.stdout), ("stderr", reply.stderr)):
                if part.lost:
                    log.warning(
                        "%s: a reader of %s fell behind; %d bytes of its %s lost", process_id, name, part.lost, name
                    )
                if part.data:
                    quiet = False
                    kind = "pty" if pty else name
                    data = pb.ProcessEvent.DataEvent(output=Oneof(kind, base64.b64decode(part.data)))
                    yield event("data", data)
            out, err = reply.stdout.next_offset, reply.stderr.next_offset
            drained = reply.stdout.eof and reply.stderr.eof
            if reply.exit_code is not None and (drained or quiet):
                code = reply.exit_code
                status = f"exit status {code}" if code >= 0 else f"signal: {-code}"
                end = pb.ProcessEvent.EndEvent(exit_code=code, exited=True, status=status)
                yield event("end", end)
                return
            if quiet:
                yield event("keepalive", pb.ProcessEvent.KeepAlive())

    # -- the rest

    async def list(self, request: pb.ListRequest, ctx: RequestContext[Any, Any]) -> pb.ListResponse:
        sandbox_id, _ = caller(ctx)
        async with self._guest(sandbox_id) as channel:
            listing = await channel.call(P.ListProcesses())
        return pb.ListResponse(
            processes=[
                pb.ProcessInfo(
                    pid=p.pid,
                    tag=p.name,
                    config=pb.ProcessConfig(cmd=p.cmd[0] if p.cmd else "", args=p.cmd[1:], envs={}),
                )
                for p in listing.processes
                if p.status == "running"
            ]
        )

    async def send_input(self, request: pb.SendInputRequest, ctx: RequestContext[Any, Any]) -> pb.SendInputResponse:
        sandbox_id, _ = caller(ctx)
        async with self._guest(sandbox_id) as channel:
            state = await self._find(channel, request.process)
            await self._call(channel, input_op(state.id, request.input))
        return pb.SendInputResponse()

    async def stream_input(
        self, requests: AsyncIterator[pb.StreamInputRequest], ctx: RequestContext[Any, Any]
    ) -> pb.StreamInputResponse:
        sandbox_id, _ = caller(ctx)
        async with self._guest(sandbox_id) as channel:
            process_id = None
            async for message in requests:
                match message.event:
                    case Oneof("start", start):
                        process_id = (await self._find(channel, start.process)).id
                        continue
                    case Oneof("data", data_event):
                        if process_id is None:
                            raise ConnectError(Code.FAILED_PRECONDITION, "the input stream must name a process first")
                        await self._call(channel, input_op(process_id, data_event.input))
        return pb.StreamInputResponse()

    async def close_stdin(self, request: pb.CloseStdinRequest, ctx: RequestContext[Any, Any]) -> pb.CloseStdinResponse:
        sandbox_id, _ = caller(ctx)
        async with self._guest(sandbox_id) as channel:
            state = await self._find(channel, request.process)
            await self._call(channel, P.WriteStdin(id=state.id, close=True))
        return pb.CloseStdinResponse()

    async def send_signal(self, request: pb.SendSignalRequest, ctx: RequestContext[Any, Any]) -> pb.SendSignalResponse:
        sandbox_id, _ = caller(ctx)
        signal = SIGNALS.get(request.signal)
        if signal is None:
            raise ConnectError(Code.INVALID_ARGUMENT, f"signal {request.signal!r}: only SIGKILL and SIGTERM are sent")
        async with self._guest(sandbox_id) as channel:
            state = await self._find(channel, request.process)
            await self._call(channel, P.SignalProcess(id=state.id, signal=signal, tree=True))
        return pb.SendSignalResponse()

    async def update(self, request: pb.UpdateRequest, ctx: RequestContext[Any, Any]) -> pb.UpdateResponse:
        """A terminal's new size."""
        sandbox_id, _ = caller(ctx)
        if request.pty is None or request.pty.size is None:
            return pb.UpdateResponse()
        async with self._guest(sandbox_id) as channel:
            state = await self._find(channel, request.process)
            size = request.pty.size
            await self._call(channel, P.ResizePty(id=state.id, cols=size.cols, rows=size.rows))
        return pb.UpdateResponse()

    async def _find(self, channel: Any, selector: pb.ProcessSelector | None) -> P.ProcessState:
        """A running process by pid or tag: NOT_FOUND otherwise (what the SDKs' kill and connect expect)."""
        listing = await channel.call(P.ListProcesses())
        running = [p for p in listing.processes if p.status == "running"]
        match selector.selector if selector is not None else None:
            case Oneof("pid", pid):
                found, what = [p for p in running if p.pid == pid], f"pid {pid}"
            case Oneof("tag", tag):
                found, what = [p for p in running if p.name == tag], f"tag {echo(tag)}"
            case _:
                raise ConnectError(Code.INVALID_ARGUMENT, "name the process by pid or tag")
        if not found:
            raise ConnectError(Code.NOT_FOUND, f"process with {what} not found")
        return found[0]

    @contextlib.asynccontextmanager
    async def _guest(self, sandbox_id: str) -> AsyncIterator[Any]:
        """The sandbox's channel (resumed first); what fails in its block is the Connect error the SDKs expect."""
        try:
            async with self.core.guest(sandbox_id) as channel:
                yield channel
        except StasisError as exc:
            raise sandbox_error(self.core, sandbox_id, exc) from exc

    @staticmethod
    async def _call(channel: Any, op: Any) -> Any:
        try:
            return await channel.call(op)
        except StasisError as exc:
            raise rpc_error(exc) from exc


def event(kind: str, value: Any) -> pb.ProcessEvent:
    return pb.ProcessEvent(event=Oneof(kind, value))


def input_op(process_id: str, given: pb.ProcessInput | None) -> P.WriteStdin | P.WritePty:
    match given.input if given is not None else None:
        case Oneof("pty", data):
            return P.WritePty(id=process_id, data=base64.b64encode(bytes(data)).decode())
        case Oneof("stdin", data):
            return P.WriteStdin(id=process_id, data=base64.b64encode(bytes(data)).decode())
    return P.WriteStdin(id=process_id, data="")
