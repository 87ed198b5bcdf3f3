"""The console's routes: pages, actions, the live feed and the terminal, all behind a login session."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import posixpath
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, UploadFile, WebSocket, WebSocketDisconnect
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from ..agent.journal import Journal
from ..daemon.forks import fork
from ..daemon.terminal import serve_terminal
from ..errors import RunNotFound, StasisError
from ..models import CheckpointType, CreateCheckpointRequest, CreateSandboxRequest
from ..paths import Paths
from .live import Feed, describe
from .sessions import COOKIE, LIFETIME_SECS, Session, Sessions, same_origin
from .tree import lineage

if TYPE_CHECKING:
    from ..daemon.operations import GuestOperations
    from ..daemon.service import SandboxService

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
ACTIONS = ("suspend", "resume", "checkpoint", "fork", "remove")
VIEW_BYTES = 1 << 20  # of a file shown in the page; the download has all of it


def create_console(service: SandboxService, ops: GuestOperations, paths: Paths, sessions: Sessions) -> FastAPI:
    """The console as an app to mount at /ui (it makes its own links relative to that)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    templates = Jinja2Templates(directory=HERE / "templates")  # autoescaped: names and paths come from sandboxes
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    feed = Feed(service)

    @app.exception_handler(StasisError)
    async def stasis_error(request: Request, exc: StasisError) -> HTMLResponse:
        """A page about a sandbox that is gone, a file that is not there: said in the page, not a 500."""
        context = {"csrf": "", "message": exc.message}
        return templates.TemplateResponse(request, "error.html", context, status_code=exc.status_code)

    def session_of(request: Request | WebSocket) -> Session | None:
        return sessions.get(request.cookies.get(COOKIE))

    def page(request: Request, name: str, session: Session, **context: Any) -> HTMLResponse:
        return templates.TemplateResponse(request, name, {"csrf": session.csrf, **context})

    def to_login() -> RedirectResponse:
        return RedirectResponse("/ui/login", status_code=303)

    def refused() -> JSONResponse:
        return JSONResponse({"error": "log in first (the session is missing, expired or without its CSRF token)"},
                            status_code=401)  # fmt: skip

    def acting(request: Request) -> Session | None:
        """The session of an action: the cookie and the page's CSRF header must both be right."""
        session = session_of(request)
        if session is None or request.headers.get("x-stasis-csrf") != session.csrf:
            return None
        return session

    # ------------------------------------------------------------ login

    @app.get("/login", response_class=HTMLResponse)
    async def login_page(request: Request) -> HTMLResponse:
        return templates.TemplateResponse(request, "login.html", {"error": None})

    @app.post("/login", response_model=None)
    async def login(request: Request) -> Response:
        form = await request.form()
        session = sessions.login(str(form.get("token") or ""))
        if session is None:
            context = {"error": "That is not this daemon's token."}
            return templates.TemplateResponse(request, "login.html", context, status_code=401)
        response = RedirectResponse("/ui/", status_code=303)
        response.set_cookie(COOKIE, session.id, max_age=LIFETIME_SECS, httponly=True, samesite="strict", path="/ui")
        return response

    @app.post("/logout")
    async def logout(request: Request) -> RedirectResponse:
        sessions.logout(request.cookies.get(COOKIE))
        response = to_login()
        response.delete_cookie(COOKIE, path="/ui")
        return response

    # ------------------------------------------------------------ pages

    @app.get("/", response_class=HTMLResponse, response_model=None)
    async def sandboxes(request: Request) -> Response:
        if (session := session_of(request)) is None:
            return to_login()
        return page(request, "sandboxes.html", session, sandboxes=feed.snapshot())

    @app.get("/sandboxes/{ref}", response_class=HTMLResponse, response_model=None)
    async def sandbox(request: Request, ref: str, path: str = "/root") -> Response:
        if (session := session_of(request)) is None:
            return to_login()
        info = service.get(ref)
        entries, error = [], None
        try:
            entries = await ops.list_directory(info.id, path)
        except StasisError as exc:
            error = exc.message
        parent = posixpath.dirname(path.rstrip("/")) or "/"
        return page(request, "sandbox.html", session, sandbox=describe(info, None), info=info, path=path,
                    parent=parent, entries=sorted(entries, key=lambda e: (e.type != "directory", e.name)),
                    files_error=error, join=posixpath.join)  # fmt: skip

    @app.get("/sandboxes/{ref}/file", response_model=None)
    async def file(request: Request, ref: str, path: str, view: bool = False) -> Response:
        if (session := session_of(request)) is None:
            return to_login()
        data = b"".join([chunk async for chunk in await ops.read_file(ref, path)])
        if view:
            text = data[: 1 << 20].decode(errors="replace")
            return page(request, "file.html", session, ref=ref, path=path, text=text, truncated=len(data) > 1 << 20)
        name = posixpath.basename(path) or "file"
        quoted = name.replace("\\", "_").replace('"', "_")
        return Response(data, media_type="application/octet-stream",
                        headers={"content-disposition": f'attachment; filename="{quoted}"'})  # fmt: skip

    @app.get("/checkpoints", response_class=HTMLResponse, response_model=None)
    async def checkpoints(request: Request) -> Response:
        if (session := session_of(request)) is None:
            return to_login()
        roots = lineage(service.store.list(include_terminated=True, include_pooled=False),
                        service.store.list_checkpoints())  # fmt: skip
        return page(request, "tree.html", session, roots=roots)

    @app.get("/runs", response_class=HTMLResponse, response_model=None)
    async def runs(request: Request) -> Response:
        if (session := session_of(request)) is None:
            return to_login()
        with _journal(paths) as journal:
            found = sorted(journal.runs(), key=lambda r: -r.created_at)
        return page(request, "runs.html", session, runs=found)

    @app.get("/runs/{run_id}", response_class=HTMLResponse, response_model=None)
    async def run(request: Request, run_id: str) -> Response:
        if (session := session_of(request)) is None:
            return to_login()
        with _journal(paths) as journal:
            try:
                record = journal.run(run_id)
            except RunNotFound:
                return page(request, "runs.html", session, runs=[], error=f"no agent run {run_id!r}")
            steps, notes = steps_of(journal.events(run_id)), journal.run_notes(run_id)
        return page(request, "run.html", session, run=record, steps=steps, notes=notes)

    # ------------------------------------------------------------ actions

    @app.post("/sandboxes/{ref}/upload", response_model=None)
    async def upload(request: Request, ref: str, file: UploadFile, dir: str = "/root") -> Response:
        if acting(request) is None:
            return refused()
        target = posixpath.join(dir, posixpath.basename(file.filename or "upload"))
        try:
            await ops.write_file(ref, target, await file.read())
        except StasisError as exc:
            return JSONResponse({"error": exc.message}, status_code=exc.status_code)
        return JSONResponse({"path": target})

    @app.post("/sandboxes/{ref}/{action}", response_model=None)
    async def act(request: Request, ref: str, action: str) -> Response:
        if acting(request) is None:
            return refused()
        if action not in ACTIONS:
            return JSONResponse({"error": f"unknown action {action!r}"}, status_code=404)
        try:
            if action == "suspend":
                await service.suspend(ref)
            elif action == "resume":
                await service.resume(ref)
            elif action == "checkpoint":
                kind = CheckpointType((await request.json()).get("type", "memory"))
                checkpoint = await service.checkpoint(ref, CreateCheckpointRequest(type=kind))
                return JSONResponse({"checkpoint": checkpoint.id})
            elif action == "fork":
                children = await fork(service, ref, 1)
                return JSONResponse({"sandboxes": [c.id for c in children]})
            else:
                await service.terminate(ref)
        except StasisError as exc:
            return JSONResponse({"error": exc.message}, status_code=exc.status_code)
        feed.changed()
        return JSONResponse({"ok": True})

    @app.post("/checkpoints/{checkpoint_id}/restore", response_model=None)
    async def restore(request: Request, checkpoint_id: str) -> Response:
        if acting(request) is None:
            return refused()
        try:
            info = await service.create(CreateSandboxRequest(snapshot_id=checkpoint_id))
        except StasisError as exc:
            return JSONResponse({"error": exc.message}, status_code=exc.status_code)
        feed.changed()
        return JSONResponse({"sandbox": info.id})

    # ------------------------------------------------------------ live

    @app.get("/events", response_model=None)
    async def events(request: Request) -> Response:
        if session_of(request) is None:
            return refused()

        async def stream() -> AsyncIterator[bytes]:
            async for snapshot in feed.follow():
                if await request.is_disconnected():
                    return
                yield b"data: " + json.dumps(snapshot).encode() + b"\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"cache-control": "no-store"})

    @app.websocket("/sandboxes/{ref}/pty")
    async def pty(websocket: WebSocket, ref: str, cols: int = 80, rows: int = 24, csrf: str = "") -> None:
        # A WebSocket is not bound by the same-origin policy and the session cookie goes to every port of
        # the host (a sandbox's exposed port too): the page must prove it is the console's own (its CSRF
        # token, which no other origin can read) and the browser must say it opened it from here.
        session = session_of(websocket)
        if session is None or not hmac.compare_digest(csrf, session.csrf) or not same_origin(websocket):
            await websocket.close(code=4401, reason="log in first (the console's own page opens the terminal)")
            return
        await websocket.accept()
        try:
            await serve_terminal(service, websocket, ref, cols, rows, ["/bin/sh", "-l"])
        except StasisError as exc:
            await websocket.close(code=4400, reason=exc.message[:120])
        except (WebSocketDisconnect, asyncio.CancelledError):
            pass

    return app


@contextlib.contextmanager
def _journal(paths: Paths) -> Iterator[Journal]:
    """The harness's journal (written by `stasis agent`), open only while a page reads it."""
    journal = Journal(paths.agent_journal)
    try:
        yield journal
    finally:
        journal.close()


def steps_of(events: list[Any]) -> list[dict[str, Any]]:
    """The journal as steps: each model message with the tool calls it made and their results."""
    steps: list[dict[str, Any]] = []
    results = {e.key: e.payload.get("content") for e in events if e.kind == "tool_result"}
    for event in events:
        if event.kind == "model_response":
            message = event.payload.get("message") or {}
            calls = []
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                calls.append({"name": function.get("name"), "arguments": function.get("arguments"),
                              "result": results.get(call.get("id"))})  # fmt: skip
            steps.append({"kind": "model", "step": event.key, "content": message.get("content"), "calls": calls,
                          "seconds": event.seconds})  # fmt: skip
        elif event.kind == "resume":
            steps.append({"kind": "resume", "at": event.at})
    return steps
