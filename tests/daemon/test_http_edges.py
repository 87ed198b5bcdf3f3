"""The HTTP API's edges, in-process on the fake backend: every bad input is a 4xx in the usual shape."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from stasis.daemon.app import create_app
from stasis.daemon.core.service import SandboxService
from tests.fakes import FakeBackend
from tests.fastkit import fake_home

pytestmark = pytest.mark.fast


def with_app(scenario: Callable[[httpx.AsyncClient], Awaitable[None]]) -> None:
    async def main() -> None:
        paths = fake_home("http")
        service = SandboxService(paths, backends={"fake": FakeBackend(paths)})
        app = create_app(paths, service=service)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://stasis") as http:
                try:
                    await scenario(http)
                finally:
                    for info in service.store.list():
                        await service.terminate(info.id)

    asyncio.run(main())


def assert_error(response: httpx.Response, status: int, kind: str, words: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == kind and words in body["message"], body
    assert len(response.content) < 4096  # the input is never echoed back


BAD_RUNS = [
    ({"cmd": ["echo", "a\0b"]}, "NUL"),
    ({"cmd": ["env"], "env": {"BAD=NAME": "x"}}, "environment variable name"),
    ({"cmd": ["env"], "env": {"OK": "nul\0"}}, "NUL"),
    ({"cmd": ["pwd"], "cwd": "/tmp\0"}, "NUL"),
    ({"cmd": []}, "cmd"),
    ({"cmd": ["true"], "timeout": -1}, "timeout"),
]


@pytest.mark.parametrize(("body", "words"), BAD_RUNS)
def test_bad_commands_are_400_before_reaching_the_agent(body: dict, words: str) -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        created = await http.post("/v1/sandboxes", json={"name": "edges", "backend": "fake"})
        assert created.status_code == 201
        for route in ("/v1/sandboxes/edges/exec", "/v1/sandboxes/edges/exec/stream", "/v1/sandboxes/edges/processes"):
            assert_error(await http.post(route, json=body), 400, "InvalidRequest", words)

    with_app(scenario)


def test_bad_specs_are_400() -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        assert_error(await http.post("/v1/sandboxes", json={"cpus": 0.0001, "backend": "fake"}), 400,
                     "InvalidRequest", "cpus")  # fmt: skip
        assert_error(await http.post("/v1/sandboxes", json={"backend": "xen"}), 400, "InvalidRequest", "xen")
        json_header = {"content-type": "application/json"}
        assert_error(
            await http.post("/v1/sandboxes", content=b"{not json", headers=json_header), 400, "InvalidRequest", "JSON"
        )

    with_app(scenario)


def test_a_huge_json_body_is_refused_unread_and_not_echoed() -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        huge = b'{"cmd": ["' + b"x" * (20 << 20) + b'"]}'
        assert_error(await http.post("/v1/sandboxes/x/exec", content=huge), 413, "InvalidRequest", "MiB")

    with_app(scenario)


def test_unknown_routes_and_encoded_slashes_answer_in_the_usual_shape() -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        assert_error(await http.get("/v1/sandboxes/a%2Fb/files/stat"), 404, "NotFound", "no such route")
        assert_error(await http.get("/v1/nothing-here"), 404, "NotFound", "no such route")
        assert_error(await http.get("/v1/sandboxes/ghost"), 404, "SandboxNotFound", "stasis ls")

    with_app(scenario)


def test_a_file_upload_is_streamed_to_the_sandbox_in_chunks() -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        await http.post("/v1/sandboxes", json={"name": "files", "backend": "fake"})
        payload = bytes(range(256)) * 12_000  # 3 MB: three chunks to the agent
        path = "/tmp/stasis-fast-upload.bin"

        async def body():  # type: ignore[no-untyped-def]
            for i in range(0, len(payload), 100_000):
                yield payload[i : i + 100_000]

        written = await http.put("/v1/sandboxes/files/files", params={"path": path}, content=body())
        assert written.status_code == 200 and written.json()["size"] == len(payload)
        assert (await http.get("/v1/sandboxes/files/files", params={"path": path})).content == payload
        await http.delete("/v1/sandboxes/files/files", params={"path": path})

    with_app(scenario)


def test_df_counts_a_sandboxs_own_bytes() -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        created = (await http.post("/v1/sandboxes", json={"name": "sizes", "backend": "fake"})).json()
        usage = (await http.get("/v1/df")).json()
        assert set(usage["sandboxes"]) == {created["id"]} and usage["sandboxes_bytes"] >= 0
        assert usage["checkpoints"] == {} and "read-only" in usage["shared_note"]

    with_app(scenario)


LONG = "x" * 60_000


def test_no_answer_echoes_more_than_200_bytes_of_what_was_sent() -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        await http.post("/v1/sandboxes", json={"name": "echo", "backend": "fake"})
        routes = [
            ("GET", f"/v1/sandboxes/{LONG}"), ("GET", f"/v1/checkpoints/{LONG}"), ("GET", f"/v1/images/{LONG}"),
            ("GET", f"/v1/pools/{LONG}"), ("GET", f"/v1/nothing/{LONG}"),
            ("GET", f"/v1/sandboxes/echo/processes/{LONG}"), ("GET", f"/v1/sandboxes/echo/exec/{LONG}"),
            ("GET", f"/v1/sandboxes/echo/files?path=/{LONG}"), ("DELETE", f"/v1/images/{LONG}"),
        ]  # fmt: skip
        for method, route in routes:
            answer = await http.request(method, route)
            assert 400 <= answer.status_code < 500, (route[:60], answer.status_code, answer.text[:300])
            assert "x" * 201 not in answer.text, route[:60]
        created = await http.post("/v1/sandboxes", json={"image": "i" * 20_000, "backend": "fake"})
        assert created.status_code == 400 and "i" * 201 not in created.text

    with_app(scenario)


SURROGATES = [
    ("/v1/sandboxes/s/exec", b'{"cmd": ["echo", "\\ud800"]}'),
    ("/v1/sandboxes/s/exec", b'{"cmd": ["env"], "env": {"A": "\\udfff"}}'),
    ("/v1/sandboxes/s/processes", b'{"cmd": ["true"], "id": "web\\ud800"}'),
    ("/v1/sandboxes/s/processes", b'{"cmd": ["sh", "-c", "\\ud83d"]}'),
    ("/v1/sandboxes", b'{"name": "a\\ud800", "backend": "fake"}'),
]


@pytest.mark.parametrize(("route", "body"), SURROGATES)
def test_a_lone_surrogate_anywhere_is_a_400_in_the_usual_shape(route: str, body: bytes) -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        await http.post("/v1/sandboxes", json={"name": "s", "backend": "fake"})
        answer = await http.post(route, content=body, headers={"content-type": "application/json"})
        assert answer.status_code == 400, answer.text
        assert answer.json()["type"] == "InvalidRequest"

    with_app(scenario)


def test_a_waiting_pool_member_is_nobodys_sandbox_until_claimed() -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        made = await http.post("/v1/pools", json={"name": "warm", "size": 1, "backend": "fake", "memory_mb": 256})
        assert made.status_code == 201, made.text
        service = http._transport.app.state.rooms.core  # type: ignore[attr-defined]
        for _ in range(200):
            members = [i for i in service.store.list() if i.pool == "warm" and i.status.value == "running"]
            if members:
                break
            await asyncio.sleep(0.05)
        member = members[0].id
        planted = f"/tmp/stasis-planted-{member}"  # the fake backend's agent runs on this host
        tries = [
            ("POST", f"/v1/sandboxes/{member}/exec", {"cmd": ["touch", planted]}),
            ("POST", f"/v1/sandboxes/{member}/processes", {"cmd": ["sleep", "600"]}),
            ("POST", f"/v1/sandboxes/{member}/suspend", None), ("POST", f"/v1/sandboxes/{member}/resume", None),
            ("POST", f"/v1/sandboxes/{member}/checkpoints", {"type": "filesystem"}),
            ("POST", f"/v1/sandboxes/{member}/fork", {"times": 1}),
            ("PUT", f"/v1/sandboxes/{member}/files?path={planted}", None),
            ("GET", f"/v1/sandboxes/{member}/files?path=/etc/hostname", None),
            ("POST", f"/v1/sandboxes/{member}/ports", {"port": 8000}),
            ("DELETE", f"/v1/sandboxes/{member}", None),
        ]  # fmt: skip
        for method, route, body in tries:
            answer = await http.request(method, route, json=body)
            assert answer.status_code == 404, (route, answer.status_code, answer.text)
        claimed = (await http.post("/v1/sandboxes", json={"name": "mine", "backend": "fake", "memory_mb": 256})).json()
        assert claimed["id"] == member and claimed["status"] == "running"
        check = await http.post("/v1/sandboxes/mine/exec", json={"cmd": ["test", "-e", planted]})
        assert check.json()["exit_code"] == 1  # nothing was planted before the claim
        await http.delete("/v1/pools/warm")

    with_app(scenario)


def test_an_upload_cut_off_midway_leaves_no_temp_file() -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        await http.post("/v1/sandboxes", json={"name": "cut", "backend": "fake"})
        target = Path(tempfile.mkdtemp(prefix="stasis-cut-")) / "big.bin"  # the fake agent runs on this host

        async def body():  # type: ignore[no-untyped-def]
            for _ in range(3):
                yield bytes(1 << 20)
            raise ConnectionResetError("the client went away")

        answer = await http.put("/v1/sandboxes/cut/files", params={"path": str(target)}, content=body())
        assert answer.status_code >= 400  # (the in-process transport hands the app the client's error)
        assert list(target.parent.iterdir()) == []  # neither the file nor its temp file
        target.parent.rmdir()

    with_app(scenario)


HUGE_NUMBERS = [
    ("/v1/sandboxes/n/exec", {"cmd": ["true"], "timeout": 1e300}, "timeout"),
    ("/v1/sandboxes/n/exec", {"cmd": ["true"], "timeout": 1e10}, "timeout"),  # past what the agent's clock holds
    ("/v1/sandboxes/n/exec/stream", {"cmd": ["true"], "timeout": 1e300}, "timeout"),
    ("/v1/sandboxes/n/checkpoints", {"type": "filesystem", "ttl_secs": 10**400}, "ttl_secs"),
    ("/v1/sandboxes", {"backend": "fake", "timeout_secs": 10**400}, "timeout_secs"),
    ("/v1/sandboxes/n/code/execute", {"code": "1", "timeout": 1e300}, "timeout"),
    ("/v1/sandboxes/n/ports", {"port": 10**30}, "port"),
    ("/v1/sandboxes/n/fork", {"times": 10**30}, "times"),
]


@pytest.mark.parametrize(("route", "body", "field"), HUGE_NUMBERS)
def test_every_number_in_a_request_is_bounded_with_a_400(route: str, body: dict, field: str) -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        await http.post("/v1/sandboxes", json={"name": "n", "backend": "fake"})
        assert_error(await http.post(route, json=body), 400, "InvalidRequest", field)
        assert (await http.get("/v1/sandboxes")).status_code == 200  # nothing stored that breaks the listing

    with_app(scenario)


def test_numbers_in_a_query_or_a_path_are_bounded_with_a_400() -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        await http.post("/v1/sandboxes", json={"name": "q", "backend": "fake"})
        answer = await http.get("/v1/sandboxes/q/processes/none/output", params={"offset": 10**30})
        assert_error(answer, 400, "InvalidRequest", "offset")
        assert_error(await http.delete(f"/v1/sandboxes/q/ports/{10**30}"), 400, "InvalidRequest", "port")

    with_app(scenario)
