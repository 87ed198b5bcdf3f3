"""The console's file download streams a sandbox's file: the daemon holds one chunk of it at a time, never the
whole file (a sandbox chooses how big its files are). In process, on the fake backend, whose agent reads the
host's files: the file is one in the test's own temporary directory."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from stasis.daemon.app import create_app
from stasis.daemon.core.service import SandboxService
from tests.fakes import FakeBackend
from tests.fastkit import fake_home

pytestmark = pytest.mark.fast
TOKEN = "download-token"
MIB = 1 << 20


def test_a_large_file_downloads_in_chunks_and_the_view_reads_only_its_head(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    with big.open("wb") as f:
        for i in range(48):
            f.write(bytes([i]) * MIB)
    digest = hashlib.sha256(big.read_bytes()).hexdigest()

    async def main() -> None:
        paths = fake_home("console-download")
        service = SandboxService(paths, backends={"fake": FakeBackend(paths)})
        app = create_app(paths, token=TOKEN, service=service)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
                api = {"authorization": f"Bearer {TOKEN}"}
                created = await http.post("/v1/sandboxes", json={"name": "files", "backend": "fake"}, headers=api)
                sandbox_id = created.json()["id"]
                assert (await http.post("/ui/login", data={"token": TOKEN})).status_code == 303
                cookie = "; ".join(f"{k}={v}" for k, v in http.cookies.items())
                parts = await download(app, f"/ui/sandboxes/{sandbox_id}/file", f"path={big}", cookie)
                view = await http.get(f"/ui/sandboxes/{sandbox_id}/file", params={"path": str(big), "view": "1"})
                await service.terminate(sandbox_id)
        assert hashlib.sha256(b"".join(parts)).hexdigest() == digest
        assert len(parts) > 1 and max(len(part) for part in parts) <= 8 * MIB  # streamed, not one 48 MiB body
        assert view.status_code == 200 and "(the first MiB; download it for the rest)" in view.text

    asyncio.run(main())


async def download(app: Any, path: str, query: str, cookie: str) -> list[bytes]:
    """The body parts the app hands its server for one GET (what the server holds at a time)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
             "headers": [(b"host", b"127.0.0.1:8000"), (b"cookie", cookie.encode())],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}  # fmt: skip
    parts: list[bytes] = []
    status: list[int] = []
    asked, done = asyncio.Event(), asyncio.Event()

    async def receive() -> dict[str, Any]:
        if not asked.is_set():
            asked.set()
            return {"type": "http.request", "body": b"", "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif message["type"] == "http.response.body":
            if message.get("body"):
                parts.append(message["body"])
            if not message.get("more_body"):
                done.set()

    await app(scope, receive, send)
    assert status == [200]
    return parts
