"""The real guest agent, as a subprocess on FIFOs, driven through the typed channel."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from stasis.backends.base import BoxRef
from stasis.errors import FileError, FileNotFound, GuestError, GuestTimeout, InvalidRequest, NotFound, StateError
from stasis.guest import protocol as P
from stasis.guest.client import GuestChannel
from stasis.models import SandboxSpec
from tests.fakes import FakeBackend
from tests.fastkit import fake_home

pytestmark = pytest.mark.fast


@contextlib.asynccontextmanager
async def agent() -> AsyncIterator[tuple[FakeBackend, BoxRef, GuestChannel]]:
    paths = fake_home("agent")
    backend = FakeBackend(paths)
    box = BoxRef("sb-agenttest01", "agent", SandboxSpec(), paths.sandboxes / "sb-agenttest01", "k", Path("/"), {})
    channel, _ = await backend.start(box)
    try:
        yield backend, box, channel
    finally:
        await channel.close()
        await backend.stop(box, remove=True)


def run(scenario: Callable[[FakeBackend, BoxRef, GuestChannel], Awaitable[None]]) -> None:
    async def main() -> None:
        async with agent() as (backend, box, channel):
            await scenario(backend, box, channel)

    asyncio.run(main())


def text(data: str) -> str:
    return base64.b64decode(data).decode()


def test_health_names_the_boot() -> None:
    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        health = await channel.call(P.Health())
        assert health.version == P.VERSION and len(health.boot_id) == 16
        assert channel.boot_id == health.boot_id

    run(scenario)


def test_exec_runs_with_stdin_env_and_cwd(tmp_path: Path) -> None:
    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        op = P.Exec(cmd=["sh", "-c", 'cat; echo "$WHO"; pwd'], env={"WHO": "me"}, cwd=str(tmp_path),
                    stdin=True, stdin_data=base64.b64encode(b"in\n").decode())  # fmt: skip
        result = await channel.call(op)
        assert (result.exit_code, text(result.stdout)) == (0, f"in\nme\n{tmp_path}\n")

    run(scenario)


def test_a_timed_out_command_is_killed_with_its_children() -> None:
    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        result = await channel.call(P.Exec(cmd=["sh", "-c", "sleep 30 & sleep 30"], timeout=0.3))
        assert result.timed_out and result.exit_code != 0
        assert result.duration < 10

    run(scenario)


def test_output_over_max_output_keeps_the_tail_and_says_so() -> None:
    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        result = await channel.call(P.Exec(cmd=["sh", "-c", "seq 1 20000"], max_output=100))
        out = text(result.stdout)
        assert result.stdout_truncated and len(out) == 100 and out.endswith("19999\n20000\n")

    run(scenario)


def test_a_run_is_reattached_by_its_exec_id_not_run_twice(tmp_path: Path) -> None:
    counter = tmp_path / "runs"

    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        op = P.Exec(cmd=["sh", "-c", f"echo x >> {counter}; sleep 0.5; echo done"], exec_id="x-reattach")
        first = asyncio.ensure_future(channel.call(op, timeout=None))
        await asyncio.sleep(0.2)
        await channel.close()  # the client dies mid-command
        with pytest.raises(GuestError):
            await first
        again = await backend.connect(box)
        try:
            result = await again.call(op, timeout=None)
        finally:
            await again.close()
        assert text(result.stdout) == "done\n"
        assert counter.read_text() == "x\n"

    run(scenario)


def test_a_request_for_another_boot_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        channel.boot_id = "0123456789abcdef"  # as if this request had waited in a pipe across a reboot
        with pytest.raises(GuestError, match="not executed"):
            await channel.call(P.Exec(cmd=["touch", str(marker)]))
        assert not marker.exists()

    run(scenario)


def test_an_unknown_operation_is_unsupported_not_a_crash() -> None:
    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        reply = await channel._request({"op": "teleport", "args": {}}, 5)
        assert reply["error"]["type"] == P.ErrorKind.UNKNOWN_OPERATION
        with pytest.raises(InvalidRequest, match="bad arguments"):
            await channel.call(P.GetProcess(id=None))  # type: ignore[arg-type]
        assert (await channel.call(P.Health())).pid > 0

    run(scenario)


def test_background_process_streams_and_exit(tmp_path: Path) -> None:
    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        start = await channel.call(P.StartProcess(cmd=["sh", "-c", "echo out; echo err >&2; exit 3"], name="job"))
        assert start.name == "job"
        out = err = ""
        offsets = [0, 0]
        while True:
            streams = await channel.call(P.ReadStreams(start.id, offsets[0], offsets[1], wait=1.0))
            out, err = out + text(streams.stdout.data), err + text(streams.stderr.data)
            offsets = [streams.stdout.next_offset, streams.stderr.next_offset]
            if streams.exit_code is not None and streams.stdout.eof and streams.stderr.eof:
                break
        assert (out, err, streams.exit_code) == ("out\n", "err\n", 3)
        listing = await channel.call(P.ListProcesses())
        assert [p.id for p in listing.processes] == [start.id]
        with pytest.raises(StateError, match="already exited"):
            await channel.call(P.SignalProcess(id=start.id))

    run(scenario)


def test_a_slow_reader_loses_the_oldest_output_and_is_told() -> None:
    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        start = await channel.call(P.StartProcess(cmd=["sh", "-c", "seq 1 5000"], max_output=64))
        while (await channel.call(P.GetProcess(id=start.id))).exit_code is None:
            await asyncio.sleep(0.02)
        chunk = await channel.call(P.ReadOutput(id=start.id, offset=0))
        assert chunk.lost > 0 and chunk.offset == chunk.lost and text(chunk.data).endswith("5000\n")

    run(scenario)


def test_chunked_writes_are_atomic_and_binary_safe(tmp_path: Path) -> None:
    target = tmp_path / "blob"
    payload = bytes(range(256)) * 10

    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        half = len(payload) // 2
        for offset, part, final in ((0, payload[:half], False), (half, payload[half:], True)):
            data = base64.b64encode(part).decode()
            await channel.call(P.WriteFile(str(target), data, offset, final, upload_id="u1", mode=0o600))
            assert target.exists() == final  # the target appears only with the last chunk
        assert target.read_bytes() == payload and (target.stat().st_mode & 0o777) == 0o600
        read = await channel.call(P.ReadFile(path=str(target), offset=10, length=5))
        assert base64.b64decode(read.data) == payload[10:15] and not read.eof

    run(scenario)


def test_an_interrupted_upload_leaves_no_temp_file_after_the_agent_restarts(tmp_path: Path) -> None:
    target = tmp_path / "big"

    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        await channel.call(P.WriteFile(str(target), base64.b64encode(b"x").decode(), 0, False, upload_id="u2"))
        assert [p.name for p in tmp_path.iterdir()] == [".big.stasis-u2"]
        await channel.close()
        await backend.stop(box)
        restarted, _ = await backend.start(box)  # a cold boot of the same sandbox
        try:
            for _ in range(100):
                if not any(tmp_path.iterdir()):
                    break
                await asyncio.sleep(0.05)
        finally:
            await restarted.close()
        assert list(tmp_path.iterdir()) == []

    run(scenario)


def test_file_errors_say_what_is_wrong(tmp_path: Path) -> None:
    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        with pytest.raises(FileNotFound):
            await channel.call(P.ReadFile(path=str(tmp_path / "missing")))
        with pytest.raises(FileError, match="is a directory"):
            await channel.call(P.ReadFile(path=str(tmp_path)))
        with pytest.raises(FileError, match="not a directory"):
            (tmp_path / "f").write_text("x")
            await channel.call(P.ListDir(path=str(tmp_path / "f")))
        with pytest.raises(InvalidRequest, match="NUL"):
            await channel.call(P.StatFile(path="a\0b"))
        with pytest.raises(InvalidRequest, match="command not found"):
            await channel.call(P.Exec(cmd=["no-such-command-here"]))

    run(scenario)


def test_replies_travel_as_one_json_line_each() -> None:
    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        replies = await asyncio.gather(*(channel.call(P.Exec(cmd=["echo", str(i)])) for i in range(20)))
        assert [text(r.stdout) for r in replies] == [f"{i}\n" for i in range(20)]
        assert json.loads(json.dumps(P.encode(replies[0], keep_none=True)))["exit_code"] == 0
        assert os.path.exists(box.directory / "from_guest.fifo")

    run(scenario)


def test_a_request_cancelled_before_the_agent_read_it_never_runs(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The agent is stopped while a request waits in its channel, and its clock is an hour behind the host's
    (as a microVM's can fall behind while QEMU is stopped), so expiry cannot refuse the request: the cancel
    line the channel sends when it gives up reaches the agent with the request, and the request never runs."""
    import stasis.guest.channel as channel_module

    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        await channel.call(P.Health())
        pid = backend.pid(box)
        assert pid is not None
        marker = tmp_path / "ran"
        real_time = channel_module.time.time
        monkeypatch.setattr(channel_module.time, "time", lambda: real_time() + 3600)
        os.killpg(pid, signal.SIGSTOP)
        try:
            with pytest.raises(GuestTimeout):
                await channel.call(P.Exec(cmd=["touch", str(marker)]), timeout=1)
            await asyncio.sleep(0.5)  # the cancel line is written behind the request
        finally:
            os.killpg(pid, signal.SIGCONT)
        monkeypatch.undo()
        await channel.call(P.Exec(cmd=["true"]))  # answered after the agent has read what waited before it
        assert not marker.exists()
        assert (await channel.call(P.Exec(cmd=["touch", str(marker)]), timeout=30)).exit_code == 0
        assert marker.exists()

    run(scenario)


def test_a_recursive_watch_reports_what_happens_below_a_directory_made_after_it_started(tmp_path: Path) -> None:
    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        watch = await channel.call(P.StartWatch(path=str(tmp_path), recursive=True))
        (tmp_path / "sub").mkdir()
        await channel.call(P.ReadWatch(id=watch.id, wait=5))  # the mkdir: the new directory is watched from now
        (tmp_path / "sub" / "f").write_text("x")
        (tmp_path / "sub" / "f").rename(tmp_path / "g")
        (tmp_path / "g").unlink()
        seen: list[tuple[str, str]] = []
        while ("g", "remove") not in seen:
            batch = await channel.call(P.ReadWatch(id=watch.id, wait=5))
            assert batch.events, f"no more events after {seen}"
            seen += [(e.name, e.type) for e in batch.events]
        assert seen.index(("sub/f", "create")) < seen.index(("sub/f", "write")) < seen.index(("sub/f", "rename"))
        assert ("g", "create") in seen
        await channel.call(P.StopWatch(id=watch.id))
        with pytest.raises(NotFound, match="no watch"):
            await channel.call(P.ReadWatch(id=watch.id))

    run(scenario)


def test_a_port_is_reached_through_the_agent_with_nothing_started() -> None:
    """ConnectPort: what a sandbox without network uses for its ports. Bytes both ways, a half-close that the peer
    sees, the end of the connection as an exit, a closed port as REFUSED."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def echo_until_eof() -> None:
        connection, _ = server.accept()
        with connection:
            received = b""
            while data := connection.recv(4096):
                received += data
            connection.sendall(b"got:" + received)

    threading.Thread(target=echo_until_eof, daemon=True).start()

    async def scenario(backend: FakeBackend, box: BoxRef, channel: GuestChannel) -> None:
        state = await channel.call(P.ConnectPort(id="port-test", port=port))
        assert state.status == "running" and state.cmd == ["tcp", f"127.0.0.1:{port}"]
        data = base64.b64encode(b"hello").decode()
        await channel.call(P.WriteStdin(id="port-test", data=data, close=True))  # close: the peer's EOF
        streams = await channel.call(P.ReadStreams(id="port-test", stdout_offset=0, stderr_offset=0, wait=30))
        while streams.exit_code is None:
            streams = await channel.call(P.ReadStreams(id="port-test", stdout_offset=0, stderr_offset=0, wait=30))
        assert (text(streams.stdout.data), streams.exit_code) == ("got:hello", 0)
        server.close()
        with pytest.raises(GuestError) as refused:
            await channel.call(P.ConnectPort(id="port-closed", port=port))
        assert refused.value.details["guest_error"] == P.ErrorKind.REFUSED

    run(scenario)
