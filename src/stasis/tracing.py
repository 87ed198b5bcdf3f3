"""Traces: OpenTelemetry spans of the daemon's operations (create, exec, suspend, resume, checkpoint, fork), with
the sandbox and its team as attributes, exported over OTLP/HTTP when the standard variables say where
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_SERVICE_NAME``,
``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_BSP_SCHEDULE_DELAY``, ``OTEL_SDK_DISABLED``...). Without them every span is
the API's no-op: nothing is recorded and nothing is sent.

A request's ``traceparent`` (W3C Trace Context) makes its spans children of the caller's; a command run in a
sandbox gets the current span as ``TRACEPARENT`` in its environment, so what it does joins the same trace.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Span, Status, StatusCode

log = logging.getLogger(__name__)

tracer = trace.get_tracer("stasis")
_started = False


def setup() -> bool:
    """Export spans if the environment names a collector; whether it does. Once per process."""
    global _started
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if _started or not endpoint or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return _started
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "stasis")}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _started = True
    log.info("traces exported over OTLP/HTTP to %s", endpoint)
    return True


def shutdown() -> None:
    provider = trace.get_tracer_provider()
    if _started and hasattr(provider, "shutdown"):
        provider.shutdown()  # flushes what is queued


@contextmanager
def incoming(headers: Mapping[str, str]) -> Iterator[None]:
    """The caller's trace (its ``traceparent``) current while a request is served."""
    token = context.attach(propagate.extract(dict(headers)))
    try:
        yield
    finally:
        context.detach(token)


@contextmanager
def span(name: str, sandbox: str | None = None, team: str | None = None, **attributes: Any) -> Iterator[Span]:
    """A span of one operation; an exception marks it failed and goes on."""
    fields = {"stasis.sandbox.id": sandbox, "stasis.team": team, **attributes}
    with tracer.start_as_current_span(name, attributes={k: v for k, v in fields.items() if v is not None}) as current:
        try:
            yield current
        except BaseException as exc:
            current.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
            raise


def traceparent() -> str | None:
    """The current span as a W3C ``traceparent``, for a command's environment; None outside any trace."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")
