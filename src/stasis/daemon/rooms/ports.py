"""Exposed ports: a server in a sandbox, reached through a URL the daemon serves.

Each exposed port gets its own listener on the daemon's host (127.0.0.1 unless
``STASIS_PORTS_HOST`` says otherwise), so a web app's absolute paths and WebSockets work as
they would on localhost, with no DNS set-up. A connection is let through only with a valid
token: ``?stasis_token=`` in the first request's URL (the daemon then sets a cookie for the
requests that follow, so a browser can load the page's assets), or an ``X-Stasis-Token`` /
``Authorization: Bearer`` header. Tokens are HMACs of (sandbox, port, expiry) under a key
kept in ``$STASIS_HOME/ports.key``: they survive a daemon restart, and nothing is stored per
token. ``public`` ports need none.

A connection to a suspended sandbox resumes it first (a delay, not an error); traffic counts
as activity for its idle clock. A sandbox without network has its ports too: a connection to
its loopback is carried by the agent (:mod:`.guest_tcp`; slower, and it holds the sandbox awake
while open). Listeners are recorded in the store and opened again, on the
same port where it is free, when the daemon restarts.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...errors import StasisError
from ...fsutil import atomic_write
from ...models import ExposedPort, ExposePortRequest
from ...network.http1 import forward_requests
from ...network.relay import pipe
from ..core.service import SandboxService
from ..core.tables import PortTable
from .guest_tcp import open_guest_tcp

log = logging.getLogger(__name__)

TOKEN_PARAM = "stasis_token"
STASIS_COOKIES = ("stasis_token_", "stasis_console")
HEAD_LIMIT = 64 * 1024
HEAD_TIMEOUT = 30.0
CONNECT_RETRY = 3.0  # seconds: a server that is just starting (or whose sandbox just resumed)


def load_key(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        atomic_write(path, secrets.token_bytes(32), mode=0o600)
        return path.read_bytes()


class PortGate:
    """Tokens for one daemon's exposed ports."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def _mac(self, sandbox_id: str, port: int, expires: int) -> str:
        digest = hmac.new(self.key, f"{sandbox_id}:{port}:{expires}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest[:24]).decode()

    def token(self, sandbox_id: str, port: int, ttl_secs: int) -> tuple[str, int]:
        expires = int(time.time()) + ttl_secs
        return f"{expires}.{self._mac(sandbox_id, port, expires)}", expires

    def valid(self, sandbox_id: str, port: int, token: str | None) -> bool:
        if not token or "." not in token:
            return False
        expires, _, mac = token.partition(".")
        if not expires.isdigit() or int(expires) < time.time():
            return False
        return hmac.compare_digest(mac, self._mac(sandbox_id, port, int(expires)))


def _response(status: str, text: str) -> bytes:
    body = text.encode() + b"\n"
    head = f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"connection: close\r\n\r\n" + body


class Ports:
    def __init__(self, service: SandboxService, table: PortTable) -> None:
        self.service = service
        self.table = table  # exposed ports: this room is its one writer
        self.host = os.environ.get("STASIS_PORTS_HOST", "127.0.0.1")
        self.gate = PortGate(b"")
        self._servers: dict[tuple[str, int], asyncio.Server] = {}
        self._public: dict[tuple[str, int], bool] = {}  # read at each connection: a change keeps the URL

    # ------------------------------------------------------------ listeners

    async def start(self) -> None:
        """Listen again for every port exposed before the daemon restarted."""
        self.gate = PortGate(load_key(self.service.paths.home / "ports.key"))
        live = {info.id for info in self.service.records()}
        for sandbox_id, port, public, listen_port in self.table.list_ports():
            if sandbox_id not in live:
                self.table.delete_ports(sandbox_id)
                continue
            try:
                await self._listen(sandbox_id, port, public, listen_port)
            except OSError as exc:
                log.warning("port %d of %s: %d is taken (%s); listening on another", port, sandbox_id, listen_port, exc)
                await self._listen(sandbox_id, port, public, 0)

    async def _listen(self, sandbox_id: str, port: int, public: bool, listen_port: int) -> int:
        key = (sandbox_id, port)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(sandbox_id, port, self._public.get(key, False), listen_port, reader, writer)

        server = await asyncio.start_server(handle, self.host, listen_port, limit=HEAD_LIMIT)
        listen_port = server.sockets[0].getsockname()[1]
        self._servers[key], self._public[key] = server, public
        self.table.save_port(sandbox_id, port, public, listen_port)
        return listen_port

    def _close(self, key: tuple[str, int]) -> None:
        self._public.pop(key, None)
        server = self._servers.pop(key, None)
        if server is not None:
            server.close()

    async def close(self) -> None:
        for key in list(self._servers):
            self._close(key)

    # ------------------------------------------------------------ the API

    async def expose(self, ref: str, request: ExposePortRequest) -> ExposedPort:
        info = self.service.lookup(ref)
        key = (info.id, request.port)
        server = self._servers.get(key)
        if server is None:
            listen_port = await self._listen(info.id, request.port, request.public, 0)
        else:  # exposed already: the same listener (and URL), public or not as asked now
            listen_port = server.sockets[0].getsockname()[1]
            self._public[key] = request.public
            self.table.save_port(info.id, request.port, request.public, listen_port)
        return self._describe(info.id, request.port, request.public, listen_port, request.ttl_secs)

    def _describe(self, sandbox_id: str, port: int, public: bool, listen_port: int, ttl: int) -> ExposedPort:
        listen = f"{self.host}:{listen_port}"
        if public:
            return ExposedPort(sandbox_id=sandbox_id, port=port, url=f"http://{listen}/", public=True, listen=listen)
        token, expires = self.gate.token(sandbox_id, port, ttl)
        url = f"http://{listen}/?{TOKEN_PARAM}={token}"
        return ExposedPort(sandbox_id=sandbox_id, port=port, url=url, public=False, listen=listen, expires_at=expires)

    def list(self, ref: str, ttl_secs: int = 86400) -> list[ExposedPort]:
        info = self.service.lookup(ref)
        return [self._describe(info.id, port, public, listen, ttl_secs)
                for _, port, public, listen in self.table.list_ports(info.id)]  # fmt: skip

    async def unexpose(self, ref: str, port: int) -> None:
        info = self.service.lookup(ref)
        self._close((info.id, port))
        self.table.delete_ports(info.id, port)

    def exposed(self) -> dict[str, list[int]]:
        """Each sandbox's exposed ports (the console shows them)."""
        ports: dict[str, list[int]] = {}
        for sandbox_id, port, _public, _listen in self.table.list_ports():
            ports.setdefault(sandbox_id, []).append(port)
        return ports

    async def forget(self, sandbox_id: str) -> None:
        """The sandbox is gone: its listeners close, its records go."""
        for key in [k for k in self._servers if k[0] == sandbox_id]:
            self._close(key)
        self.table.delete_ports(sandbox_id)

    # ------------------------------------------------------------ one connection

    async def open(self, sandbox_id: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the port in the sandbox, resuming it first if it is suspended: into its network
        namespace, or (a sandbox without network) to its loopback through the agent."""
        service = self.service
        info = await service.ensure_running(service.record(sandbox_id))  # attached: by create, resume, adopt
        service.activity.touch(sandbox_id)
        deadline = time.monotonic() + CONNECT_RETRY
        while True:
            try:
                if info.spec.network is None:
                    return await open_guest_tcp(service, sandbox_id, port)
                return await service.connect_port(sandbox_id, port)
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    async def _serve(
        self, sandbox_id: str, port: int, public: bool, listen_port: int,
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
    ) -> None:  # fmt: skip
        try:
            async with asyncio.timeout(HEAD_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            writer.close()
            return
        cookie = f"stasis_token_{listen_port}"
        try:
            head, tokens, from_query = _strip_token(head, cookie)
        except ValueError:
            writer.write(_response("400 Bad Request", "not an HTTP/1 request"))
            writer.close()
            return
        if not public and not any(self.gate.valid(sandbox_id, port, token) for token in tokens):
            text = (f"port {port} of sandbox {sandbox_id} needs its token: open the URL that `stasis port` or "
                    "expose_port() printed (?stasis_token=...), or send an X-Stasis-Token header")  # fmt: skip
            writer.write(_response("401 Unauthorized", text))
            writer.close()
            return
        try:
            upstream = await self.open(sandbox_id, port)
        except (StasisError, OSError, TimeoutError) as exc:
            writer.write(_response("502 Bad Gateway", f"nothing answers on port {port} of sandbox {sandbox_id}: {exc}"))
            writer.close()
            return
        touch = lambda: self.service.activity.touch(sandbox_id)  # noqa: E731
        rewrite = lambda later: _strip_token(later, cookie)[0]  # noqa: E731
        set_cookie = f"{cookie}={tokens[0]}" if from_query else None
        try:
            await asyncio.gather(forward_requests(reader, upstream[1], head, rewrite, touch),
                                 _responses(upstream[0], writer, set_cookie, touch))  # fmt: skip
        finally:
            for side in (writer, upstream[1]):
                side.close()


async def _responses(
    upstream: asyncio.StreamReader, writer: asyncio.StreamWriter, set_cookie: str | None, touch: Callable[[], None]
) -> None:
    """The app's answers, as they come; the first gets our cookie when the token came in the URL (the
    browser keeps it for the page's other requests)."""
    with contextlib.suppress(asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        if set_cookie is not None:
            reply = await upstream.readuntil(b"\r\n\r\n")
            first_line_end = reply.index(b"\r\n") + 2
            header = f"set-cookie: {set_cookie}; Path=/; HttpOnly; SameSite=Lax\r\n".encode()
            writer.write(reply[:first_line_end] + header + reply[first_line_end:])
        await pipe(upstream, writer, touch)


def _strip_token(head: bytes, cookie: str) -> tuple[bytes, list[str], bool]:
    """The request head without stasis's token (the app never sees it), the tokens it may carry (URL,
    X-Stasis-Token, our cookie, a bearer header that may be the app's own), and whether the URL had one."""
    lines = head[:-4].split(b"\r\n")
    method, target, version = lines[0].decode("latin-1").split(" ", 2)
    url = urlsplit(target)
    query = parse_qsl(url.query, keep_blank_values=True)
    tokens = [v for k, v in query if k == TOKEN_PARAM]
    from_query = bool(tokens)
    if from_query:
        kept_query = urlencode([(k, v) for k, v in query if k != TOKEN_PARAM])
        target = urlunsplit(("", "", url.path or "/", kept_query, url.fragment))
    headers = []
    for line in lines[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        key, value = name.strip().lower(), value.strip()
        if key == "x-stasis-token":
            tokens.append(value)
            continue
        if key == "authorization" and value.startswith("Bearer "):
            tokens.append(value.removeprefix("Bearer "))
        if key == "cookie":
            # every stasis cookie stays here: this port's token, other ports' (a browser sends all of a host's
            # cookies to each of its ports) and the console's session
            pairs = [part.strip().partition("=") for part in value.split(";") if part.strip()]
            tokens += [v for k, _, v in pairs if k == cookie]
            kept = "; ".join(f"{k}={v}" for k, _, v in pairs if not k.startswith(STASIS_COOKIES))
            if kept:
                headers.append(f"{name}: {kept}".encode("latin-1"))
            continue
        headers.append(line)
    rebuilt = [f"{method} {target} {version}".encode("latin-1"), *headers]
    return b"\r\n".join(rebuilt) + b"\r\n\r\n", tokens, from_query
