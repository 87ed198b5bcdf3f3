"""Traces: a daemon started with the standard OTEL_* variables exports spans of create, exec, suspend, resume,
checkpoint and fork over OTLP/HTTP to a real receiver run by the test (protobuf, decoded with OpenTelemetry's own
messages); a caller's traceparent makes them its children, and a command sees its span as TRACEPARENT."""

from __future__ import annotations

import base64
import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import Daemon, wait_until


class Collector:
    """An OTLP/HTTP traces endpoint: every span posted to /v1/traces, decoded."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest.FromString(body)
                    for resource in request.resource_spans:
                        service = {a.key: a.value.string_value for a in resource.resource.attributes}
                        for scope in resource.scope_spans:
                            for span in scope.spans:
                                attributes = {a.key: a.value.string_value or a.value.int_value for a in span.attributes}
                                collector.spans.append({"name": span.name, "trace_id": span.trace_id.hex(),
                                                        "parent": span.parent_span_id.hex(), "service": service,
                                                        "attributes": attributes})  # fmt: skip
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def named(self, trace_id: str) -> set[str]:
        return {s["name"] for s in self.spans if s["trace_id"] == trace_id}


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()
    yield found
    found.server.shutdown()
    found.server.server_close()


def test_operations_are_spans_of_the_callers_trace_and_a_command_sees_it(
    own_daemon: Daemon, collector: Collector
) -> None:
    own_daemon.start(OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, OTEL_SERVICE_NAME="stasis-under-test",
                     OTEL_BSP_SCHEDULE_DELAY="200")  # fmt: skip
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    headers = {"traceparent": f"00-{trace_id}-{parent}-01"}
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(own_daemon.paths.socket)), base_url="http://stasis",
                      headers=headers, timeout=300) as http:  # fmt: skip
        created = http.post("/v1/sandboxes", json={"backend": "gvisor", "memory_mb": 256}).json()
        sandbox = created["id"]
        ran = http.post(f"/v1/sandboxes/{sandbox}/exec", json={"cmd": ["sh", "-c", "echo $TRACEPARENT"]}).json()
        for path in ("suspend", "resume"):
            assert http.post(f"/v1/sandboxes/{sandbox}/{path}").status_code == 200
        checkpoint = http.post(f"/v1/sandboxes/{sandbox}/checkpoints", json={"type": "filesystem"}).json()
        children = http.post(f"/v1/sandboxes/{sandbox}/fork", json={"times": 1}).json()
        for child in (*children, created):
            http.delete(f"/v1/sandboxes/{child['id']}")
        http.delete(f"/v1/checkpoints/{checkpoint['id']}")

    seen = base64.b64decode(ran["stdout_b64"]).decode().strip()
    assert seen.startswith(f"00-{trace_id}-") and seen != headers["traceparent"]  # the exec's span, in our trace
    wanted = {"sandbox.create", "sandbox.exec", "sandbox.suspend", "sandbox.resume", "sandbox.checkpoint",
              "sandbox.fork"}  # fmt: skip
    wait_until(lambda: wanted <= collector.named(trace_id), timeout=60)
    ours = [s for s in collector.spans if s["trace_id"] == trace_id]
    roots = [s for s in ours if s["name"] == "sandbox.create"]
    assert roots[0]["parent"] == parent  # a child of the caller's span
    assert all(s["service"]["service.name"] == "stasis-under-test" for s in ours)
    assert {s["attributes"].get("stasis.sandbox.id") for s in ours if s["name"] != "sandbox.fork"} >= {sandbox}
    exec_span = next(s for s in ours if s["name"] == "sandbox.exec")
    assert exec_span["attributes"]["stasis.command"] == "sh" and seen.split("-")[2] != parent
