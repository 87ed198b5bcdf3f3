"""The SDK's request recipes (pure), and the whole path SDK → app → service → agent in-process."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest

from stasis import AsyncClient, AsyncSandbox, InvalidRequest, Sandbox
from stasis.daemon.app import create_app
from stasis.daemon.core.service import SandboxService
from stasis.sdk import _base as b
from stasis.sdk._base import Collector, OutputEvent
from tests.fakes import FakeBackend
from tests.fastkit import fake_home

pytestmark = pytest.mark.fast

INFO = {"id": "sb-000000000001", "name": "x", "status": "running", "spec": {}, "created_at": 0, "updated_at": 0,
        "last_activity": 0}  # fmt: skip


def test_run_recipe_carries_stdin_and_max_output() -> None:
    request = b.run_request("cat", None, {"stdin": "hi", "max_output": 10, "timeout": 2, "working_dir": "/tmp"})
    sbx = Sandbox(b.connect_call("x").parse(httpx.Response(200, json=INFO)), None)
    for call in (sbx._run_call(request), sbx._stream_call(request)):
        assert call.method == "POST" and call.path.startswith("/v1/sandboxes/sb-000000000001/exec")
        assert call.json["stdin_b64"] == base64.b64encode(b"hi").decode()
        assert (call.json["max_output"], call.json["timeout"], call.json["cwd"]) == (10, 2, "/tmp")
        assert call.json["cmd"] == ["/bin/sh", "-c", "cat"]


def test_create_recipe_sends_only_what_was_set_and_validates_first() -> None:
    call = b.create_call("web", {"memory_mb": 512, "image": None})  # type: ignore[typeddict-item]
    assert call.json == {"name": "web", "memory_mb": 512}
    with pytest.raises(InvalidRequest, match="memory_mb"):
        b.create_call("web", {"memory_mb": 1})
    with pytest.raises(InvalidRequest, match="unknown backend 'xen'"):
        b.create_call("web", {"backend": "xen"})


def test_commands_go_through_the_shell_only_when_given_as_one_string() -> None:
    assert b.command_argv("ls -la", None) == ["/bin/sh", "-c", "ls -la"]
    assert b.command_argv("ls", ["-la"]) == ["ls", "-la"]
    assert b.command_argv(["ls", "-la"], ["x"]) == ["ls", "-la", "x"]


def test_a_streamed_run_keeps_the_last_max_output_bytes_and_feeds_every_byte() -> None:
    seen: list[bytes] = []
    collector = Collector(seen.append, None, max_output=4)
    for piece in (b"abc", b"defg"):
        collector.feed(OutputEvent("stdout", piece))
    collector.feed(OutputEvent("stderr", b"e"))
    collector.feed(OutputEvent("exit", exit_code=0, exec_id="x-1", truncated=(False, True)))
    result = collector.result
    assert result is not None and seen == [b"abc", b"defg"]
    assert (result.stdout_bytes, result.stdout_truncated) == (b"defg", True)
    assert (result.stderr_bytes, result.stderr_truncated) == (b"e", True)  # the daemon said it lost some


def test_stream_events_parse() -> None:
    assert b.stream_event({"exec_id": "x"}) is None
    assert b.stream_event({"stdout": base64.b64encode(b"hi").decode()}) == OutputEvent("stdout", b"hi")
    exit_event = b.stream_event({"exit_code": 3, "timed_out": True, "exec_id": "x", "stdout_truncated": True})
    assert exit_event == OutputEvent("exit", b"", 3, True, "x", (True, False))


def test_the_sdk_runs_through_the_real_app_on_the_fake_backend() -> None:
    async def main() -> None:
        paths = fake_home("sdk")
        service = SandboxService(paths, backends={"fake": FakeBackend(paths)})
        app = create_app(paths, service=service)
        async with app.router.lifespan_context(app):
            client = AsyncClient(paths=paths)
            client._http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://stasis")
            sbx = await AsyncSandbox.create("sdk", backend="fake", client=client)
            try:
                plain = await sbx.run("cat", stdin="to stdin")
                assert plain.stdout == "to stdin"
                chunks: list[bytes] = []
                streamed = await sbx.run("cat; seq 1 2000", stdin="first\n", max_output=20, on_stdout=chunks.append)
                everything = b"".join(chunks)
                assert everything.startswith(b"first\n1\n") and everything.endswith(b"2000\n"), everything[:40]
                assert streamed.stdout_truncated and len(streamed.stdout_bytes) == 20
                assert streamed.stdout.endswith("1999\n2000\n")
                events = [e async for e in sbx.stream(["cat"], stdin=b"bytes in")]
                assert b"".join(e.data for e in events if e.kind == "stdout") == b"bytes in"
                assert events[-1].kind == "exit" and events[-1].exit_code == 0
                await sbx.write_file("/tmp/stasis-fast-sdk.txt", b"x")  # the fake has no isolation: /tmp only
                assert await sbx.read_file("/tmp/stasis-fast-sdk.txt") == b"x"
                await sbx.remove("/tmp/stasis-fast-sdk.txt")
                assert (await sbx.suspend()).status.value == "suspended"
                assert (await sbx.run("echo back")).stdout == "back\n"
            finally:
                await sbx.terminate()
                await client.aclose()

    asyncio.run(main())
