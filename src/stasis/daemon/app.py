"""HTTP routes. Thin: validate, call the service, serialise. Errors become {type, message, details}."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import secrets
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import FastAPI, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..console import create_console
from ..console.sessions import Sessions
from ..errors import ImageNotFound, InvalidRequest, NotFound, StasisError, Unsupported
from ..fsutil import no_space
from ..images import ImageInfo
from ..models import (
    CheckpointInfo,
    CommitImageRequest,
    CreateCheckpointRequest,
    CreatePoolRequest,
    CreateSandboxRequest,
    DaemonInfo,
    DiskUsage,
    ExposedPort,
    ExposePortRequest,
    FileEntry,
    ForkRequest,
    PoolInfo,
    ProcessInfo,
    ProcessOutput,
    RemoteEntry,
    RemoteRequest,
    RunRequest,
    RunResult,
    SandboxInfo,
    SignalRequest,
    SshHostKey,
    SshKeysRequest,
    StartProcessRequest,
    StdinRequest,
    TransferResult,
    describe_validation_errors,
)
from ..netpolicy import NetworkPolicy
from ..paths import Paths
from . import image_use, mcp_http, ssh
from .forks import fork as fork_sandbox
from .idle import IdleReaper
from .limits import BodyLimit
from .operations import GuestOperations
from .portforward import serve_port_connection
from .recovery import Recovery
from .remote import RemoteService
from .service import SandboxService
from .terminal import serve_terminal
from .usage import disk_usage as measure_disk

log = logging.getLogger(__name__)
Path_ = Annotated[str, Query(min_length=1, max_length=4096, description="path inside the sandbox")]


def create_app(
    paths: Paths,
    token: str | None = None,
    on_shutdown: Callable[[], None] | None = None,
    service: SandboxService | None = None,
) -> FastAPI:
    """The daemon's app; ``service`` may be given (one with a test's fake backend)."""
    service = service or SandboxService(paths)
    ops = GuestOperations(service)
    reaper = IdleReaper(service)
    host_keys = ssh.HostKeys(paths.home / "ssh-host-keys")
    mcp_app: mcp_http.LazyMcpApp | None = None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        await Recovery(service).run()
        await service.pools.start()
        reaper.start()
        yield
        if mcp_app is not None:
            await mcp_app.aclose()
        await reaper.stop()
        await service.close()
        if on_shutdown is not None:  # uvicorn re-raises SIGTERM after this: code after run() may never run
            on_shutdown()

    app = FastAPI(title="stasis", version=__version__, lifespan=lifespan)
    app.add_middleware(BodyLimit)
    app.state.service = service
    mcp_app = mcp_http.mount(app, paths)
    logins = Sessions()  # the console's: it asks for a token in a form, then keeps a cookie session
    if token:
        logins.tokens.add(token)
    app.mount("/ui", create_console(service, ops, paths, logins))

    @app.get("/ui", include_in_schema=False)
    async def console_root() -> RedirectResponse:
        return RedirectResponse("/ui/")

    @app.post("/v1/console/tokens", include_in_schema=False)
    async def console_token() -> dict[str, str]:
        """A new console login token (for `stasis ui`); it lasts as long as this daemon runs."""
        new = secrets.token_urlsafe(24)
        logins.tokens.add(new)
        return {"token": new}

    if token:

        @app.middleware("http")
        async def require_token(request: Request, call_next):  # type: ignore[no-untyped-def]
            server = request.scope.get("server")
            if server is not None and server[1] is None:  # the unix socket: mode 0600 already guards it
                return await call_next(request)
            if request.url.path == "/ui" or request.url.path.startswith("/ui/"):  # the console's own login
                return await call_next(request)
            sent = request.headers.get("authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
                return _error(
                    InvalidRequest("missing or wrong API token; send 'Authorization: Bearer $STASIS_TOKEN'"),
                    401,
                )
            return await call_next(request)

    @app.exception_handler(StasisError)
    async def stasis_error(request: Request, exc: StasisError) -> JSONResponse:
        return _error(exc)

    async def storage_error(request: Request, exc: Exception) -> JSONResponse:
        """A full disk on the host (an OSError, or the store's "database or disk is full") is said so,
        with what to free; anything else is a daemon bug."""
        full = no_space(exc, paths.home)
        if isinstance(full, StasisError):
            return _error(full)
        log.exception("unexpected error serving %s %s", request.method, request.url.path)
        return _error(StasisError(f"the daemon hit an unexpected error: {exc}; see {paths.logfile}"))

    app.add_exception_handler(OSError, storage_error)
    app.add_exception_handler(sqlite3.OperationalError, storage_error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        cls = NotFound if exc.status_code == 404 else InvalidRequest
        message = f"no such route: {request.method} {request.url.path}" if exc.status_code == 404 else str(exc.detail)
        return _error(cls(f"{message} (see /docs for the API)"), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(InvalidRequest(describe_validation_errors(list(exc.errors()))))

    # -------------------------------------------------------- daemon

    @app.get("/v1/health")
    async def health() -> DaemonInfo:
        return DaemonInfo(
            version=__version__, pid=os.getpid(), home=str(paths.home), backends=service.describe_backends()
        )

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        body = service.metrics.render(service.list(include_terminated=True))
        return Response(body, media_type="text/plain; version=0.0.4")

    @app.get("/v1/images")
    async def images() -> list[ImageInfo]:
        return service.images.list()

    @app.get("/v1/images/{name}")
    async def image(name: str) -> ImageInfo:
        try:
            return service.images.get(name)
        except InvalidRequest as exc:  # creating from an unknown image is a bad request; looking one up, a 404
            raise ImageNotFound(exc.message, image=name) from None

    @app.delete("/v1/images/{name}")
    async def remove_image(name: str) -> list[str]:
        """Every build of the image; 409 naming the sandboxes and checkpoints that use one."""
        return await asyncio.to_thread(image_use.remove, service, name)

    @app.post("/v1/images/commit")
    async def commit_image(request: CommitImageRequest) -> ImageInfo:
        """A build step's image: the parent's files with a build sandbox's FILESYSTEM checkpoint applied."""
        return await image_use.commit(service, request)

    @app.post("/v1/images/prune")
    async def prune_images(everything: bool = False) -> list[str]:
        """Builds nothing uses that no name resolves to any more (``everything``: unused current ones too)."""
        return await asyncio.to_thread(image_use.prune, service, everything)

    # -------------------------------------------------------- sandboxes

    @app.post("/v1/sandboxes", status_code=201)
    async def create(request: CreateSandboxRequest) -> SandboxInfo:
        return await service.create(request)

    @app.get("/v1/sandboxes")
    async def list_sandboxes(
        all: bool = False,
        limit: Annotated[int | None, Query(ge=1, le=1000, description="at most this many (a page)")] = None,
        after: Annotated[str | None, Query(description="the id of the last sandbox of the previous page")] = None,
    ) -> list[SandboxInfo]:
        cursor = None
        if after is not None:
            last = service.store.get(after)
            cursor = (last.created_at, last.id)
        return service.list(include_terminated=all, limit=limit, after=cursor)

    @app.post("/v1/pools", status_code=201)
    async def create_pool(request: CreatePoolRequest) -> PoolInfo:
        return await service.pools.create(request)

    @app.get("/v1/pools")
    async def list_pools() -> list[PoolInfo]:
        return service.pools.list()

    @app.get("/v1/pools/{name}")
    async def get_pool(name: str) -> PoolInfo:
        return service.pools.describe(name)

    @app.delete("/v1/pools/{name}")
    async def remove_pool(name: str) -> PoolInfo:
        return await service.pools.remove(name)

    @app.get("/v1/sandboxes/{ref}")
    async def get(ref: str) -> SandboxInfo:
        return service.get(ref)

    @app.delete("/v1/sandboxes/{ref}")
    async def terminate(ref: str) -> SandboxInfo:
        return await service.terminate(ref)

    @app.post("/v1/sandboxes/{ref}/suspend")
    async def suspend(ref: str) -> SandboxInfo:
        return await service.suspend(ref)

    @app.post("/v1/sandboxes/{ref}/resume")
    async def resume(ref: str) -> SandboxInfo:
        return await service.resume(ref)

    @app.post("/v1/sandboxes/{ref}/checkpoints", status_code=201)
    async def checkpoint(ref: str, request: CreateCheckpointRequest) -> CheckpointInfo:
        return await service.checkpoint(ref, request)

    @app.post("/v1/sandboxes/{ref}/fork", status_code=201)
    async def fork(ref: str, request: ForkRequest) -> list[SandboxInfo]:
        return await fork_sandbox(service, ref, request.times)

    @app.get("/v1/checkpoints")
    async def list_checkpoints() -> list[CheckpointInfo]:
        return service.store.list_checkpoints()

    @app.get("/v1/checkpoints/{ref}")
    async def get_checkpoint(ref: str) -> CheckpointInfo:
        return service.store.get_checkpoint(ref)

    @app.delete("/v1/checkpoints/{ref}")
    async def delete_checkpoint(ref: str) -> CheckpointInfo:
        return service.delete_checkpoint(ref)

    def remote() -> RemoteService:
        if service.remote is None:
            raise Unsupported("no remote store is configured; start the daemon with STASIS_REMOTE=s3://bucket/prefix")
        return service.remote

    @app.get("/v1/remote")
    async def remote_listing() -> list[RemoteEntry]:
        """What the remote store holds: sandboxes (with their owner node) and checkpoints."""
        return await remote().listing()

    @app.post("/v1/remote/push")
    async def push(request: RemoteRequest) -> TransferResult:
        """Send a checkpoint, or a sandbox (suspended first), to the remote store; a sandbox leaves this node."""
        return await remote().push(request.ref, request.kind)

    @app.post("/v1/remote/pull")
    async def pull(request: RemoteRequest) -> TransferResult:
        """Fetch a checkpoint, or take a sandbox over (suspended), from the remote store."""
        return await remote().pull(request.ref, request.kind)

    @app.get("/v1/df")
    async def disk_usage() -> DiskUsage:
        return await asyncio.to_thread(measure_disk, service)

    @app.get("/v1/sandboxes/{ref}/transitions")
    async def transitions(ref: str) -> list[dict]:
        return service.store.transitions(service.get(ref).id)

    # -------------------------------------------------------- commands and processes

    @app.post("/v1/sandboxes/{ref}/exec")
    async def run(ref: str, request: RunRequest) -> RunResult:
        return await ops.run(ref, request)

    @app.post("/v1/sandboxes/{ref}/exec/stream")
    async def run_stream(ref: str, request: RunRequest) -> StreamingResponse:
        """The command's output as JSON lines while it runs; the last line has its exit code."""
        events = ops.run_stream(ref, request)
        first = await anext(events)  # errors (unknown sandbox, bad cwd) become a proper HTTP error

        async def lines() -> AsyncIterator[bytes]:
            yield json.dumps(first).encode() + b"\n"
            try:
                async for event in events:
                    yield json.dumps(event).encode() + b"\n"
            except StasisError as exc:
                yield json.dumps({"error": exc.to_payload()}).encode() + b"\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def accepted(websocket: WebSocket) -> bool:
        """Accept a WebSocket; over TCP only with the token (unix-socket clients are trusted by its mode)."""
        if token and websocket.scope.get("server", (None, None))[1] is not None:
            sent = websocket.headers.get("authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
                await websocket.close(code=4401, reason="missing or wrong API token")
                return False
        await websocket.accept()
        return True

    @app.websocket("/v1/sandboxes/{ref}/pty")
    async def pty(websocket: WebSocket, ref: str, cols: int = 80, rows: int = 24, cmd: str | None = None) -> None:
        """A terminal: binary frames are keystrokes and screen output; text frames are JSON control
        messages ({"type": "resize", "cols": C, "rows": R}). Closing detaches; the program goes on
        only if it is tmux (the default: a tmux session named after the sandbox)."""
        if not await accepted(websocket):
            return
        try:
            await serve_terminal(service, websocket, ref, cols, rows, json.loads(cmd) if cmd else None)
        except StasisError as exc:
            await websocket.close(code=4400, reason=exc.message[:120])
        except WebSocketDisconnect:
            pass

    @app.websocket("/v1/sandboxes/{ref}/ssh")
    async def ssh_session(websocket: WebSocket, ref: str) -> None:
        """One SSH connection to the sandbox's OpenSSH server: binary frames both ways (`stasis ssh-proxy`)."""
        if not await accepted(websocket):
            return
        try:
            await ssh.serve_session(service, host_keys, websocket, ref)
        except StasisError as exc:
            await websocket.close(code=4400, reason=exc.message[:120])
        except WebSocketDisconnect:
            pass

    @app.put("/v1/sandboxes/{ref}/network")
    async def update_network(ref: str, policy: NetworkPolicy) -> SandboxInfo:
        return await service.update_network(ref, policy)

    @app.post("/v1/sandboxes/{ref}/ports", status_code=201)
    async def expose_port(ref: str, request: ExposePortRequest) -> ExposedPort:
        return await service.ports.expose(ref, request)

    @app.get("/v1/sandboxes/{ref}/ports")
    async def list_ports(ref: str) -> list[ExposedPort]:
        return service.ports.list(ref)

    @app.delete("/v1/sandboxes/{ref}/ports/{port}", status_code=204)
    async def unexpose_port(ref: str, port: int) -> Response:
        await service.ports.unexpose(ref, port)
        return Response(status_code=204)

    @app.websocket("/v1/sandboxes/{ref}/ports/{port}/connect")
    async def port_connect(websocket: WebSocket, ref: str, port: int) -> None:
        """A raw TCP connection to a port in the sandbox: binary frames both ways (`stasis port-forward`)."""
        if not await accepted(websocket):
            return
        try:
            await serve_port_connection(service, websocket, ref, port)
        except StasisError as exc:
            await websocket.close(code=4400, reason=exc.message[:120])
        except OSError as exc:
            await websocket.close(code=4502, reason=f"port {port}: {exc}"[:120])

    @app.get("/v1/sandboxes/{ref}/ssh/host-key")
    async def ssh_host_key(ref: str) -> SshHostKey:
        return SshHostKey(public_key=await ssh.host_key(service, host_keys, ref))

    @app.post("/v1/sandboxes/{ref}/ssh/keys", status_code=204)
    async def ssh_authorize(ref: str, request: SshKeysRequest) -> Response:
        await ssh.authorize(service, ref, request.public_keys)
        return Response(status_code=204)

    @app.get("/v1/sandboxes/{ref}/exec/{exec_id}")
    async def exec_status(ref: str, exec_id: str) -> dict:
        return await ops.exec_status(ref, exec_id)

    @app.post("/v1/sandboxes/{ref}/processes", status_code=201)
    async def start_process(ref: str, request: StartProcessRequest) -> ProcessInfo:
        return await ops.start_process(ref, request)

    @app.get("/v1/sandboxes/{ref}/processes")
    async def list_processes(ref: str) -> list[ProcessInfo]:
        return await ops.list_processes(ref)

    @app.get("/v1/sandboxes/{ref}/processes/{process_id}")
    async def get_process(ref: str, process_id: str) -> ProcessInfo:
        return await ops.get_process(ref, process_id)

    @app.get("/v1/sandboxes/{ref}/processes/{process_id}/output")
    async def process_output(
        ref: str,
        process_id: str,
        stream: Annotated[str, Query(pattern="^(stdout|stderr)$")] = "stdout",
        offset: Annotated[int, Query(ge=0)] = 0,
        max_bytes: Annotated[int, Query(ge=1, le=4 << 20)] = 1 << 20,
        wait: Annotated[float, Query(ge=0, le=300)] = 0,
    ) -> ProcessOutput:
        return await ops.process_output(ref, process_id, stream, offset, max_bytes, wait)

    @app.post("/v1/sandboxes/{ref}/processes/{process_id}/signal")
    async def signal_process(ref: str, process_id: str, request: SignalRequest) -> ProcessInfo:
        return await ops.signal_process(ref, process_id, request.signal)

    @app.post("/v1/sandboxes/{ref}/processes/{process_id}/stdin", status_code=204)
    async def write_stdin(ref: str, process_id: str, request: StdinRequest) -> Response:
        await ops.write_stdin(ref, process_id, request.data_b64, request.close)
        return Response(status_code=204)

    # -------------------------------------------------------- files

    @app.get("/v1/sandboxes/{ref}/files")
    async def read_file(ref: str, path: Path_) -> Response:
        chunks = await ops.read_file(ref, path)
        return StreamingResponse(chunks, media_type="application/octet-stream")

    @app.put("/v1/sandboxes/{ref}/files")
    async def write_file(
        ref: str, path: Path_, request: Request, mode: Annotated[int, Query(ge=0, le=0o7777)] = 0o644
    ) -> FileEntry:
        """The request body is the file's raw bytes."""
        return await ops.write_file(ref, path, request.stream(), mode)

    @app.put("/v1/sandboxes/{ref}/dirs")
    async def upload_dir(ref: str, path: Path_, request: Request, replace: bool = False) -> FileEntry:
        """The request body is a tar stream, unpacked as directory ``path`` (whole or not at all)."""
        return await ops.upload_dir(ref, path, request.stream(), replace)

    @app.get("/v1/sandboxes/{ref}/dirs")
    async def download_dir(ref: str, path: Path_) -> Response:
        """Directory ``path`` as a tar stream."""
        return StreamingResponse(await ops.download_dir(ref, path), media_type="application/x-tar")

    @app.delete("/v1/sandboxes/{ref}/files", status_code=204)
    async def delete_file(ref: str, path: Path_, recursive: bool = False) -> Response:
        await ops.delete_file(ref, path, recursive)
        return Response(status_code=204)

    @app.get("/v1/sandboxes/{ref}/files/list")
    async def list_directory(ref: str, path: Path_) -> list[FileEntry]:
        return await ops.list_directory(ref, path)

    @app.get("/v1/sandboxes/{ref}/files/stat")
    async def stat(ref: str, path: Path_) -> FileEntry:
        return await ops.stat(ref, path)

    @app.post("/v1/sandboxes/{ref}/files/mkdir")
    async def mkdir(ref: str, path: Path_) -> FileEntry:
        return await ops.mkdir(ref, path)

    return app


def _error(exc: StasisError, status_code: int | None = None) -> JSONResponse:
    return JSONResponse(exc.to_payload(), status_code=status_code or exc.status_code)
