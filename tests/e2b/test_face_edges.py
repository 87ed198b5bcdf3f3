"""The E2B face's edges, in-process on the fake backend: its two tokens, authentication before any lookup,
short echoes, bounded numbers, and an allowOut that narrows nothing said out loud."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from e2b.sandbox.signature import get_signature

from stasis.daemon.app import create_app
from stasis.daemon.core.service import SandboxService
from stasis.daemon.faces.deps import Rooms
from stasis.daemon.faces.e2b.app import E2bApp
from stasis.daemon.faces.e2b.room import Defaults
from stasis.netpolicy import NetworkPolicy
from tests.fakes import FakeBackend
from tests.fastkit import create, fake_home

pytestmark = pytest.mark.fast

Scenario = Callable[[httpx.AsyncClient, Rooms, dict[str, str]], Awaitable[None]]


def with_face(scenario: Scenario) -> None:
    """The daemon's rooms, started as the daemon starts them, behind one E2B listener's app (no socket)."""

    async def main() -> None:
        paths = fake_home("e2b")
        service = SandboxService(paths, backends={"fake": FakeBackend(paths)})
        app = create_app(paths, service=service)
        async with app.router.lifespan_context(app):
            rooms: Rooms = app.state.rooms
            face = E2bApp(rooms.e2b, rooms.core, rooms.ops, rooms.ports, Defaults(backend="fake", memory_mb=256))
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=face), base_url="http://e2b") as http:
                try:
                    await scenario(http, rooms, {"X-API-Key": rooms.e2b.keys.api_key})
                finally:
                    for info in service.store.list():
                        await service.terminate(info.id)

    asyncio.run(main())


async def new_sandbox(http: httpx.AsyncClient, key: dict[str, str], **body: Any) -> dict[str, Any]:
    created = await http.post("/sandboxes", json={"templateID": "default", **body}, headers=key)
    assert created.status_code == 201, created.text
    return created.json()  # type: ignore[no-any-return]


def envd(sandbox_id: str, **headers: str) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sandbox_id, **headers}


@pytest.mark.slow  # seconds of its own: the full suite runs it, the fast tier not
def test_the_traffic_token_opens_the_sandboxs_ports_and_never_envd() -> None:
    async def scenario(http: httpx.AsyncClient, rooms: Rooms, key: dict[str, str]) -> None:
        sbx = await new_sandbox(http, key)
        envd_token, traffic = sbx["envdAccessToken"], sbx["trafficAccessToken"]
        assert traffic and traffic != envd_token
        for header in ("e2b-traffic-access-token", "X-Access-Token"):
            as_traffic = envd(sbx["sandboxID"], **{header: traffic})
            assert (await http.get("/health", headers=as_traffic)).status_code == 401
            assert (await http.get("/files", params={"path": "/etc/shadow"}, headers=as_traffic)).status_code == 401
            start = await http.post("/process.Process/Start", json={"process": {"cmd": "id"}},
                                    headers={**as_traffic, "content-type": "application/json"})  # fmt: skip
            assert start.status_code == 401
        assert (await http.get("/health", headers=envd(sbx["sandboxID"], **{"X-Access-Token": envd_token}))).is_success
        port = envd(sbx["sandboxID"], **{"E2b-Sandbox-Port": "8000", "e2b-traffic-access-token": traffic})
        assert (await http.get("/", headers=port)).status_code == 502  # let through: nothing listens on 8000
        port["e2b-traffic-access-token"] = "wrong"
        assert (await http.get("/", headers=port)).status_code == 401
        # The review's door: the code interpreter's /execute and stasis' VNC servers run code or take the keyboard
        kernel = envd(sbx["sandboxID"], **{"E2b-Sandbox-Port": "49999", "e2b-traffic-access-token": traffic})
        for path in ("/execute", "/%65xecute", "/execute?x=1"):
            assert (await http.post(path, json={"code": "1"}, headers=kernel)).status_code == 401, path
        assert (await http.get("/contexts", headers=kernel)).status_code == 502  # E2B's SDK: the traffic token's
        for vnc in ("5900", "5901"):
            door = envd(sbx["sandboxID"], **{"E2b-Sandbox-Port": vnc, "e2b-traffic-access-token": traffic})
            assert (await http.get("/", headers=door)).status_code == 401, vnc
        as_envd = envd(sbx["sandboxID"], **{"E2b-Sandbox-Port": "49999", "X-Access-Token": envd_token})
        assert (await http.post("/execute", json={"code": "1"}, headers=as_envd)).status_code == 502  # let through

    with_face(scenario)


def test_a_sandbox_request_is_authenticated_before_the_sandbox_is_looked_up() -> None:
    async def scenario(http: httpx.AsyncClient, rooms: Rooms, key: dict[str, str]) -> None:
        await create(rooms.core, "known")
        known = await http.get("/health", headers=envd("known"))
        unknown = await http.get("/health", headers=envd("sb-000000000000"))
        assert known.status_code == unknown.status_code == 401 and known.json() == unknown.json()
        huge = "x" * 60_000
        refused = await http.get("/health", headers=envd(huge))
        assert refused.status_code == 401 and len(refused.content) < 1024
        missing = await http.get("/health", headers=envd(huge, **key))
        assert missing.status_code == 502 and "x" * 81 not in missing.text and len(missing.content) < 1024
        assert (await http.get("/health", headers=envd("known", **key))).status_code == 204  # a name, with the key
        for port in (b"9" * 60_000, "²".encode("latin-1"), b"0", b"65536"):  # "²".isdigit(); int("²") fails
            answer = await http.get("/", headers={**envd("known", **key), "E2b-Sandbox-Port": port})  # type: ignore[dict-item]
            assert answer.status_code == 400 and "port number" in answer.text and len(answer.content) < 1024

    with_face(scenario)


def test_errors_never_echo_a_long_path() -> None:
    async def scenario(http: httpx.AsyncClient, rooms: Rooms, key: dict[str, str]) -> None:
        long = "/deep" * 200
        route = await http.get(f"/v2{long}", headers=key)
        assert route.status_code == 404 and "/deep" * 17 not in route.text and len(route.content) < 1024
        sbx = await new_sandbox(http, key)
        token = envd(sbx["sandboxID"], **{"X-Access-Token": sbx["envdAccessToken"]})
        file = await http.get("/files", params={"path": f"/nowhere{long}"}, headers=token)
        assert file.status_code == 404 and "/deep" * 25 not in file.text and len(file.content) < 1024

    with_face(scenario)


@pytest.mark.parametrize("timeout", [1e300, 10**30, -1])
def test_every_lifetime_is_bounded_with_a_400(timeout: float) -> None:
    async def scenario(http: httpx.AsyncClient, rooms: Rooms, key: dict[str, str]) -> None:
        made = await http.post("/sandboxes", json={"templateID": "default", "timeout": timeout}, headers=key)
        assert made.status_code == 400 and "timeout" in made.json()["message"], made.text
        sbx = await new_sandbox(http, key)
        for route in ("timeout", "connect", "refreshes"):
            answer = await http.post(f"/sandboxes/{sbx['sandboxID']}/{route}", json={"timeout": timeout}, headers=key)
            assert answer.status_code == 400 and "timeout" in answer.json()["message"], (route, answer.text)

    with_face(scenario)


def test_an_allow_out_without_deny_out_is_the_internet_and_the_answers_say_so() -> None:
    async def scenario(http: httpx.AsyncClient, rooms: Rooms, key: dict[str, str]) -> None:
        wide = await new_sandbox(http, key, network={"allowOut": ["203.0.113.7"]})
        [warning] = wide["warnings"]
        assert "whole internet" in warning and "denyOut" in warning
        got = (await http.get(f"/sandboxes/{wide['sandboxID']}", headers=key)).json()
        assert got["warnings"] == [warning]
        policy = rooms.core.get(wide["sandboxID"]).spec.network
        assert policy is not None and policy.allow_out == [] and warning in policy.describe()  # `stasis info`
        narrow = await new_sandbox(http, key, network={"allowOut": ["203.0.113.7"], "denyOut": ["0.0.0.0/0"]})
        closed = await new_sandbox(http, key, allow_internet_access=False, network={"allowOut": ["203.0.113.7"]})
        for sbx in (narrow, closed):
            assert "warnings" not in sbx
            assert rooms.core.get(sbx["sandboxID"]).spec.network.allow_out == ["203.0.113.7"]  # type: ignore[union-attr]
        # an update cannot say so in its 204: one that would open the whole internet unasked is refused, whole
        for body in ({"allowOut": ["203.0.113.8"]}, {}, {"rules": {"api.test": []}}):
            refused = await http.put(f"/sandboxes/{narrow['sandboxID']}/network", json=body, headers=key)
            assert refused.status_code == 400 and "whole internet" in refused.json()["message"], (body, refused.text)
            assert rooms.core.get(narrow["sandboxID"]).spec.network.allow_out == ["203.0.113.7"]  # type: ignore[union-attr]
        opened = await http.put(f"/sandboxes/{narrow['sandboxID']}/network", json={"denyOut": []}, headers=key)
        assert opened.status_code == 204  # asked for in so many words
        assert rooms.core.get(narrow["sandboxID"]).spec.network == NetworkPolicy()

    with_face(scenario)


def test_a_signed_file_url_opens_its_one_file_for_its_one_operation_until_it_expires() -> None:
    async def scenario(http: httpx.AsyncClient, rooms: Rooms, key: dict[str, str]) -> None:
        sbx = await new_sandbox(http, key)
        other = await new_sandbox(http, key)
        token = sbx["envdAccessToken"]

        def signed(path: str, operation: str, expires_in: int | None = None, user: str | None = None) -> dict[str, str]:
            made = get_signature(path, operation, user, token, expires_in)  # type: ignore[arg-type]
            query = {"path": path, "signature": made["signature"]}
            if made["expiration"] is not None:
                query["signature_expiration"] = str(made["expiration"])
            return query | ({"username": user} if user else {})

        # no header names the sandbox (a browser's GET): the signature's token does; past admission, the fake's 404
        assert (await http.get("/files", params=signed("/missing", "read"))).status_code == 404
        assert (await http.get("/files", params=signed("/missing", "read", 600, "root"))).status_code == 404
        named = envd(sbx["sandboxID"])
        assert (await http.get("/files", params=signed("/missing", "read"), headers=named)).status_code == 404
        refused = [
            http.get("/files", params=signed("/missing", "write"), headers=named),  # a write's signature reads not
            http.post("/files", params=signed("/missing", "read"), headers=named),  # nor a read's writes
            http.get("/files", params=signed("/missing", "read", -10), headers=named),  # expired
            http.get("/files", params={**signed("/missing", "read"), "path": "/etc/shadow"}, headers=named),
            http.get("/files", params={**signed("/missing", "read"), "username": "root"}, headers=named),
            http.get("/files", params=signed("/missing", "read"), headers=envd(other["sandboxID"])),  # its own only
            http.get(
                "/files?path=/missing&path=/etc/shadow&signature=" + signed("/missing", "read")["signature"],
                headers=named,
            ),
        ]
        for answer in await asyncio.gather(*refused):
            assert answer.status_code == 401, answer.request.url
        start = await http.post("/process.Process/Start", params=signed("/missing", "read"), json={},
                                headers={**named, "content-type": "application/json"})  # fmt: skip
        assert start.status_code == 401  # a file's signature never runs a command
        unsigned = await http.get("/files", params={"path": "/missing", "signature": "v1_x"})
        assert unsigned.status_code == 401  # no sandbox's: the control plane's refusal
        # the review's doors: a header's user never replaces the signed one; one signed upload writes one file
        as_root = {**named, "Authorization": "Basic cm9vdDo="}  # root:
        as_signed = await http.get("/files", params=signed("missing", "read", user="user"), headers=as_root)
        assert as_signed.status_code == 404 and "/home/user/missing" in as_signed.text, as_signed.text
        files = [("file", ("/etc/profile.d/x.sh", b"x")), ("file", ("b", b"y"))]
        two = await http.post("/files", params=signed("/tmp/one", "write"), files=files, headers=named)
        assert two.status_code == 400, two.text
        for user in ("root:root", "a:write:b"):  # a user with a colon: the signed text has no escaping
            query = signed("/missing", "read", user=user)
            assert (await http.get("/files", params=query, headers=named)).status_code == 401
        padded = {**signed("/missing", "read"), "junk": "x" * 9000}  # checked against every sandbox: bounded first
        assert (await http.get("/files", params=padded)).status_code == 401

    with_face(scenario)
