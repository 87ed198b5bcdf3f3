"""One E2B listener's ASGI app: a request that names a sandbox goes to its envd or one of its ports; any other
to the control plane.

A request names a sandbox as the SDKs do: with ``E2B_SANDBOX_URL`` set, in the ``E2b-Sandbox-Id`` and
``E2b-Sandbox-Port`` headers; without it, in the Host, ``PORT-ID.DOMAIN`` (a wildcard DNS name and
certificate of the user's, see the README). Every sandbox request needs a credential, checked before the sandbox
is looked up (an unknown id and a known name are refused alike): the API key, or that sandbox's envd access token
(``X-Access-Token``: envd and every port), or for a port other than envd's its traffic access token
(``e2b-traffic-access-token``: the SDK's ``traffic_access_token``, for preview URLs; it never opens envd). A port
of a sandbox made with ``allowPublicTraffic`` needs none.
"""

from __future__ import annotations

import logging
from typing import Any

from e2b.envd.filesystem.filesystem_connect import FilesystemASGIApplication
from e2b.envd.process.process_connect import ProcessASGIApplication
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from ....desktop import VNC_PORT, VNC_VIEW_PORT
from ....e2b_signatures import FILES_PATH, SIGNED_SCOPE, signed_with, signer
from ....e2b_wire import ENVD_PORT, UNAUTHORIZED, sandbox_target
from ....errors import InvalidRequest, StasisError, clip
from ....kernels import PORT as KERNEL_PORT
from ...core.service import SandboxService
from ...rooms.operations import GuestOperations
from ...rooms.ports import Ports
from .control import create_control_app
from .filesystem import FilesystemService, create_files_app
from .port_proxy import proxy_http
from .port_websocket import proxy_websocket
from .process import ProcessService
from .requests import SANDBOX_HEADER, TOKEN_HEADER, TRAFFIC_TOKEN_HEADER
from .room import PAUSED, Defaults, E2bRoom

log = logging.getLogger(__name__)
SIGNED = "signature"


def envd_only(port: int, path: str) -> bool:
    """Whether ``port`` (and ``path`` on it) runs commands or code, or takes the desktop's keyboard: the envd
    token's. The kernel server runs code only at ``/execute`` (matched exactly, on the raw path); its contexts
    and health are a port's like any other, as E2B's code-interpreter SDK sends only the traffic token there."""
    if port in (ENVD_PORT, VNC_PORT, VNC_VIEW_PORT):
        return True
    return port == KERNEL_PORT and not (path == "/health" or path == "/contexts" or path.startswith("/contexts/"))


class E2bApp:
    def __init__(
        self, room: E2bRoom, core: SandboxService, ops: GuestOperations, ports: Ports, defaults: Defaults,
        domain: str | None = None,
    ) -> None:  # fmt: skip
        self.room = room
        self.ports = ports
        self.domain = domain
        self.control = create_control_app(room, defaults, domain)
        files = FilesystemService(core, ops)
        self.process = ProcessASGIApplication(ProcessService(core, ops, room.records))
        self.filesystem = FilesystemASGIApplication(files)
        self.files = create_files_app(ops, files)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return
        headers = Headers(scope=scope)
        target = self.target(headers) or self.signed_target(scope)
        if target is None:
            await self.control(scope, receive, send)
            return
        ref, port = target
        if not 0 < port < 65536:
            await self.refuse(scope, receive, send, 400, "E2b-Sandbox-Port must be a port number (1-65535)")
            return
        admission = self.admitted(headers, ref, port, scope)
        if not admission:
            await self.refuse(scope, receive, send, 401, UNAUTHORIZED)
            return
        if admission == SIGNED:  # its one file, operation and user: the user is the signed one, never a header's
            kept = [(k, v) for k, v in scope["headers"] if k.lower() != b"authorization"]
            scope = {**scope, "headers": kept, SIGNED_SCOPE: True}
        try:
            info = self.room.sandbox(ref)
        except StasisError as exc:
            await self.refuse(scope, receive, send, 502, str(exc))
            return
        scope = with_header(scope, SANDBOX_HEADER, info.id)
        if port == ENVD_PORT and scope["type"] == "http" and scope.get("path") == "/health" and info.status in PAUSED:
            await self.refuse(scope, receive, send, 502, f"sandbox {info.id} is paused")  # E2B's: not running
            return
        if port != ENVD_PORT:
            proxy = proxy_websocket if scope["type"] == "websocket" else proxy_http
            await proxy(self.ports, info.id, port, scope, receive, send)
            return
        path: str = scope["path"]
        if path.startswith("/process.Process/"):
            await self.process(scope, receive, send)
        elif path.startswith("/filesystem.Filesystem/"):
            await self.filesystem(scope, receive, send)
        else:
            await self.files(scope, receive, send)

    def admitted(self, headers: Headers, ref: str, port: int, scope: Scope) -> str | None:
        """How a request may reach ``port`` of the sandbox ``ref``, from its credentials alone (None: it may not):
        the tokens are the id's, so a name needs the API key. What runs code or drives the desktop (envd, the
        kernel server's ``/execute``, stasis' own VNC servers) needs the envd token even on a public sandbox; the
        traffic token opens the rest; a signed file URL (SIGNED) opens its one file."""
        keys = self.room.keys
        if keys.valid_api_key(headers.get("x-api-key")):
            return "key"
        presented = (headers.get(TOKEN_HEADER), headers.get(TRAFFIC_TOKEN_HEADER))
        if any(keys.valid_envd_token(ref, token) for token in presented):
            return "envd"
        path: str = scope.get("path", "")
        if port == ENVD_PORT and scope["type"] == "http":
            signed = signed_with(keys.envd_token(ref), scope["method"], path, scope.get("query_string", b""))
            return SIGNED if signed else None
        if envd_only(port, path):
            return None
        if any(keys.valid_traffic_token(ref, token) for token in presented) or self.public(ref):
            return "traffic"
        return None

    def public(self, ref: str) -> bool:
        """Whether ``ref`` is the id of a sandbox made with ``allowPublicTraffic`` (its ports need no token)."""
        try:
            record = self.room.records.get(ref)
        except InvalidRequest:  # not an id
            return False
        return record is not None and record.public_traffic

    def target(self, headers: Headers) -> tuple[str, int] | None:
        """(sandbox ref, port) a request names, or None for the control plane."""
        return sandbox_target(headers, self.domain)

    def signed_target(self, scope: Scope) -> tuple[str, int] | None:
        """(sandbox id, envd's port) of a signed file URL that names no sandbox: the sandbox whose token signed it."""
        if scope["type"] != "http" or scope.get("path") != FILES_PATH:
            return None
        query: bytes = scope.get("query_string", b"")
        if b"signature=" not in query:
            return None
        keys = self.room.keys
        candidates = ((info.id, keys.envd_token(info.id)) for info in self.room.core.list(include_terminated=False))
        sandbox_id = signer(candidates, scope["method"], FILES_PATH, query)
        return None if sandbox_id is None else (sandbox_id, ENVD_PORT)

    @staticmethod
    async def refuse(scope: Scope, receive: Receive, send: Send, status: int, message: str) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
            return
        await JSONResponse({"code": status, "message": clip(message)}, status_code=status)(scope, receive, send)


def with_header(scope: Scope, name: str, value: str) -> dict[str, Any]:
    key = name.encode()
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != key]
    return {**scope, "headers": [*headers, (key, value.encode())]}
