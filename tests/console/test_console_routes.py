"""The console's routes in process, on the fake backend: login, the CSRF gate on every action, the pages,
an action carried out, a checkpoint restored. (The real-browser tests are test_console.py.)"""

from __future__ import annotations

import re

import httpx
import pytest

from stasis.daemon.core.service import SandboxService
from tests.fastkit import over_tcp

pytestmark = pytest.mark.fast
TOKEN = "routes-token"


def with_console(scenario) -> None:  # type: ignore[no-untyped-def]
    over_tcp("console-routes", TOKEN, scenario)


async def logged_in(http: httpx.AsyncClient, token: str = TOKEN) -> str:
    """Log in; the page's CSRF token."""
    answer = await http.post("/ui/login", data={"token": token})
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/"
    page = await http.get("/ui/")
    return re.search(r'<meta name="csrf" content="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]


def test_pages_need_a_login_and_actions_the_pages_csrf_token() -> None:
    async def scenario(http: httpx.AsyncClient, service: SandboxService) -> None:
        assert (await http.get("/ui/")).headers["location"] == "/ui/login"
        wrong = await http.post("/ui/login", data={"token": "nope"})
        assert wrong.status_code == 401 and "neither this daemon" in wrong.text
        api = {"authorization": f"Bearer {TOKEN}"}
        created = await http.post("/v1/sandboxes", json={"name": "<b>box</b>", "backend": "fake"}, headers=api)
        assert created.status_code == 400  # names are validated before any page shows one
        created = await http.post("/v1/sandboxes", json={"name": "routes-box", "backend": "fake"}, headers=api)
        sandbox_id = created.json()["id"]
        assert (await http.post(f"/ui/sandboxes/{sandbox_id}/suspend")).status_code == 401  # no session
        csrf = await logged_in(http)
        assert "routes-box" in (await http.get("/ui/")).text
        assert "routes-box" in (await http.get("/ui/usage")).text
        assert (await http.post(f"/ui/sandboxes/{sandbox_id}/suspend")).status_code == 401  # no CSRF header
        forged = await http.post(f"/ui/sandboxes/{sandbox_id}/suspend", headers={"x-stasis-csrf": "forged"})
        assert forged.status_code == 401
        done = await http.post(f"/ui/sandboxes/{sandbox_id}/suspend", headers={"x-stasis-csrf": csrf})
        assert done.json() == {"ok": True} and service.get(sandbox_id).status.value == "suspended"
        page = await http.get(f"/ui/sandboxes/{sandbox_id}")
        assert page.status_code == 200 and "routes-box" in page.text  # shown resumed, its files listed
        missing = await http.get("/ui/sandboxes/sb-000000000000")
        assert missing.status_code == 404 and "no sandbox" in missing.text

    with_console(scenario)


def test_a_checkpoint_taken_and_restored_from_the_console() -> None:
    async def scenario(http: httpx.AsyncClient, service: SandboxService) -> None:
        api = {"authorization": f"Bearer {TOKEN}"}
        sandbox_id = (await http.post("/v1/sandboxes", json={"name": "tree", "backend": "fake"}, headers=api)).json()[
            "id"
        ]
        csrf = {"x-stasis-csrf": await logged_in(http)}
        taken = await http.post(f"/ui/sandboxes/{sandbox_id}/checkpoint", json={"type": "filesystem"}, headers=csrf)
        checkpoint = taken.json()["checkpoint"]
        assert checkpoint in (await http.get("/ui/checkpoints")).text
        restored = await http.post(f"/ui/checkpoints/{checkpoint}/restore", headers=csrf)
        child = restored.json()["sandbox"]
        assert service.get(child).from_checkpoint == checkpoint
        assert (await http.post(f"/ui/sandboxes/{child}/remove", headers=csrf)).json() == {"ok": True}
        assert service.store.get(child).status.value == "terminated"

    with_console(scenario)


def test_a_sandbox_page_shows_its_egress_audit_as_text() -> None:
    """The newest lines of the audit (written by the proxy's EgressAudit), a sandbox's claimed name escaped."""

    async def scenario(http: httpx.AsyncClient, service: SandboxService) -> None:
        api = {"authorization": f"Bearer {TOKEN}"}
        made = await http.post("/v1/sandboxes", json={"name": "audited", "backend": "fake"}, headers=api)
        sandbox_id = made.json()["id"]
        audit = service.network.audit
        assert audit is not None
        audit.record(sandbox_id, {"time": 1.0, "destination": "10.9.9.9", "port": 443, "verdict": "denied",
                                  "name": "<script>x</script>.test", "rule": "matches no allow_out rule"})  # fmt: skip
        allowed = {"verdict": "allowed", "name": "ok.test", "rule": "allow_out ok.test", "bytes_out": 7, "bytes_in": 99}
        audit.record(sandbox_id, {"time": 2.0, "destination": "10.9.9.8", "port": 80, **allowed})
        await logged_in(http)
        page = (await http.get(f"/ui/sandboxes/{sandbox_id}")).text
        assert "10.9.9.9:443" in page and "matches no allow_out rule" in page and "7 / 99" in page
        assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;.test" in page
        listed = (await http.get(f"/v1/sandboxes/{sandbox_id}/egress", headers=api)).json()
        assert [line["verdict"] for line in listed] == ["denied", "allowed"]

    with_console(scenario)


def test_a_teams_key_logs_in_and_sees_acts_on_and_restores_only_its_teams() -> None:
    async def scenario(http: httpx.AsyncClient, service: SandboxService) -> None:
        owner = {"authorization": f"Bearer {TOKEN}"}
        keys = {}
        for team in ("red", "blue"):
            assert (await http.post("/v1/teams", json={"name": team}, headers=owner)).status_code == 201
            made = await http.post("/v1/keys", json={"team": team, "scopes": ["read", "write", "exec"]}, headers=owner)
            keys[team] = made.json()["key"]
        reader = (await http.post("/v1/keys", json={"team": "red", "scopes": ["read"]}, headers=owner)).json()
        ids = {}
        for team in ("red", "blue"):
            made = await http.post("/v1/sandboxes", json={"name": f"{team}-box", "backend": "fake"},
                                   headers={"authorization": f"Bearer {keys[team]}"})  # fmt: skip
            ids[team] = made.json()["id"]
        red_checkpoint = (await http.post(f"/v1/sandboxes/{ids['red']}/checkpoints", json={"type": "filesystem"},
                                          headers={"authorization": f"Bearer {keys['red']}"})).json()["id"]  # fmt: skip

        tossed = await http.post("/ui/login", data={"token": keys["blue"]}, headers={"origin": "http://127.0.0.1:9"})
        assert tossed.status_code == 403  # a form from another origin (a sandbox's port) logs nobody in
        csrf = {"x-stasis-csrf": await logged_in(http, keys["blue"])}
        listed = (await http.get("/ui/")).text
        assert "blue-box" in listed and "red-box" not in listed and "team blue" in listed
        assert red_checkpoint not in (await http.get("/ui/checkpoints")).text
        used = (await http.get("/ui/usage")).text
        assert "blue-box" in used and "red-box" not in used and "(owner)" not in used  # its own team's usage
        nobody = await http.get("/ui/sandboxes/sb-000000000000")
        theirs = await http.get(f"/ui/sandboxes/{ids['red']}")
        assert theirs.status_code == nobody.status_code == 404  # not found, as on the API, word for word
        assert theirs.text.replace(ids["red"], "X") == nobody.text.replace("sb-000000000000", "X")
        for action in ("suspend", "remove"):
            refused = await http.post(f"/ui/sandboxes/{ids['red']}/{action}", headers=csrf)
            assert refused.status_code == 404, refused.text
        assert (await http.get(f"/ui/sandboxes/{ids['red']}/file", params={"path": "/etc/hostname"})).status_code == 404
        assert (await http.post(f"/ui/checkpoints/{red_checkpoint}/restore", headers=csrf)).status_code == 404
        assert service.get(ids["red"]).status.value == "running"
        done = await http.post(f"/ui/sandboxes/{ids['blue']}/suspend", headers=csrf)
        assert done.json() == {"ok": True}

        csrf = {"x-stasis-csrf": await logged_in(http, keys["red"])}  # red restores its own: the new one is red's
        child = (await http.post(f"/ui/checkpoints/{red_checkpoint}/restore", headers=csrf)).json()["sandbox"]
        assert service.get(child).spec.team == "red"

        csrf = {"x-stasis-csrf": await logged_in(http, reader["key"])}  # read only: sees, may not act
        assert "red-box" in (await http.get("/ui/")).text
        assert (await http.post(f"/ui/sandboxes/{ids['red']}/suspend", headers=csrf)).status_code == 403
        assert (await http.delete(f"/v1/keys/{reader['id']}", headers=owner)).status_code in (200, 204)
        gone = await http.get("/ui/")
        assert gone.status_code == 303 and gone.headers["location"] == "/ui/login"  # a revoked key's session ends

    with_console(scenario)
