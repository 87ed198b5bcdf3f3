"""A team's key at E2B's door, with the official `e2b` SDK: E2B_API_KEY may be a stasis team key; its sandboxes
are its team's; another team's key neither lists nor connects to nor kills them; scopes and the owner's routes hold."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from e2b import NotFoundException, Sandbox, SandboxException

from stasis import Client
from stasis import Sandbox as StasisSandbox
from stasis.sdk import team as teams
from tests.e2b.test_python_sdk import Listener, one_listener

listener = one_listener("gvisor")


def test_a_team_key_is_an_e2b_api_key_that_reaches_only_its_teams_sandboxes(listener: Listener, client: Client) -> None:
    red, blue = f"red-{uuid.uuid4().hex[:6]}", f"blue-{uuid.uuid4().hex[:6]}"
    for team in (red, blue):
        teams.create_team(team, client=client)
    red_key = teams.create_key(red, ["write", "exec"], client=client).key
    blue_key = teams.create_key(blue, ["write", "exec"], client=client).key
    reader_key = teams.create_key(red, ["read"], client=client).key
    urls: dict[str, Any] = {
        "api_url": listener.exports["E2B_API_URL"],
        "sandbox_url": listener.exports["E2B_SANDBOX_URL"],
    }
    sbx = Sandbox.create(api_key=red_key, timeout=600, **urls)
    try:
        assert sbx.commands.run("echo from-red").stdout == "from-red\n"
        assert StasisSandbox.connect(sbx.sandbox_id, client=client).info().spec.team == red
        listed = {s.sandbox_id for s in Sandbox.list(api_key=red_key, query=None, **urls).next_items()}
        assert listed == {sbx.sandbox_id}  # the owner's and other teams' sandboxes are not listed
        assert {s.sandbox_id for s in Sandbox.list(api_key=reader_key, query=None, **urls).next_items()} == listed
        assert Sandbox.list(api_key=blue_key, query=None, **urls).next_items() == []
        with pytest.raises(NotFoundException):
            Sandbox.connect(sbx.sandbox_id, api_key=blue_key, **urls)
        assert Sandbox.kill(sbx.sandbox_id, api_key=blue_key, **urls) is False  # "not found", as for no sandbox
        assert sbx.is_running()
        with pytest.raises(SandboxException, match="write"):
            Sandbox.create(api_key=reader_key, **urls)
        one = httpx.get(f"{urls['api_url']}/sandboxes/{sbx.sandbox_id}", headers={"X-API-Key": reader_key})
        assert one.status_code == 403 and "exec" in one.text  # its answer carries the envd token: not for a reader
        for path in ("/templates", "/volumes", "/secrets"):  # the owner's
            answer = httpx.get(urls["api_url"] + path, headers={"X-API-Key": red_key})
            assert answer.status_code == 403, (path, answer.text)
    finally:
        sbx.kill()
    logged = [e for team in (red, blue) for e in teams.audit(client=client, team=team)]  # a shared daemon's log is long
    assert {(e["team"], e["method"], e["status"]) for e in logged if e["path"].startswith("e2b:")} >= {
        (red, "POST", 201), (blue, "DELETE", 404)}  # fmt: skip
    for team in (red, blue):
        teams.remove_team(team, client=client)
    answer = httpx.get(urls["api_url"] + "/v2/sandboxes", headers={"X-API-Key": red_key})
    assert answer.status_code == 401  # a removed team's keys no longer open the door
