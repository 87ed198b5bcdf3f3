"""Opening a WebSocket to the daemon: on its unix socket, or over TCP with the token (STASIS_URL or a fleet's
STASIS_FLEET, with STASIS_TOKEN)."""

from __future__ import annotations

import os

from websockets.sync.client import ClientConnection, connect, unix_connect

from .paths import Paths


def open_websocket(paths: Paths, path: str) -> ClientConnection:
    """``path`` is the route with its query string, e.g. ``/v1/sandboxes/work/pty?cols=80``."""
    url = os.environ.get("STASIS_FLEET") or os.environ.get("STASIS_URL")  # a fleet's door, or one daemon's
    if url:
        token = os.environ.get("STASIS_TOKEN", "")
        ws_url = url.replace("http://", "ws://").replace("https://", "wss://").rstrip("/") + path
        return connect(ws_url, additional_headers={"authorization": f"Bearer {token}"}, max_size=None)
    return unix_connect(str(paths.socket), "ws://stasis" + path, max_size=None)
