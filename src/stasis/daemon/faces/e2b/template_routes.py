"""E2B's Template build API, as its SDKs (v2 ``Template``) call it: request a build, upload COPY's files to a URL
that authorizes itself, start the build, follow its status and log; names, tags and aliases.

The upload URL is signed (an HMAC under the API key of the template, the files hash and an expiry): the SDK PUTs
to it without its key. It writes one file once (a hash that is present is never replaced), at most
MAX_UPLOAD_BYTES, to a temporary name renamed into place when complete.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import hmac
import os
import secrets
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from ....errors import InvalidRequest, NotFound, echo
from ....fsutil import fsync_dir
from .plane import PlaneDep, iso
from .template_builder import BuildStart, plan
from .templates import Build, Template

router = APIRouter()
MAX_UPLOAD_BYTES = 4 << 30
UPLOAD_LIFETIME = 3600  # seconds a signed upload URL is good for
PAGE = 100  # log entries per status answer, as E2B's


class _Body(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class NewBuild(_Body):
    name: str | None = Field(None, max_length=200)
    alias: str | None = Field(None, max_length=200)
    tags: list[str] = Field(default_factory=list, max_length=64)
    cpu_count: int | None = Field(None, alias="cpuCount", ge=1, le=64)
    memory_mb: int | None = Field(None, alias="memoryMB", ge=128, le=262144)


class AssignTags(_Body):
    target: str = Field(max_length=200)
    tags: list[str] = Field(max_length=64)


class RemoveTags(_Body):
    name: str = Field(max_length=200)
    tags: list[str] = Field(max_length=64)


def upload_signature(api_key: str, template_id: str, files_hash: str, expires: int) -> str:
    signed = f"upload:{template_id}:{files_hash}:{expires}".encode()
    return hmac.new(api_key.encode(), signed, hashlib.sha256).hexdigest()


def signed_upload(api_key: str, path: str, query: dict[str, str]) -> bool:
    """Whether a PUT to ``path`` carries a valid, unexpired upload signature (the API key is then not needed)."""
    parts = path.strip("/").split("/")
    if len(parts) != 4 or parts[0] != "templates" or parts[2] != "files":
        return False
    expires, signature = query.get("expires", ""), query.get("signature", "")
    if not (expires.isdigit() and len(expires) <= 12 and int(expires) > time.time()) or len(signature) != 64:
        return False
    return hmac.compare_digest(signature, upload_signature(api_key, parts[1], parts[3], int(expires)))


@router.post("/v3/templates", status_code=202)
async def request_build(body: NewBuild, plane: PlaneDep) -> dict[str, Any]:
    ref = body.name or body.alias
    if not ref:
        raise InvalidRequest("a template build needs a name (name or name:tag)")
    cpus = body.cpu_count or max(1, round(plane.defaults.cpus))
    template, build = plane.room.templates.request(ref, body.tags, cpus, body.memory_mb or plane.defaults.memory_mb)
    return {"templateID": template.template_id, "buildID": build.build_id, "public": False,
            "names": [template.name], "tags": build.tags, "aliases": [template.name]}  # fmt: skip


@router.get("/templates/{template_id}/files/{files_hash}", status_code=201)
async def upload_link(template_id: str, files_hash: str, plane: PlaneDep, request: Request) -> dict[str, Any]:
    templates = plane.room.templates
    templates.get(template_id)
    if templates.file(files_hash).exists():
        return {"present": True}
    expires = int(time.time()) + UPLOAD_LIFETIME
    signature = upload_signature(plane.room.keys.api_key, template_id, files_hash, expires)
    url = f"{str(request.base_url).rstrip('/')}/templates/{template_id}/files/{files_hash}"
    return {"present": False, "url": f"{url}?expires={expires}&signature={signature}"}


@router.put("/templates/{template_id}/files/{files_hash}")
async def upload(template_id: str, files_hash: str, plane: PlaneDep, request: Request) -> Response:
    """Reached with the signature alone (see ``signed_upload``) or the API key."""
    templates = plane.room.templates
    templates.get(template_id)
    final = templates.file(files_hash)
    if final.exists():
        return Response(status_code=200)  # uploaded before: one hash is one content, never replaced
    temporary = final.with_name(f".{files_hash}-{secrets.token_hex(4)}-{os.getpid()}")
    written = 0
    try:
        with open(temporary, "xb") as f:
            async for chunk in request.stream():
                written += len(chunk)
                if written > MAX_UPLOAD_BYTES:
                    raise InvalidRequest(f"the upload is over {MAX_UPLOAD_BYTES >> 30} GiB; copy less in one step")
                await asyncio.to_thread(f.write, chunk)
            await asyncio.to_thread(os.fsync, f.fileno())
        try:
            os.link(temporary, final)  # never over an upload that finished first: one hash is one content
        except FileExistsError:
            return Response(status_code=200)
        fsync_dir(final.parent)
    finally:
        temporary.unlink(missing_ok=True)
    return Response(status_code=201)


@router.post("/v2/templates/{template_id}/builds/{build_id}", status_code=202)
async def start_build(template_id: str, build_id: str, body: BuildStart, plane: PlaneDep) -> Response:
    templates = plane.room.templates
    template, build = templates.build(template_id, build_id)
    if build.status != "waiting":
        raise InvalidRequest(f"build {build_id} was started already (it is {build.status}); request a new build")
    steps = plan(body, templates)  # a step stasis cannot run is refused now, before anything runs
    defaults = plane.defaults
    plane.room.builder.start(template, build, steps, defaults.backend, defaults.build_network)
    return Response(status_code=202)


@router.get("/templates/{template_id}/builds/{build_id}/status")
async def build_status(
    template_id: str, build_id: str, plane: PlaneDep,
    logs_offset: Annotated[int, Query(alias="logsOffset", ge=0)] = 0,
    limit: Annotated[int, Query(ge=0, le=PAGE)] = PAGE,
) -> dict[str, Any]:  # fmt: skip
    templates = plane.room.templates
    _, build = templates.build(template_id, build_id)
    entries = [_entry(e) for e in templates.entries(build_id)[logs_offset : logs_offset + limit]]
    answer: dict[str, Any] = {"templateID": template_id, "buildID": build_id, "status": build.status,
                              "logs": [], "logEntries": entries}  # fmt: skip
    if build.status == "error":
        answer["reason"] = {"message": build.reason or "the build failed", "step": build.step or "finalize"}
    return answer


def _entry(entry: dict[str, Any]) -> dict[str, Any]:
    when = datetime.datetime.fromtimestamp(entry["timestamp"], datetime.UTC).isoformat()
    return {**entry, "timestamp": when}


@router.get("/templates/aliases/{alias}")
async def alias(alias: str, plane: PlaneDep) -> dict[str, Any]:
    template = plane.room.templates.find(alias)
    return {"templateID": template.template_id, "public": False}


@router.get("/templates")
async def templates(plane: PlaneDep) -> list[dict[str, Any]]:
    return [_template(t) for t in plane.room.templates.all()]


@router.get("/templates/{template_id}")
async def template(template_id: str, plane: PlaneDep) -> dict[str, Any]:
    found = plane.room.templates.find(template_id)
    return {**_template(found), "builds": [_build(found, b) for b in found.builds.values()]}


def _template(template: Template) -> dict[str, Any]:
    ready = [b for b in template.builds.values() if b.status == "ready"]
    latest = max(template.builds.values(), key=lambda b: b.created_at, default=None)
    return {
        "templateID": template.template_id, "names": [template.name], "aliases": [template.name], "public": False,
        "buildID": latest.build_id if latest else None, "buildCount": len(template.builds),
        "buildStatus": latest.status if latest else "waiting", "cpuCount": latest.cpu_count if latest else 1,
        "memoryMB": latest.memory_mb if latest else 0, "diskSizeMB": 0, "envdVersion": "0.6.4",
        "createdAt": iso(template.created_at), "updatedAt": iso(max((b.created_at for b in ready), default=0) or
        template.created_at), "lastSpawnedAt": None, "spawnCount": 0, "createdBy": None,
    }  # fmt: skip


def _build(template: Template, build: Build) -> dict[str, Any]:
    return {"buildID": build.build_id, "status": build.status, "createdAt": iso(build.created_at),
            "updatedAt": iso(build.finished_at or build.created_at), "finishedAt":
            iso(build.finished_at) if build.finished_at else None, "cpuCount": build.cpu_count,
            "memoryMB": build.memory_mb}  # fmt: skip


@router.get("/templates/{template_id}/tags")
async def tags(template_id: str, plane: PlaneDep) -> list[dict[str, Any]]:
    template = plane.room.templates.find(template_id)
    return [{"tag": name, "buildID": t.build_id, "createdAt": iso(t.at)} for name, t in sorted(template.tags.items())]


@router.post("/templates/tags", status_code=201)
async def assign(body: AssignTags, plane: PlaneDep) -> dict[str, Any]:
    if not body.tags:
        raise InvalidRequest("assign at least one tag")
    build_id, names = plane.room.templates.tag(body.target, body.tags)
    return {"tags": names, "buildID": build_id}


@router.delete("/templates/tags", status_code=204)
async def untag(body: RemoveTags, plane: PlaneDep) -> Response:
    plane.room.templates.untag(body.name, body.tags)
    return Response(status_code=204)


async def delete_built(ref: str, plane: PlaneDep) -> bool:
    """Remove a built template (its record, its warm templates; its images stay until `stasis image prune`); False
    if ``ref`` names none."""
    try:
        template = plane.room.templates.find(ref)
    except (NotFound, InvalidRequest):
        return False
    if any(b.status == "building" for b in template.builds.values()):
        raise InvalidRequest(f"template {echo(template.name)} is being built; delete it when its build ends")
    await asyncio.to_thread(plane.room.forget_template, template)
    return True
