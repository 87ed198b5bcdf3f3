"""The console's pages: login, the sandbox list, one sandbox with its files, the checkpoint tree."""

from __future__ import annotations

import posixpath
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from ....console_sessions import COOKIE, LIFETIME_SECS
from ....errors import StasisError
from ....origin import same_origin
from .live import describe
from .render import FeedDep, RoomsDep, page, pages, reach, session_of, to_login, visible
from .tree import lineage

router = APIRouter()
VIEW_BYTES = 1 << 20  # of a file shown in the page; the download streams all of it
NOT_A_TOKEN = "That is neither this daemon's token nor a working key of a team."
EGRESS_SHOWN = 50  # the newest lines of the egress audit on a sandbox's page (`stasis egress` has them all)


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request) -> HTMLResponse:
    failed = request.query_params.get("failed") is not None  # a fleet's door took the form, and refused it
    error = NOT_A_TOKEN if failed else None
    return pages.TemplateResponse(request, "login.html", {"error": error})


@router.post("/login", response_model=None)
async def login(request: Request, rooms: RoomsDep) -> Response:
    if not same_origin(request):  # a form posted from another origin (a sandbox's port) never logs anyone in
        return pages.TemplateResponse(request, "login.html", {"error": "Log in from this page."}, status_code=403)
    form = await request.form()
    token = str(form.get("token") or "")
    key = rooms.teams.authenticate(token) if token else None
    session = rooms.logins.login(token, key.key_id if key is not None else None)
    if session is None:
        context = {"error": NOT_A_TOKEN}
        return pages.TemplateResponse(request, "login.html", context, status_code=401)
    response = RedirectResponse("/ui/", status_code=303)
    response.set_cookie(COOKIE, session.id, max_age=LIFETIME_SECS, httponly=True, samesite="strict", path="/ui")
    return response


@router.post("/logout")
async def logout(request: Request, rooms: RoomsDep) -> RedirectResponse:
    if not same_origin(request):
        return to_login()
    rooms.logins.logout(request.cookies.get(COOKIE))
    response = to_login()
    response.delete_cookie(COOKIE, path="/ui")
    return response


@router.get("/", response_class=HTMLResponse, response_model=None)
async def sandboxes(request: Request, feed: FeedDep) -> Response:
    if (session := session_of(request)) is None:
        return to_login()
    return page(request, "sandboxes.html", session, sandboxes=visible(session, feed.snapshot(), lambda s: s["team"]))


@router.get("/sandboxes/{ref}", response_class=HTMLResponse, response_model=None)
async def sandbox(request: Request, ref: str, rooms: RoomsDep, path: str = "/root") -> Response:
    if (session := session_of(request)) is None:
        return to_login()
    reach(rooms, session, "sandbox", ref)
    info = rooms.core.get(ref)
    entries, error = [], None
    try:
        reach(rooms, session, "sandbox", ref, "exec")  # its files: as `dirs` on the API
        entries = await rooms.ops.list_directory(info.id, path)
    except StasisError as exc:
        error = exc.message
    parent = posixpath.dirname(path.rstrip("/")) or "/"
    audit = rooms.core.egress_audit
    egress = list(audit.lines(info.id))[-EGRESS_SHOWN:] if audit is not None else []
    return page(request, "sandbox.html", session, sandbox=describe(info, None), info=info, path=path,
                parent=parent, entries=sorted(entries, key=lambda e: (e.type != "directory", e.name)),
                files_error=error, join=posixpath.join, egress=egress[::-1])  # fmt: skip


@router.get("/sandboxes/{ref}/file", response_model=None)
async def file(request: Request, ref: str, path: str, rooms: RoomsDep, view: bool = False) -> Response:
    if (session := session_of(request)) is None:
        return to_login()
    reach(rooms, session, "sandbox", ref, "exec")  # a file's bytes are what the sandbox holds: as `files` on the API
    chunks = await rooms.ops.read_file(ref, path)
    if view:
        data = await _head(chunks, VIEW_BYTES + 1)
        text = data[:VIEW_BYTES].decode(errors="replace")
        return page(request, "file.html", session, ref=ref, path=path, text=text, truncated=len(data) > VIEW_BYTES)
    name = posixpath.basename(path) or "file"
    quoted = name.replace("\\", "_").replace('"', "_")
    return StreamingResponse(chunks, media_type="application/octet-stream",
                             headers={"content-disposition": f'attachment; filename="{quoted}"'})  # fmt: skip


async def _head(chunks: AsyncIterator[bytes], size: int) -> bytes:
    """The first ``size`` bytes of a file's chunks; the rest is never read."""
    data = bytearray()
    async for chunk in chunks:
        data += chunk
        if len(data) >= size:
            break
    return bytes(data[:size])


@router.get("/checkpoints", response_class=HTMLResponse, response_model=None)
async def checkpoints(request: Request, rooms: RoomsDep) -> Response:
    if (session := session_of(request)) is None:
        return to_login()
    sandboxes = visible(session, rooms.core.list(include_terminated=True), lambda i: i.spec.team)
    roots = lineage(sandboxes, visible(session, rooms.checkpoints.list(), lambda c: c.spec.team))
    return page(request, "tree.html", session, roots=roots)
