"""Lifecycle events to webhooks, through a real HTTP receiver on loopback run by the test: signed, in order, with
why a sandbox was suspended; a receiver that fails twice gets the event once (three attempts logged); one that is
down delays nothing else; events left in the outbox by a killed daemon are delivered after its restart; a webhook
never reaches a private address unless added with allow_private."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from stasis import CheckpointType, InvalidRequest, QuotaExceeded, Sandbox
from stasis.sdk import webhook as hooks
from tests.conftest import Daemon, wait_until
from tests.images.test_oci import free_port


class Receiver:
    """An HTTP server that records every POST; ``fail[path]`` answers 500 that many times first."""

    def __init__(self, port: int = 0) -> None:
        self.received: list[dict[str, Any]] = []
        self.fail: dict[str, int] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                failing = receiver.fail.get(self.path, 0) > 0
                receiver.fail[self.path] = receiver.fail.get(self.path, 0) - 1
                receiver.received.append({"path": self.path, "headers": dict(self.headers), "body": body,
                                          "answered": 500 if failing else 200})  # fmt: skip
                self.send_response(500 if failing else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self, path: str) -> list[dict[str, Any]]:
        """What was delivered (answered 200) at ``path``, in order."""
        return [json.loads(r["body"]) for r in self.received if r["path"] == path and r["answered"] == 200]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.close()


def signed_by(request: dict[str, Any], secret: str) -> bool:
    fields = dict(part.split("=", 1) for part in request["headers"]["stasis-signature"].split(","))
    mac = hmac.new(secret.encode(), f"{fields['t']}.".encode() + request["body"], hashlib.sha256).hexdigest()
    return hmac.compare_digest(mac, fields["v1"])


def test_events_reach_webhooks_signed_in_order_and_a_failing_receiver_gets_each_once(
    own_daemon: Daemon, receiver: Receiver
) -> None:
    own_daemon.start()
    base = f"http://127.0.0.1:{receiver.port}"
    receiver.fail["/flaky"] = 2
    with own_daemon.client() as client:
        every = hooks.add_webhook(f"{base}/all", client=client, allow_private=True)
        flaky = hooks.add_webhook(f"{base}/flaky", client=client, events=["created"], allow_private=True)
        down = hooks.add_webhook(f"http://127.0.0.1:{free_port()}/", client=client, allow_private=True)
        sbx = Sandbox.create("hooked", backend="gvisor", memory_mb=256, client=client)
        sbx.suspend()
        sbx.resume()
        sbx.checkpoint(CheckpointType.FILESYSTEM)
        idler = Sandbox.create("idler", backend="gvisor", memory_mb=256, timeout_secs=1, on_idle="suspend",
                               client=client)  # fmt: skip
        sbx.terminate()

        def mine(path: str, sandbox: str) -> list[tuple[str, str | None]]:
            return [(e["type"], e["reason"]) for e in receiver.events(path) if e["sandbox"]["id"] == sandbox]

        wait_until(lambda: ("killed", None) in mine("/all", sbx.id), timeout=60)
        assert [t for t, _ in mine("/all", sbx.id)] == ["created", "suspended", "resumed", "checkpointed", "killed"]
        assert ("suspended", "request") in mine("/all", sbx.id)
        wait_until(lambda: ("suspended", "idle") in mine("/all", idler.id), timeout=60)  # why it was suspended
        assert all(signed_by(r, every.secret) for r in receiver.received if r["path"] == "/all")
        assert not any(signed_by(r, flaky.secret) for r in receiver.received if r["path"] == "/all")
        assert len({e["id"] for e in receiver.events("/all")}) == len(receiver.events("/all"))  # each event once

        # The flaky receiver: two 500s, then the event, delivered once and logged three times.
        wait_until(lambda: len(receiver.events("/flaky")) >= 2, timeout=60)
        created = [e for e in receiver.events("/flaky") if e["sandbox"]["id"] == sbx.id]
        assert len(created) == 1 and created[0]["type"] == "created"
        (delivery,) = [d for d in hooks.deliveries(flaky.id, client=client) if d.sandbox_id == sbx.id]
        assert (delivery.status, delivery.attempts, delivery.last_status) == ("delivered", 3, 200)
        assert [a.status_code for a in hooks.attempts(delivery.id, client=client)] == [500, 500, 200]

        # The one that is down kept trying, and delayed nobody above; a redelivery on request is taken.
        pending = hooks.deliveries(down.id, client=client)  # newest first; the oldest is retried, the rest wait behind
        assert pending and all(d.status == "pending" for d in pending)
        assert pending[-1].attempts >= 1 and "ConnectError" in str(pending[-1].last_error)
        hooks.redeliver(delivery.id, client=client)
        wait_until(lambda: len([e for e in receiver.events("/flaky") if e["sandbox"]["id"] == sbx.id]) == 2, timeout=60)
        idler.terminate()
        hooks.remove_webhook(down.id, client=client)
        assert down.id not in {h.id for h in hooks.list_webhooks(client=client)}


def test_events_in_the_outbox_of_a_killed_daemon_are_delivered_after_its_restart(own_daemon: Daemon) -> None:
    port = free_port()  # the receiver is down while the events happen
    own_daemon.start()
    with own_daemon.client() as client:
        hooks.add_webhook(f"http://127.0.0.1:{port}/late", client=client, allow_private=True)
        sbx = Sandbox.create(backend="gvisor", memory_mb=256, client=client)
        sbx.terminate()
    own_daemon.kill()
    receiver = Receiver(port)
    try:
        own_daemon.start()
        wait_until(lambda: {e["type"] for e in receiver.events("/late")} >= {"created", "killed"}, timeout=90)
        assert {e["sandbox"]["id"] for e in receiver.events("/late")} == {sbx.id}
    finally:
        receiver.close()


def test_a_webhook_never_reaches_a_private_address_unless_allowed(own_daemon: Daemon) -> None:
    own_daemon.start()
    with own_daemon.client() as client:
        for url in ("http://127.0.0.1:9/", "http://localhost/hook", "http://[::1]:80/", "http://10.1.2.3/"):
            with pytest.raises(InvalidRequest, match="not a public address"):
                hooks.add_webhook(url, client=client)
        for url in ("ftp://example.com/", "http://user:pw@example.com/", "not a url"):
            with pytest.raises(InvalidRequest, match="http:// or https://"):
                hooks.add_webhook(url, client=client)
        with pytest.raises(InvalidRequest, match="unknown event"):
            hooks.add_webhook("http://127.0.0.1:9/", client=client, events=["exploded"], allow_private=True)
        assert hooks.list_webhooks(client=client) == []
        for _ in range(20):
            hooks.add_webhook("http://127.0.0.1:9/", client=client, allow_private=True)
        with pytest.raises(QuotaExceeded, match="the most webhooks"):  # a bounded number, each served by a task
            hooks.add_webhook("http://127.0.0.1:9/", client=client, allow_private=True)
