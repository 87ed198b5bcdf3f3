"""envd's files: the ``filesystem.Filesystem`` service and the HTTP ``/files`` (download, multipart upload).

Paths that are not absolute start at the user's home, as in envd; what is written or made belongs to the user the
request names (the image's default user when it names none).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import logging
import re
import stat
import zlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.filesystem import filesystem_pb as pb
from fastapi import FastAPI, Request, UploadFile
from fastapi.responses import JSONResponse, Response, StreamingResponse
from protobuf import Oneof
from protobuf.wkt.google.protobuf import timestamp_pb

from ....e2b_signatures import SIGNED_SCOPE
from ....errors import InvalidRequest, StasisError, clip
from ....guest import protocol as P
from ....validation import validate_user
from ...core.service import SandboxService
from ...rooms.operations import GuestOperations
from .requests import SANDBOX_HEADER, absolute, caller, rpc_error, sandbox_error, user_of

log = logging.getLogger(__name__)

FILE_TYPES = {"file": pb.FileType.FILE, "directory": pb.FileType.DIRECTORY, "symlink": pb.FileType.SYMLINK}
EVENT_TYPES = {
    "create": pb.EventType.CREATE, "write": pb.EventType.WRITE, "remove": pb.EventType.REMOVE,
    "rename": pb.EventType.RENAME, "chmod": pb.EventType.CHMOD,
}  # fmt: skip
WRITE_TEMPORARY = re.compile(r"^\.(?P<target>.+)\.stasis-[A-Za-z0-9_-]+$")  # the agent's, beside a file it writes
WATCH_WAIT = 10.0  # seconds a watch read waits before a keepalive goes out
MAX_DEPTH = 32
MAX_WATCHERS_EACH = 64  # polling watchers remembered for include_entry, per sandbox
MAX_WATCHED_SANDBOXES = 1024
METADATA_HEADER = "x-metadata-"  # envd 0.6.2: an upload's X-Metadata-KEY headers, the file's user.e2b.KEY attributes
METADATA_KEY = re.compile(r"\A[A-Za-z0-9!#$%&'*+\-.^_`|~]{1,200}\Z")  # an HTTP token, as the SDKs check it
MAX_METADATA = 64
METADATA_VALUE = re.compile(r"\A[\x20-\x7e]{0,4096}\Z")


class FilesystemService:
    def __init__(self, core: SandboxService, ops: GuestOperations) -> None:
        self.core = core
        self.ops = ops
        # a polling watcher's directory, for the entries its events carry (include_entry): sandbox -> watch -> it
        self._watchers: collections.OrderedDict[str, collections.OrderedDict[str, str]] = collections.OrderedDict()

    def _user(self, sandbox_id: str, user: str | None) -> str | None:
        """The user a request acts as: the one it names, else the image's default (None: root)."""
        return user or self.ops.command_defaults(sandbox_id, {}, None, None)["user"]

    def _target(self, ctx: RequestContext[Any, Any], path: str) -> tuple[str, str, str | None]:
        sandbox_id, user = caller(ctx)
        user = self._user(sandbox_id, user)
        try:
            return sandbox_id, absolute(path, user), user
        except InvalidRequest as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, clip(str(exc))) from None

    async def _call(self, sandbox_id: str, op: Any) -> Any:
        try:
            async with self.core.guest(sandbox_id) as channel:
                return await channel.call(op)
        except StasisError as exc:
            raise sandbox_error(self.core, sandbox_id, exc) from exc

    async def stat(self, request: pb.StatRequest, ctx: RequestContext[Any, Any]) -> pb.StatResponse:
        sandbox_id, path, _ = self._target(ctx, request.path)
        return pb.StatResponse(entry=entry(await self._call(sandbox_id, P.StatFile(path=path, labels=True))))

    async def make_dir(self, request: pb.MakeDirRequest, ctx: RequestContext[Any, Any]) -> pb.MakeDirResponse:
        sandbox_id, path, user = self._target(ctx, request.path)
        try:
            await self._call(sandbox_id, P.StatFile(path=path))
        except ConnectError as exc:
            if exc.code != Code.NOT_FOUND:
                raise
        else:
            raise ConnectError(Code.ALREADY_EXISTS, clip(f"{path} already exists"))
        await self._call(sandbox_id, P.MakeDir(path=path, owner=user))
        return pb.MakeDirResponse(entry=entry(await self._call(sandbox_id, P.StatFile(path=path))))

    async def move(self, request: pb.MoveRequest, ctx: RequestContext[Any, Any]) -> pb.MoveResponse:
        sandbox_id, source, user = self._target(ctx, request.source)
        _, destination, _ = self._target(ctx, request.destination)
        await self._call(sandbox_id, P.StatFile(path=source))  # NOT_FOUND names the source
        result = await self._call(sandbox_id, P.Exec(cmd=["mv", "-T", "--", source, destination], user=user))
        if result.exit_code != 0:
            message = base64.b64decode(result.stderr).decode(errors="replace").strip()
            raise ConnectError(Code.INVALID_ARGUMENT, clip(f"moving {source} to {destination} failed: {message}"))
        return pb.MoveResponse(entry=entry(await self._call(sandbox_id, P.StatFile(path=destination, labels=True))))

    async def list_dir(self, request: pb.ListDirRequest, ctx: RequestContext[Any, Any]) -> pb.ListDirResponse:
        sandbox_id, path, _ = self._target(ctx, request.path)
        depth = request.depth or 1
        if depth > MAX_DEPTH:
            raise ConnectError(Code.INVALID_ARGUMENT, f"depth {depth} is more than {MAX_DEPTH}")
        found: list[pb.EntryInfo] = []

        async def walk(directory: str, level: int) -> None:
            """envd's order (a walk of the tree): each entry, then what is below it, before its next sibling."""
            listing = await self._call(sandbox_id, P.ListDir(path=directory, labels=True))
            for item in sorted(listing.entries, key=lambda e: e.name):
                found.append(entry(item))
                if item.type == "directory" and level < depth:
                    await walk(item.path, level + 1)

        await walk(path, 1)
        return pb.ListDirResponse(entries=found)

    async def remove(self, request: pb.RemoveRequest, ctx: RequestContext[Any, Any]) -> pb.RemoveResponse:
        sandbox_id, path, _ = self._target(ctx, request.path)
        try:
            await self._call(sandbox_id, P.DeleteFile(path=path, recursive=True))
        except ConnectError as exc:
            if exc.code != Code.NOT_FOUND:  # envd's: removing what is not there is no error
                raise
        return pb.RemoveResponse()

    async def create_watcher(
        self, request: pb.CreateWatcherRequest, ctx: RequestContext[Any, Any]
    ) -> pb.CreateWatcherResponse:
        sandbox_id, path, _ = self._target(ctx, request.path)
        watch = await self._call(sandbox_id, P.StartWatch(path=path, recursive=bool(request.recursive)))
        if request.include_entry:
            self._remember(sandbox_id, watch.id, path)
        return pb.CreateWatcherResponse(watcher_id=watch.id)

    def _remember(self, sandbox_id: str, watch_id: str, root: str) -> None:
        """A polling watcher's directory, bounded: its id is the agent's (the sandbox's to say), and watchers
        that are never removed, of sandboxes long gone, make way for newer ones."""
        if len(watch_id) > 64 or len(root) > 4096:  # no agent of stasis' says such an id; no path is that long
            log.warning("%s: a watcher %r of %d characters is not remembered", sandbox_id, watch_id[:64], len(root))
            return
        mine = self._watchers.setdefault(sandbox_id, collections.OrderedDict())
        self._watchers.move_to_end(sandbox_id)
        mine[watch_id] = root
        while len(mine) > MAX_WATCHERS_EACH:
            mine.popitem(last=False)
        while len(self._watchers) > MAX_WATCHED_SANDBOXES:
            self._watchers.popitem(last=False)

    async def get_watcher_events(
        self, request: pb.GetWatcherEventsRequest, ctx: RequestContext[Any, Any]
    ) -> pb.GetWatcherEventsResponse:
        sandbox_id, _ = caller(ctx)
        batch = await self._call(sandbox_id, P.ReadWatch(id=request.watcher_id, wait=0))
        events = fs_events(batch.events)
        if (root := self._watchers.get(sandbox_id, {}).get(request.watcher_id)) is not None:
            async with self.core.guest(sandbox_id) as channel:
                events = await with_entries(channel, root, events)
        return pb.GetWatcherEventsResponse(events=events)

    async def remove_watcher(
        self, request: pb.RemoveWatcherRequest, ctx: RequestContext[Any, Any]
    ) -> pb.RemoveWatcherResponse:
        sandbox_id, _ = caller(ctx)
        self._watchers.get(sandbox_id, {}).pop(request.watcher_id, None)
        await self._call(sandbox_id, P.StopWatch(id=request.watcher_id))
        return pb.RemoveWatcherResponse()

    async def watch_dir(
        self, request: pb.WatchDirRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.WatchDirResponse]:
        """A stream of the directory's events (a keepalive when quiet), for as long as the client reads it."""
        sandbox_id, path, _ = self._target(ctx, request.path)
        async with self.core.guest(sandbox_id) as channel:
            try:
                watch = await channel.call(P.StartWatch(path=path, recursive=bool(request.recursive)))
            except StasisError as exc:
                raise rpc_error(exc) from exc
            try:
                yield pb.WatchDirResponse(event=Oneof("start", pb.WatchDirResponse.StartEvent()))
                while True:
                    batch = await channel.call(P.ReadWatch(id=watch.id, wait=WATCH_WAIT), timeout=WATCH_WAIT + 60)
                    events = fs_events(batch.events)
                    if request.include_entry:
                        events = await with_entries(channel, path, events)
                    for item in events:
                        yield pb.WatchDirResponse(event=Oneof("filesystem", item))
                    if batch.closed:
                        return
                    if not batch.events:
                        yield pb.WatchDirResponse(event=Oneof("keepalive", pb.WatchDirResponse.KeepAlive()))
            finally:
                with contextlib.suppress(Exception):  # the watch goes with the stream, even a cut one
                    await asyncio.shield(channel.call(P.StopWatch(id=watch.id)))


async def with_entries(channel: Any, root: str, events: list[pb.FilesystemEvent]) -> list[pb.FilesystemEvent]:
    """envd 0.6.3's include_entry: each event with its entry's info, where the entry is there to stat (not for a
    removal or a rename away)."""
    out = []
    for event in events:
        info = None
        if event.type not in (pb.EventType.REMOVE, pb.EventType.RENAME):
            with contextlib.suppress(StasisError):
                info = entry(await channel.call(P.StatFile(path=f"{root.rstrip('/')}/{event.name}", labels=True)))
        out.append(pb.FilesystemEvent(name=event.name, type=event.type, entry=info))
    return out


def fs_event(item: P.WatchEvent) -> pb.FilesystemEvent:
    return pb.FilesystemEvent(name=item.name, type=EVENT_TYPES.get(item.type, pb.EventType.UNSPECIFIED))


def fs_events(items: list[P.WatchEvent]) -> list[pb.FilesystemEvent]:
    """A batch of the agent's events as envd reports them: a file written is written in place on E2B, where
    stasis writes a temporary beside it and renames it over: its temporary's events are dropped, and the
    rename that lands it is the file's WRITE."""
    events, landed = [], set()
    for item in items:
        folder, _, base = item.name.rpartition("/")
        if temporary := WRITE_TEMPORARY.match(base):
            if item.type == "rename":  # moved away from its temporary name: onto its own
                landed.add(f"{folder}/{temporary['target']}" if folder else temporary["target"])
            continue
        if item.type == "create" and item.name in landed:
            landed.discard(item.name)
            events.append(pb.FilesystemEvent(name=item.name, type=pb.EventType.WRITE))
            continue
        events.append(fs_event(item))
    return events


def entry(item: P.FileStat) -> pb.EntryInfo:
    seconds = int(item.mtime)
    modified = timestamp_pb.Timestamp(seconds=seconds, nanos=int((item.mtime - seconds) * 1e9))
    kind = "l" if item.type == "symlink" else "d" if item.type == "directory" else "-"
    return pb.EntryInfo(
        name=item.name, type=FILE_TYPES.get(item.type, pb.FileType.UNSPECIFIED), path=item.path, size=item.size,
        mode=item.mode, permissions=kind + stat.filemode(item.mode)[1:], owner=item.owner, group=item.group,
        modified_time=modified, symlink_target=item.target, is_symlink=item.type == "symlink",
        metadata=item.labels or {},
    )  # fmt: skip


def create_files_app(ops: GuestOperations, files: FilesystemService) -> FastAPI:
    """envd's HTTP side: GET/POST /files and GET /health. Errors are envd's ``{"code", "message"}``."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    def target(request: Request, path: str | None) -> tuple[str, str, str | None]:
        sandbox_id = request.headers[SANDBOX_HEADER]
        named = request.query_params.get("username") or None
        try:
            named = validate_user(named) if named is not None else None
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        user = files._user(sandbox_id, user_of(request.headers) or named)
        if path is None:
            raise InvalidRequest("name the file: ?path=")
        return sandbox_id, absolute(path, user), user

    @app.exception_handler(StasisError)
    async def stasis_error(request: Request, exc: StasisError) -> JSONResponse:
        return JSONResponse({"code": exc.status_code, "message": clip(str(exc))}, status_code=exc.status_code)

    @app.get("/health", status_code=204)
    async def health() -> Response:
        return Response(status_code=204)

    @app.get("/files")
    async def download(request: Request, path: str | None = None) -> StreamingResponse:
        sandbox_id, path, _ = target(request, path)
        chunks = await ops.read_file(sandbox_id, path)
        return StreamingResponse(chunks, media_type="application/octet-stream")

    @app.post("/files")
    async def upload(request: Request, path: str | None = None) -> list[dict[str, Any]]:
        sandbox_id = request.headers[SANDBOX_HEADER]
        labels = metadata_of(request.headers)
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()

        async def written(destination: str, body: AsyncIterator[bytes], user: str | None) -> dict[str, Any]:
            await ops.write_file(sandbox_id, destination, body, owner=user, labels=labels)
            answer = {"name": destination.rsplit("/", 1)[-1], "type": "file", "path": destination}
            if labels:  # what the file now carries (an agent older than metadata would have dropped it: said)
                kept = (await files._call(sandbox_id, P.StatFile(path=destination, labels=True))).labels or {}
                if kept != labels:
                    raise StasisError(f"{clip(destination)} was written without its metadata: restart the sandbox")
                answer["metadata"] = kept
            return answer

        if kind == "application/octet-stream":  # envd 0.5.7's: one file, the body as it is (gzip if said)
            _, destination, user = target(request, path)
            encoding = request.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("identity", "gzip"):
                raise InvalidRequest(f"Content-Encoding {encoding[:40]!r}: send the body as it is, or gzip")
            body = request.stream() if encoding == "identity" else _gunzipped(request.stream())
            return [await written(destination, body, user)]
        if kind != "multipart/form-data":
            raise InvalidRequest("upload a file as application/octet-stream (one) or multipart/form-data (several)")
        signed = bool(request.scope.get(SIGNED_SCOPE))  # a signed URL's: its one file, never a part's own name
        answers = []
        async with request.form(max_files=1 if signed else 1000, max_part_size=1 << 30) as form:
            parts = form.getlist("file")
            if not parts:
                raise InvalidRequest("the upload has no 'file' part")
            if signed and (len(parts) != 1 or path is None):
                raise InvalidRequest("a signed upload URL writes its one file: send one 'file' part")
            for part in parts:
                if isinstance(part, str):
                    raise InvalidRequest("each 'file' part must be a file")
                name = path if path is not None and len(parts) == 1 else part.filename
                _, destination, user = target(request, name)
                answers.append(await written(destination, _pieces(part), user))
        return answers

    return app


def metadata_of(headers: Mapping[str, str]) -> dict[str, str]:
    """An upload's file metadata (envd 0.6.2): its ``X-Metadata-KEY: VALUE`` headers, keys lowercased."""
    found = {}
    for name, value in headers.items():
        if not name.lower().startswith(METADATA_HEADER):
            continue
        key = name[len(METADATA_HEADER) :].lower()
        if not METADATA_KEY.match(key) or not METADATA_VALUE.match(value):
            raise InvalidRequest(
                f"metadata {key[:60]!r}: a key is an HTTP token (letters, digits, !#$%&'*+-.^_`|~, at most 200), "
                "a value printable US-ASCII (at most 4096)"
            )
        found[key] = value
    if len(found) > MAX_METADATA:
        raise InvalidRequest(f"{len(found)} metadata keys: at most {MAX_METADATA}")
    return found


async def _gunzipped(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A gzip body, decompressed as it comes; a body that is not gzip (or is cut short) is a 400."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        async for chunk in chunks:
            pending = chunk
            while pending:  # at most a MiB out at a time, however well the chunk compresses
                yield inflater.decompress(pending, 1 << 20)
                pending = inflater.unconsumed_tail
        yield inflater.flush()
    except zlib.error as exc:
        raise InvalidRequest(f"the body is not gzip: {exc}") from None
    if not inflater.eof:
        raise InvalidRequest("the gzip body ended before its end")


async def _pieces(part: UploadFile) -> AsyncIterator[bytes]:
    while piece := await part.read(1 << 20):
        yield piece
