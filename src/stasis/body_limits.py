"""Request bodies within bounds: a JSON body larger than ``MAX_JSON_BODY`` is refused with 413
before it is read into memory. Uploads are exempt: they are streamed to the sandbox or to a file. Every HTTP door
uses it: the daemon's API and its E2B face, and a fleet's front door and E2B face."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

MAX_JSON_BODY = 16 << 20  # a run's stdin travels base64 in JSON: ~12 MiB of it
Scope = dict[str, Any]
Streamed = Callable[[str, str], bool]  # (method, path): a body that goes to a file as it arrives, bounded there


class BodyLimit:
    """Pure ASGI middleware: counts what arrives and answers 413 once a body is over the limit."""

    def __init__(self, app: Any, limit: int = MAX_JSON_BODY, streamed: Streamed | None = None) -> None:
        self.app = app
        self.limit = limit
        self.streamed = streamed or _streamed

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.streamed(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        seen, over = 0, False

        async def counted() -> Any:
            nonlocal seen, over
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                over = True
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except BaseException:
            if not over:  # (an inner middleware's task group may have wrapped _TooLarge in a group)
                raise
            await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({
            "type": "InvalidRequest",
            "message": f"the request body is over {self.limit >> 20} MiB; send files with PUT .../files "
            "(streamed) instead of inside JSON",
            "details": {"limit": self.limit},
        }).encode()  # fmt: skip
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


def _streamed(method: str, path: str) -> bool:
    """Bodies that go to a file as they arrive, never into memory: a file, a directory's tar, an image."""
    return (method == "PUT" and path.endswith(("/files", "/dirs"))) or (method, path) == ("POST", "/v1/images/import")


def e2b_upload(method: str, path: str) -> bool:
    """E2B's uploads, streamed to a file (and bounded there): a template's COPY files, a volume's file."""
    parts = path.strip("/").split("/")
    return method == "PUT" and (parts[:1] == ["volumecontent"] or (parts[:1] == ["templates"] and "files" in parts))
