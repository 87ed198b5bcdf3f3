"""The channel's framing against real peers: a unix socket we answer by hand, and a FIFO nobody reads."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from stasis.errors import GuestDisconnected, GuestTimeout
from stasis.guest import protocol as P
from stasis.guest.client import GuestChannel

pytestmark = pytest.mark.fast


async def peer(path: Path, handle) -> asyncio.AbstractServer:  # type: ignore[no-untyped-def]
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await handle(reader, writer)

    return await asyncio.start_unix_server(serve, str(path))


def reply(writer: asyncio.StreamWriter, req_id: str, result: dict) -> None:
    writer.write(json.dumps({"id": req_id, "ok": True, "result": result}).encode() + b"\n")


HEALTH = {"version": 2, "pid": 1, "uptime": 0.0, "boot_id": "b" * 16}


def test_replies_are_matched_by_id_in_any_order_and_strangers_are_dropped(tmp_path: Path) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first, second = json.loads(await reader.readline()), json.loads(await reader.readline())
        reply(writer, "someone-elses-request", HEALTH)  # left by a previous daemon: ignored
        writer.write(b"not json at all\n")
        reply(writer, second["id"], {**HEALTH, "pid": 2})
        reply(writer, first["id"], {**HEALTH, "pid": 1})
        await writer.drain()

    async def main() -> None:
        server = await peer(tmp_path / "s", handle)
        channel = await GuestChannel.open_unix(tmp_path / "s", "test")
        one, two = await asyncio.gather(channel.call(P.Health()), channel.call(P.Health()))
        assert (one.pid, two.pid) == (1, 2) and channel.boot_id == "b" * 16
        await channel.close()
        server.close()

    asyncio.run(main())


def test_a_lost_connection_fails_every_waiter_at_once(tmp_path: Path) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        await reader.readline()
        writer.close()  # the sandbox went away with two requests unanswered

    async def main() -> None:
        server = await peer(tmp_path / "s", handle)
        channel = await GuestChannel.open_unix(tmp_path / "s", "test")
        results = await asyncio.gather(
            channel.call(P.Health(), timeout=None), channel.call(P.Sync(), timeout=None), return_exceptions=True
        )
        assert all(isinstance(r, GuestDisconnected) for r in results), results
        assert channel.closed
        with pytest.raises(GuestDisconnected, match="closed"):
            await channel.call(P.Health())
        server.close()

    asyncio.run(main())


def test_a_request_the_agent_never_read_is_taken_back_on_timeout(tmp_path: Path) -> None:
    to_guest, from_guest = tmp_path / "in", tmp_path / "out"
    os.mkfifo(to_guest)
    os.mkfifo(from_guest)
    guest_end = os.open(to_guest, os.O_RDWR | os.O_NONBLOCK)  # the agent's stdin, never read: it is wedged

    async def main() -> None:
        channel = await GuestChannel.open_fifos(to_guest, from_guest, "wedged")
        big = P.WriteFile(path="/x", data="A" * (256 << 10))  # more than a pipe holds: the write cannot finish
        with pytest.raises(GuestTimeout):
            await channel.call(big, timeout=0.3)
        assert channel.closed

    asyncio.run(main())
    left = os.read(guest_end, 1 << 20)
    os.close(guest_end)
    assert left == b"\n"  # nothing of the request remains for the agent to run later; a half line is ended


def test_a_request_the_agent_took_but_never_answered_is_cancelled(tmp_path: Path) -> None:
    seen: list[dict] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            seen.append(json.loads(line))

    async def main() -> None:
        server = await peer(tmp_path / "agent.sock", handle)
        channel = await GuestChannel.open_unix(tmp_path / "agent.sock", "busy")
        with pytest.raises(GuestTimeout):
            await channel.call(P.Exec(cmd=["sleep", "60"]), timeout=0.3)
        assert not channel.closed  # it read the request: the connection stays, a cancel follows it
        for _ in range(200):
            if len(seen) == 2:
                break
            await asyncio.sleep(0.02)
        assert seen[1].get("cancel") == seen[0]["id"]
        await channel.close()
        server.close()

    asyncio.run(main())
