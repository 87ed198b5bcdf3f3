"""E2B's lifecycle events through its face: the events API and webhooks as E2B documents them (registered with
E2B's own request, delivered with its payload and e2b-signature), for a sandbox the official SDK drives; a team's
key sees its own team's events and cannot point a webhook at a private address."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from stasis.sdk import team as teams
from tests.conftest import Daemon, wait_until
from tests.daemon.test_webhooks import Receiver
from tests.e2b.test_python_sdk import Listener

SECRET = "e2b-webhook-secret-of-the-test"


def e2b_signed(request: dict[str, Any]) -> bool:
    expected = base64.b64encode(hashlib.sha256(SECRET.encode() + request["body"]).digest()).decode().rstrip("=")
    return request["headers"]["e2b-signature"] == expected


def test_e2b_events_api_and_webhooks(own_daemon: Daemon) -> None:
    own_daemon.start(STASIS_WEBHOOKS_ALLOW_PRIVATE="1")  # the owner lets its E2B key reach the test's receiver
    listener, receiver = Listener(own_daemon, "gvisor"), Receiver()
    try:
        urls = {"api_url": listener.exports["E2B_API_URL"], "sandbox_url": listener.exports["E2B_SANDBOX_URL"]}
        api = httpx.Client(base_url=urls["api_url"], headers={"X-API-Key": listener.exports["E2B_API_KEY"]})
        made = api.post("/events/webhooks", json={
            "name": "test hook", "url": f"http://127.0.0.1:{receiver.port}/e2b", "enabled": True,
            "events": ["sandbox.lifecycle.created", "sandbox.lifecycle.paused", "sandbox.lifecycle.resumed",
                       "sandbox.lifecycle.killed"], "signatureSecret": SECRET})  # fmt: skip
        assert made.status_code == 201, made.text
        hook = made.json()
        assert hook["enabled"] and hook["name"] == "test hook" and "signatureSecret" not in hook

        sbx = Sandbox.create(metadata={"run": "events"}, api_key=listener.exports["E2B_API_KEY"], **urls)
        sbx.pause()
        sbx = Sandbox.connect(sbx.sandbox_id, api_key=listener.exports["E2B_API_KEY"], **urls)
        sbx.kill()

        wanted = ["sandbox.lifecycle.created", "sandbox.lifecycle.paused", "sandbox.lifecycle.resumed",
                  "sandbox.lifecycle.killed"]  # fmt: skip
        wait_until(lambda: [e["type"] for e in receiver.events("/e2b")] == wanted, timeout=60)
        delivered = [r for r in receiver.received if r["path"] == "/e2b"]
        assert all(e2b_signed(r) and r["headers"]["e2b-webhook-id"] == hook["id"] for r in delivered)
        first = json.loads(delivered[0]["body"])
        assert first["version"] == "v2" and first["sandboxId"] == sbx.sandbox_id
        assert first["eventData"]["sandbox_metadata"] == {"run": "events"}  # E2B's payload, with the metadata
        killed = json.loads(delivered[-1]["body"])
        assert killed["eventData"]["execution"]["memory_mb"] > 0

        events = api.get(f"/events/sandboxes/{sbx.sandbox_id}", params={"limit": 100}).json()
        assert [e["type"] for e in events if e["type"] in wanted] == list(reversed(wanted))  # newest first
        only = api.get(f"/events/sandboxes/{sbx.sandbox_id}", params={"types": "sandbox.lifecycle.paused"}).json()
        assert [e["type"] for e in only] == ["sandbox.lifecycle.paused"]

        assert api.patch(f"/events/webhooks/{hook['id']}", json={"enabled": False}).json()["enabled"] is False
        assert [h["id"] for h in api.get("/events/webhooks").json()] == [hook["id"]]
        assert api.delete(f"/events/webhooks/{hook['id']}").status_code == 200
        assert api.get(f"/events/webhooks/{hook['id']}").status_code == 404

        # A team's key: its own events only, and never a private address.
        with own_daemon.client() as owner:
            teams.create_team("evented", client=owner)
            key = teams.create_key("evented", ["write", "exec"], client=owner).key
        as_team = httpx.Client(base_url=urls["api_url"], headers={"X-API-Key": key})
        assert as_team.get(f"/events/sandboxes/{sbx.sandbox_id}").json() == []
        refused = as_team.post("/events/webhooks", json={"url": f"http://127.0.0.1:{receiver.port}/team"})
        assert refused.status_code == 400 and "not a public address" in refused.text
    finally:
        receiver.close()
        listener.close()


@pytest.mark.fast
def test_unknown_e2b_event_types_are_refused() -> None:
    from stasis.daemon.faces.e2b.event_routes import ours

    assert ours(["sandbox.lifecycle.paused"]) == ["suspended"]
    with pytest.raises(Exception, match="unknown event type"):
        ours(["sandbox.lifecycle.exploded"])
