"""The MCP server through the official `mcp` client: over stdio (`stasis mcp`) and over the daemon's
streamable HTTP (its unix socket, and TCP with the token)."""

from __future__ import annotations

import asyncio
import base64
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from stasis import Client, Sandbox
from stasis.sdk import team as teams
from tests.conftest import Daemon

TOOLS = {"create", "list", "run", "run_code", "read_file", "write_file", "list_directory", "suspend", "resume",
         "checkpoint", "fork", "terminate", "screenshot", "click", "type_text", "press_keys", "open_url"}  # fmt: skip
Session = Callable[[], AbstractAsyncContextManager[ClientSession]]


def over_stdio(daemon: Daemon, errlog: TextIO = sys.stderr) -> Session:
    @asynccontextmanager
    async def session() -> AsyncIterator[ClientSession]:
        server = StdioServerParameters(command=sys.executable, args=["-m", "stasis", "mcp"], env=daemon.env)
        async with stdio_client(server, errlog=errlog) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            yield client

    return session


def over_http(url: str, http: Callable[[], httpx2.AsyncClient]) -> Session:
    @asynccontextmanager
    async def session() -> AsyncIterator[ClientSession]:
        async with http() as client_http, streamable_http_client(url, http_client=client_http) as (read, write), \
                ClientSession(read, write) as client:  # fmt: skip
            await client.initialize()
            yield client

    return session


def over_the_socket(daemon: Daemon) -> Session:
    transport = httpx2.AsyncHTTPTransport(uds=str(daemon.paths.socket))
    return over_http("http://stasis/mcp", lambda: httpx2.AsyncClient(transport=transport, timeout=120))


async def call(client: ClientSession, tool: str, **arguments: Any) -> Any:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, (tool, result.content)
    data = result.structured_content
    return data["result"] if isinstance(data, dict) and set(data) == {"result"} else data


async def tool_error(client: ClientSession, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, (tool, result)
    return " ".join(block.text for block in result.content if hasattr(block, "text"))


async def every_tool(session: Session, name: str) -> None:
    """Two sessions, as two turns of an agent: the second finds the first's file and process after
    a suspend; every tool is called; bad input comes back as tool errors."""
    async with session() as client:
        assert {t.name for t in (await client.list_tools()).tools} == TOOLS
        created = await call(client, "create", name=name)
        assert created["status"] == "running" and created["name"] == name
        written = await call(client, "write_file", sandbox=name, path="/root/work/notes.txt", content="turn one\n")
        assert (written["name"], written["path"]) == ("notes.txt", "/root/work/notes.txt")  # as list_directory
        started = await call(client, "run", sandbox=name,
                             command="nohup sleep 600 >/dev/null 2>&1 & echo $! > /root/work/bg.pid")  # fmt: skip
        assert started["exit_code"] == 0
        assert (await call(client, "suspend", sandbox=name))["status"] == "suspended"
    async with session() as client:
        assert name in {s["name"] for s in await call(client, "list")}
        assert (await call(client, "resume", sandbox=name))["status"] == "running"
        notes = await call(client, "read_file", sandbox=name, path="/root/work/notes.txt")
        assert notes == {"path": "/root/work/notes.txt", "content": "turn one\n", "encoding": "utf-8", "size": 9}
        alive = await call(client, "run", sandbox=name, command="kill -0 $(cat /root/work/bg.pid) && echo alive")
        assert alive["stdout"] == "alive\n"
        assert {e["name"] for e in await call(client, "list_directory", sandbox=name, path="/root/work")} == {
            "notes.txt", "bg.pid"}  # fmt: skip
        checkpoint = await call(client, "checkpoint", sandbox=name, name=f"{name}-cp")
        assert checkpoint["type"] == "memory" and checkpoint["size_bytes"] > 0
        (fork,) = await call(client, "fork", sandbox=name)
        forked = await call(client, "run", sandbox=fork["id"], command="cat /root/work/notes.txt")
        assert forked["stdout"] == "turn one\n"

        capped = await call(client, "run", sandbox=name, command="head -c 100000 /dev/zero | tr '\\0' x",
                            max_output=1000)  # fmt: skip
        assert capped["truncated"] and len(capped["stdout"]) == 1000
        slow = await call(client, "run", sandbox=name, command="sleep 30", timeout=1)
        assert slow["timed_out"] and slow["exit_code"] != 0
        assert "SandboxNotFound" in await tool_error(client, "run", sandbox="no-such-sandbox", command="true")
        assert "FileNotFound" in await tool_error(client, "read_file", sandbox=name, path="/no/such/file")

        assert (await call(client, "terminate", sandbox=fork["id"]))["status"] == "terminated"
        assert (await call(client, "terminate", sandbox=name))["status"] == "terminated"


def test_every_tool_over_stdio(daemon: Daemon, tmp_path: Path) -> None:
    with (tmp_path / "stderr").open("w+") as errlog:
        asyncio.run(every_tool(over_stdio(daemon, errlog), "mcp-stdio"))
        errlog.seek(0)
        said = errlog.read()
    assert "HTTP Request" not in said and "Processing request" not in said, said  # quiet on the client's stderr
    Sandbox.delete_checkpoint("mcp-stdio-cp", client=daemon.client())  # it outlives its sandbox


def test_every_tool_over_the_daemons_http_on_its_socket(daemon: Daemon) -> None:
    asyncio.run(every_tool(over_the_socket(daemon), "mcp-http"))
    Sandbox.delete_checkpoint("mcp-http-cp", client=daemon.client())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tcp_daemon(own_daemon: Daemon) -> Daemon:
    own_daemon.tcp = f"127.0.0.1:{free_port()}"  # type: ignore[attr-defined]
    own_daemon.sticky_env["STASIS_TOKEN"] = "mcp-test-token"
    return own_daemon.start("--tcp", own_daemon.tcp)  # type: ignore[attr-defined]


def with_token(token: str | None) -> Callable[[], httpx2.AsyncClient]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return lambda: httpx2.AsyncClient(headers=headers, timeout=120)


def test_over_tcp_a_token_or_key_is_required_and_a_key_reaches_only_its_team(tcp_daemon: Daemon) -> None:
    url = f"http://{tcp_daemon.tcp}/mcp"  # type: ignore[attr-defined]

    async def refused(token: str | None) -> int:
        async with with_token(token)() as http:
            response = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            return response.status_code

    assert asyncio.run(refused(None)) == 401
    assert asyncio.run(refused("wrong")) == 401

    async def listed() -> set[str]:
        async with over_http(url, with_token("mcp-test-token"))() as client:
            return {t.name for t in (await client.list_tools()).tools}

    assert asyncio.run(listed()) == TOOLS

    with Client(url=f"http://{tcp_daemon.tcp}", token="mcp-test-token") as owner:  # type: ignore[attr-defined]
        keys = {}
        for team in ("red", "blue"):
            teams.create_team(team, client=owner)
            keys[team] = teams.create_key(team, ["read", "write", "exec"], client=owner).key
        reader = teams.create_key("red", ["read"], client=owner).key

        async def two_teams() -> str:
            async with over_http(url, with_token(keys["red"]))() as red, \
                    over_http(url, with_token(keys["blue"]))() as blue, \
                    over_http(url, with_token(reader))() as red_reader:  # fmt: skip
                made = await call(red, "create", name="mcp-red")
                assert [s["id"] for s in await call(red, "list")] == [made["id"]]
                assert await call(blue, "list") == []  # another team's sandbox is not there
                for tool, arguments in (("run", {"command": "true"}), ("read_file", {"path": "/etc/hostname"}),
                                        ("terminate", {})):  # fmt: skip
                    said = await tool_error(blue, tool, sandbox=made["id"], **arguments)
                    assert "SandboxNotFound" in said and "no sandbox named" in said, said
                assert "write scope" in await tool_error(red_reader, "create")
                assert [s["id"] for s in await call(red_reader, "list")] == [made["id"]]
                assert (await call(red, "run", sandbox="mcp-red", command="echo red"))["stdout"] == "red\n"
                return str(made["id"])

        sandbox_id = asyncio.run(two_teams())
        info = Sandbox.connect(sandbox_id, client=owner).info()
        assert info.spec.team == "red"  # made by red's key through MCP: red's
        Sandbox.connect(sandbox_id, client=owner).terminate()
        audited = [e for e in teams.audit(client=owner) if e["path"] == "/mcp" and e["method"] == "POST"]
        assert {e["team"] for e in audited} >= {"red", "blue"} and {401} <= {e["status"] for e in audited}
    assert "Traceback" not in tcp_daemon.log_of_this_run()  # MCP's requests were audited, none failed to be


def test_computer_use_tools_see_the_screen_and_click_on_it(daemon: Daemon) -> None:
    """The desktop's tools over stdio: a page of the suite's own (file:/, no network) seen in a screenshot (an
    image block of the tool's answer), then a click that changes it."""
    import io

    from PIL import Image

    from tests.network.testhost_server import DESKTOP_PAGE

    def colour(result: Any, x: int, y: int) -> tuple[int, int, int]:
        (block,) = [b for b in result.content if getattr(b, "type", "") == "image"]
        assert block.mime_type == "image/png"
        with Image.open(io.BytesIO(base64.b64decode(block.data))) as image:
            return image.convert("RGB").getpixel((x, y))  # type: ignore[return-value]

    async def scenario() -> None:
        async with over_stdio(daemon)() as client:
            await call(client, "create", name="mcp-desk", image="desktop")
            await call(client, "write_file", sandbox="mcp-desk", path="/root/page.html", content=DESKTOP_PAGE)
            await call(client, "open_url", sandbox="mcp-desk", url="file:///root/page.html")
            try:
                for wanted, act in (((0, 0, 255), None), ((255, 0, 0), ("click", {"x": 320, "y": 680}))):
                    if act is not None:
                        await call(client, act[0], sandbox="mcp-desk", **act[1])
                    for _ in range(240):  # the page loads, the click paints, at the browser's pace
                        shot = await client.call_tool("screenshot", {"sandbox": "mcp-desk"})
                        assert not shot.is_error, shot.content
                        if colour(shot, 320, 300) == wanted:
                            break
                        await asyncio.sleep(0.5)
                    else:
                        raise AssertionError(f"the screen never showed {wanted}")
                assert "invalid key" in await tool_error(client, "press_keys", sandbox="mcp-desk", keys=["ctrl+l; x"])
            finally:
                await call(client, "terminate", sandbox="mcp-desk")

    asyncio.run(scenario())
