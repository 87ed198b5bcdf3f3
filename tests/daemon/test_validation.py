"""Bad input gets a clear 4xx and creates nothing on the host."""

from __future__ import annotations

import httpx
import pytest

from stasis import Client, InvalidRequest, NameTaken, Sandbox, SandboxNotFound, StateError
from tests.conftest import Daemon, sandbox_processes_under

BAD_NAMES = [
    "",
    "a" * 64,
    "a/b",
    "..",
    "a..b",
    "../etc",
    "tab\tname",
    "new\nline",
    "nul\0",
    " lead",
    "-dash",
    "sb-0123456789ab",
]


def raw(daemon: Daemon) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.paths.socket)), base_url="http://stasis")


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_rejected_before_anything_exists(daemon: Daemon, name: str) -> None:
    sandboxes_before = set(daemon.paths.sandboxes.iterdir())
    processes_before = sandbox_processes_under(daemon.paths.home)
    with raw(daemon) as http:
        response = http.post("/v1/sandboxes", json={"name": name})
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "InvalidRequest"
    assert "name" in body["message"]
    assert set(daemon.paths.sandboxes.iterdir()) == sandboxes_before
    assert sandbox_processes_under(daemon.paths.home) == processes_before


def test_sdk_raises_invalid_request_with_the_reason(client: Client) -> None:
    with pytest.raises(InvalidRequest, match="invalid sandbox name 'a/b'"):
        Sandbox.create("a/b", client=client)


def test_out_of_range_resources_are_rejected(client: Client) -> None:
    with pytest.raises(InvalidRequest, match="memory_mb"):
        Sandbox.create(memory_mb=1, client=client)
    with pytest.raises(InvalidRequest, match="unknown image"):
        Sandbox.create(image="no-such-image", client=client)


def test_names_are_unique(client: Client) -> None:
    first = Sandbox.create("unique-name", client=client, memory_mb=256)
    try:
        with pytest.raises(NameTaken, match="already exists"):
            Sandbox.create("unique-name", client=client)
    finally:
        first.terminate()
    again = Sandbox.create("unique-name", client=client, memory_mb=256)  # a removed sandbox frees its name
    assert again.id != first.id
    again.terminate()


def test_unknown_sandbox_is_a_404_with_a_hint(daemon: Daemon, client: Client) -> None:
    with pytest.raises(SandboxNotFound, match="stasis ls"):
        Sandbox.connect("ghost", client=client)
    with raw(daemon) as http:
        response = http.post("/v1/sandboxes/ghost/exec", json={"cmd": ["true"]})
    assert response.status_code == 404
    assert response.json()["type"] == "SandboxNotFound"


def test_operations_resume_a_suspended_sandbox_and_refuse_a_removed_one(client: Client) -> None:
    sbx = Sandbox.create("sleepy", client=client, memory_mb=256)
    sbx.write_file("/root/f", b"x")
    sbx.suspend()
    assert sbx.suspend().status.value == "suspended"  # suspending twice is harmless
    assert sbx.read_file("/root/f") == b"x"  # resumed on demand
    assert sbx.info().status.value == "running"
    sbx.terminate()
    with pytest.raises(StateError, match="was removed"):
        sbx.run("true")  # ids are never reused: a removed sandbox says so
