"""Request recipes about the daemon's host rather than one sandbox: disk usage, console login tokens, the
remote store (what it holds, push and pull)."""

from __future__ import annotations

from ..models import DiskUsage, RemoteEntry, TransferResult
from ._base import Call, _model, _models


def remote_call(action: str, ref: str, kind: str | None) -> Call:
    """Push to or pull from the daemon's remote store (``kind``: "sandbox", "checkpoint" or either)."""
    return Call("POST", f"/v1/remote/{action}", _model(TransferResult), json={"ref": ref, "kind": kind})


def remote_listing_call() -> Call:
    return Call("GET", "/v1/remote", _models(RemoteEntry))


def disk_usage_call() -> Call:
    return Call("GET", "/v1/df", _model(DiskUsage))


def console_token_call() -> Call:
    return Call("POST", "/v1/console/tokens", lambda r: r.json()["token"])
