"""The pieces of secrets that need no sandbox: what a request's head becomes, the store on disk, the CA, the API's
checks of a create (in-process, on the fake backend)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import ssl
import stat
from pathlib import Path

import httpx
import pytest

from stasis import InvalidRequest
from stasis.credentials.authority import Authorities
from stasis.credentials.inject import Bound, Injection, header_rules, replace_body, rewrite_head
from stasis.credentials.models import SecretRequest
from stasis.credentials.store import SecretStore
from stasis.credentials.trust import BEGIN, END, without_block
from stasis.daemon.app import create_app
from stasis.daemon.core.service import SandboxService
from stasis.daemon.faces.deps import Rooms
from stasis.daemon.faces.e2b.control import create_control_app
from stasis.daemon.faces.e2b.room import Defaults
from stasis.models import SandboxSpec, build
from tests.fakes import FakeBackend
from tests.fastkit import fake_home

pytestmark = pytest.mark.fast
PH = b"stasis-secret-" + b"a" * 32


def head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_placeholder_in_a_header_becomes_the_value_but_never_in_the_request_line() -> None:
    injection, ph = Injection([Bound("TOKEN", PH, b"real")]), PH.decode()
    request = head(f"GET /echo/{ph} HTTP/1.1", "Host: api.test", f"Authorization: Bearer {ph}", f"X-Other: a{ph}b")
    out, used = rewrite_head(request, injection)
    assert out == head(f"GET /echo/{ph} HTTP/1.1", "Host: api.test", "Authorization: Bearer real", "X-Other: arealb")
    assert used == {"TOKEN"}
    untouched, used = rewrite_head(head("GET / HTTP/1.1", "Host: api.test"), injection)
    assert untouched == head("GET / HTTP/1.1", "Host: api.test") and used == set()


def test_basic_auth_is_decoded_replaced_and_encoded_again() -> None:
    basic = base64.b64encode(b"x-access-token:" + PH).decode()
    out, used = rewrite_head(head("GET / HTTP/1.1", f"Authorization: Basic {basic}"),
                             Injection([Bound("TOKEN", PH, b"ghp_real")]))  # fmt: skip
    sent = out.split(b"\r\n")[1].split(b"Basic ", 1)[1]
    assert base64.b64decode(sent) == b"x-access-token:ghp_real" and used == {"TOKEN"}


def test_a_secrets_header_replaces_the_sandboxs_and_a_rule_naming_a_removed_secret_is_dropped() -> None:
    injection = Injection([Bound("KEY", None, b"v", b"X-Api-Key", b"key v")])
    out, used = rewrite_head(head("GET / HTTP/1.1", "x-api-key: whatever the sandbox said"), injection)
    assert out == head("GET / HTTP/1.1", "X-Api-Key: key v") and used == {"KEY"}
    values = {"present": "1234"}
    rules = header_rules({"Authorization": "Bearer ${secrets.present}", "X-Gone": "${secrets.gone}"}, values.get)
    assert rules == {b"authorization": (b"Authorization: Bearer 1234", ["present"])}


def test_a_body_secret_replaces_every_placeholder_in_a_body() -> None:
    injection = Injection([Bound("B", PH, b"x", body=True), Bound("H", b"stasis-secret-" + b"b" * 32, b"y")])
    used: set[str] = set()
    assert replace_body(b'{"a": "' + PH + b'", "b": "' + PH + b'"}', injection, used) == b'{"a": "x", "b": "x"}'
    assert used == {"B"}
    assert injection.body


def test_the_store_keeps_values_in_0600_files_in_a_0700_directory_and_never_shows_them(tmp_path: Path) -> None:
    store = SecretStore(tmp_path / "secrets")
    info, existed = store.put("TOKEN", SecretRequest(value="s3cr3t-value", hosts=["api.test"]))
    assert not existed and info.version == 1 and "s3cr3t" not in info.model_dump_json()
    assert stat.S_IMODE(os.stat(tmp_path / "secrets").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "secrets" / "TOKEN.json").st_mode) == 0o600
    assert "s3cr3t" not in repr(store.get("TOKEN"))
    info, existed = store.put("TOKEN", SecretRequest(value="second", hosts=["api.test"]))
    assert existed and info.version == 2
    again = SecretStore(tmp_path / "secrets")  # a restarted daemon
    secret = again.get("TOKEN")
    assert secret is not None and secret.value == "second" and secret.info.version == 2


def test_bad_secrets_and_sandbox_secrets_are_refused_with_what_to_do() -> None:
    for fields, message in (
        ({"value": "x", "hosts": ["10.0.0.1"]}, "hostnames"),
        ({"value": "a\nb", "hosts": ["api.test"]}, "control characters"),
        ({"value": "x", "hosts": ["api.test"], "header": "X-Key", "format": "no value"}, "must contain {value}"),
        ({"value": "x", "hosts": ["api.test"], "header": "Bad Header"}, "invalid header name"),
    ):
        with pytest.raises(InvalidRequest, match=message):
            build(SecretRequest, **fields)
    with pytest.raises(InvalidRequest, match="environment variable"):
        build(SandboxSpec, network=True, secrets=["not-an-env-name"])
    with pytest.raises(InvalidRequest, match="placeholder"):
        build(SandboxSpec, network=True, secrets={"TOKEN": "chosen-by-the-client"})
    spec = build(SandboxSpec, network=True, secrets=["TOKEN"])
    assert spec.ca_lineage is not None and spec.secrets["TOKEN"].startswith("stasis-secret-")


def test_a_lineages_ca_is_kept_and_signs_a_leaf_a_client_verifies(tmp_path: Path) -> None:
    authorities = Authorities(tmp_path / "cas")
    lineage = "0" * 32
    ca = authorities.get(lineage)
    assert stat.S_IMODE(os.stat(tmp_path / "cas" / f"{lineage}.pem").st_mode) == 0o600
    assert Authorities(tmp_path / "cas").get(lineage).fingerprint == ca.fingerprint  # the same after a restart
    server = ca.server_context("api.test")
    assert ca.made_context("api.test") is server
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(incoming, outgoing, server_hostname="api.test")
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):  # the handshake, by hand: the client verifies the leaf against the CA
        for side in (c, s):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        s_in.write(outgoing.read())
        incoming.write(s_out.read())
    c.do_handshake()
    assert c.selected_alpn_protocol() in (None, "http/1.1")
    with pytest.raises(ValueError, match="not a CA lineage"):
        authorities.get("../../etc")


def test_the_ca_block_in_a_bundle_is_replaced_not_repeated() -> None:
    bundle = b"system certs\n" + BEGIN + b"old\n" + END + b"more system\n"
    assert without_block(bundle) == b"system certs\nmore system\n"


def test_a_header_rule_may_name_only_a_secret_bound_to_its_host() -> None:
    """Through stasis' egress_headers or E2B's network rules, a secret bound to api.test goes to no other host: the
    create is refused, naming the secret, its hosts and the rule's host. One bound to no host (E2B's secrets API
    makes those) goes where its rules say."""
    rule = {"Authorization": "Bearer ${secrets.token}"}
    e2b_rule = {"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.token}"}}}

    async def scenario(rooms: Rooms, http: httpx.AsyncClient, e2b: httpx.AsyncClient) -> None:
        assert (
            await http.put("/v1/secrets/token", json={"value": "v", "hosts": ["api.test", "*.api.test"]})
        ).is_success
        for host in ("evil.test", "*.test"):
            body = {"backend": "fake", "network": True, "egress_headers": {host: rule}}
            answer = await http.post("/v1/sandboxes", json=body)
            message = f"header rule for {host} names secret token, which is bound to api.test, *.api.test"
            assert answer.status_code == 400 and message in answer.json()["message"], answer.text
        body = {"templateID": "default", "allow_internet_access": True, "network": {"rules": {"evil.test": [e2b_rule]}}}
        answer = await e2b.post("/sandboxes", json=body)
        message = "header rule for evil.test names secret token, which is bound to api.test"
        assert answer.status_code == 400 and message in answer.json()["message"], answer.text
        assert (await e2b.post("/secrets", json={"name": "unbound", "value": "v"})).is_success
        # Accepted: a rule within the secret's hosts, and one naming a secret bound to no host.
        rooms.secrets.check([], {"x.api.test": {"A": "${secrets.token}"}, "evil.test": {"B": "${secrets.unbound}"}})

    async def main() -> None:
        paths = fake_home("rules")
        service = SandboxService(paths, backends={"fake": FakeBackend(paths)})
        app = create_app(paths, service=service)
        rooms = app.state.rooms
        e2b_app, key = create_control_app(rooms.e2b, Defaults(backend="fake")), rooms.e2b.keys.api_key
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://stasis") as http,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=e2b_app), base_url="http://e2b",
                              headers={"x-api-key": key}) as e2b,
        ):  # fmt: skip
            try:
                await scenario(rooms, http, e2b)
            finally:
                made = service.store.list()  # none, unless a check let one through
                for info in made:
                    await service.terminate(info.id)
        assert made == []

    asyncio.run(main())
