"""E2B's control plane (its OpenAPI spec, as the SDKs call it) over the E2B room.

Errors are E2B's: ``{"code": status, "message": ...}`` with the same status, which the SDKs turn into their own
exceptions (404 NotFoundException, 401 AuthenticationException, 400 InvalidArgumentException...).
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...errors import InvalidRequest, StasisError
from ...models import CheckpointInfo, SandboxInfo
from ...netpolicy import NetworkPolicy
from .records import Record
from .room import PAUSED, Defaults, E2bRoom

log = logging.getLogger(__name__)

ENVD_VERSION = "0.5.6"  # the envd features served here (see e2b.envd.versions): not octet-stream uploads (0.5.7)
CLIENT_ID = "stasis"
ALL_TRAFFIC = "0.0.0.0/0"


class _Body(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class NetworkConfig(_Body):
    allow_out: list[str] | None = Field(None, alias="allowOut")
    deny_out: list[str] | None = Field(None, alias="denyOut")
    allow_public_traffic: bool | None = Field(None, alias="allowPublicTraffic")


class NewSandbox(_Body):
    template_id: str = Field(alias="templateID", min_length=1, max_length=200)
    timeout: int | None = Field(None, ge=0)
    auto_pause: bool = Field(False, alias="autoPause")
    metadata: dict[str, str] = Field(default_factory=dict)
    env_vars: dict[str, str] = Field(default_factory=dict, alias="envVars")
    allow_internet_access: bool | None = None
    network: NetworkConfig | None = None
    volume_mounts: list[Any] | None = Field(None, alias="volumeMounts")


class Timeout(_Body):
    timeout: int = Field(ge=0)


class Connect(_Body):
    timeout: int | None = Field(None, ge=0)


class Fork(_Body):
    timeout: int | None = Field(None, ge=0)
    count: int = Field(1, ge=1, le=64)


class Snapshot(_Body):
    name: str | None = None
    memory: bool = True  # False: E2B's "filesystem" mode


def policy(allow_internet_access: bool | None, network: NetworkConfig | None) -> NetworkPolicy | None:
    """E2B's network options as a stasis policy. Unlike E2B, no network unless asked (stasis' default)."""
    allow = list(network.allow_out or []) if network else []
    deny = [rule for rule in (network.deny_out or []) if rule not in allow] if network else []
    if allow_internet_access is False and not allow:
        return None
    if ALL_TRAFFIC in deny:  # E2B: deny everything, then allow these (its allow wins over its deny)
        return NetworkPolicy(allow_out=allow) if allow else NetworkPolicy.no_egress()
    if allow_internet_access or allow or deny:
        return NetworkPolicy(deny_out=deny)
    return None


def iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


class ControlPlane:
    def __init__(self, room: E2bRoom, defaults: Defaults, domain: str | None) -> None:
        self.room = room
        self.defaults = defaults
        self.domain = domain

    def created(self, info: SandboxInfo, record: Record) -> dict[str, Any]:
        return {
            "templateID": record.template, "sandboxID": info.id, "clientID": CLIENT_ID, "envdVersion": ENVD_VERSION,
            "envdAccessToken": self.room.keys.envd_token(info.id), "alias": record.template, "domain": self.domain,
            "trafficAccessToken": None if record.public_traffic else self.room.keys.envd_token(info.id),
        }  # fmt: skip

    def listed(self, info: SandboxInfo, record: Record) -> dict[str, Any]:
        return {
            "templateID": record.template, "sandboxID": info.id, "clientID": CLIENT_ID, "alias": record.template,
            "startedAt": iso(record.started_at), "endAt": iso(record.end_at), "cpuCount": max(1, round(info.spec.cpus)),
            "memoryMB": info.spec.memory_mb, "diskSizeMB": info.spec.disk_mb, "envdVersion": ENVD_VERSION,
            "state": "paused" if info.status in PAUSED else "running", "metadata": record.metadata,
        }  # fmt: skip

    def detail(self, info: SandboxInfo, record: Record) -> dict[str, Any]:
        network = info.spec.network
        detail = {
            **self.listed(info, record), "envdAccessToken": self.room.keys.envd_token(info.id), "domain": self.domain,
            "allowInternetAccess": network is not None and not network.allow_out and "*" not in network.deny_out,
        }  # fmt: skip
        if network is not None:
            detail["network"] = {"allowOut": network.allow_out, "denyOut": network.deny_out}
        return detail

    def log_entries(self, sandbox_id: str) -> list[dict[str, Any]]:
        rows = self.room.core.store.transitions(sandbox_id)
        return [
            {
                "timestamp": iso(row["at"]),
                "level": "error" if row["to_status"] == "failed" else "info",
                "message": f"{row['from_status'] or 'new'} -> {row['to_status']} ({row['phase']})"
                + (f": {row['detail']}" if row["detail"] else ""),
                "fields": {"phase": row["phase"], "status": row["to_status"]},
            }
            for row in rows
        ]

    @staticmethod
    def snapshot_info(checkpoint: CheckpointInfo) -> dict[str, Any]:
        return {"snapshotID": checkpoint.id, "names": [checkpoint.name] if checkpoint.name else [checkpoint.id]}


def create_control_app(room: E2bRoom, defaults: Defaults, domain: str | None = None) -> FastAPI:
    plane = ControlPlane(room, defaults, domain)
    app = FastAPI(title="stasis: E2B's API", openapi_url=None, docs_url=None, redoc_url=None)

    @app.middleware("http")
    async def api_key(request: Request, call_next):  # type: ignore[no-untyped-def]
        if not room.keys.valid_api_key(request.headers.get("x-api-key")):
            return error(401, "Invalid API key: use the E2B_API_KEY that `stasis e2b serve` printed")
        return await call_next(request)

    @app.exception_handler(StasisError)
    async def stasis_error(request: Request, exc: StasisError) -> JSONResponse:
        return error(exc.status_code, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors()[:5])
        return error(400, f"invalid request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = "not part of E2B's API as stasis serves it" if exc.status_code == 404 else str(exc.detail)
        return error(exc.status_code, f"{request.method} {request.url.path}: {message}")

    @app.post("/sandboxes", status_code=201)
    @app.post("/v2/sandboxes", status_code=201)
    async def create(body: NewSandbox) -> dict[str, Any]:
        if body.volume_mounts:
            raise InvalidRequest("volumes are not supported by stasis: a sandbox's own disk persists across pauses")
        public = bool(body.network and body.network.allow_public_traffic)
        info, record = await room.create(
            defaults, body.template_id, body.timeout, body.auto_pause, body.metadata, body.env_vars,
            policy(body.allow_internet_access, body.network), public,
        )  # fmt: skip
        return plane.created(info, record)

    @app.get("/v2/sandboxes")
    async def list_v2(
        response: Response,
        metadata: str | None = None,
        state: str | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        next_token: Annotated[str | None, Query(alias="nextToken")] = None,
    ) -> list[dict[str, Any]]:
        wanted = dict(parse_qsl(metadata)) if metadata else {}
        states = set(state.split(",")) if state else {"running", "paused"}
        rows = [plane.listed(info, record) for info, record in room.listing()]
        rows = [r for r in rows if r["state"] in states and wanted.items() <= r["metadata"].items()]
        rows.sort(key=lambda r: (r["startedAt"], r["sandboxID"]))
        if next_token:
            rows = [r for r in rows if (r["startedAt"], r["sandboxID"]) > tuple(next_token.split("|", 1))]
        page = rows[:limit]
        if len(rows) > limit:
            response.headers["x-next-token"] = f"{page[-1]['startedAt']}|{page[-1]['sandboxID']}"
        return page

    @app.get("/sandboxes")
    async def list_v1(metadata: str | None = None) -> list[dict[str, Any]]:
        wanted = dict(parse_qsl(metadata)) if metadata else {}
        rows = [plane.listed(info, record) for info, record in room.listing()]
        return [
            r for r in rows if r["state"] == "running" and all(r["metadata"].get(k) == v for k, v in wanted.items())
        ]

    @app.get("/sandboxes/{sandbox_id}")
    async def get(sandbox_id: str) -> dict[str, Any]:
        info = room.sandbox(sandbox_id)
        return plane.detail(info, room.record(info))

    @app.delete("/sandboxes/{sandbox_id}", status_code=204)
    async def kill(sandbox_id: str) -> Response:
        await room.kill(sandbox_id)
        return Response(status_code=204)

    @app.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
    async def set_timeout(sandbox_id: str, body: Timeout) -> Response:
        room.set_timeout(sandbox_id, body.timeout)
        return Response(status_code=204)

    @app.post("/sandboxes/{sandbox_id}/refreshes", status_code=204)
    async def refresh(sandbox_id: str, body: Connect | None = None) -> Response:
        room.set_timeout(sandbox_id, body.timeout if body and body.timeout is not None else 300)
        return Response(status_code=204)

    @app.post("/sandboxes/{sandbox_id}/pause", status_code=204)
    async def pause(sandbox_id: str) -> Response:
        if room.sandbox(sandbox_id).status in PAUSED:
            return error(409, f"sandbox {sandbox_id} is already paused")
        await room.pause(sandbox_id)
        return Response(status_code=204)

    @app.post("/sandboxes/{sandbox_id}/resume", status_code=201)
    @app.post("/sandboxes/{sandbox_id}/connect")
    @app.post("/v2/sandboxes/{sandbox_id}/connect")
    async def connect(sandbox_id: str, body: Connect | None = None) -> JSONResponse:
        info, record, resumed = await room.connect(sandbox_id, body.timeout if body else None)
        return JSONResponse(plane.created(info, record), status_code=201 if resumed else 200)

    @app.post("/sandboxes/{sandbox_id}/fork", status_code=201)
    async def fork(sandbox_id: str, body: Fork) -> list[dict[str, Any]]:
        children = await room.fork(sandbox_id, body.count, body.timeout)
        return [{"sandbox": plane.created(info, record)} for info, record in children]

    @app.post("/sandboxes/{sandbox_id}/snapshots", status_code=201)
    async def snapshot(sandbox_id: str, body: Snapshot | None = None) -> dict[str, Any]:
        body = body or Snapshot()
        return plane.snapshot_info(await room.snapshot(sandbox_id, body.name, body.memory))

    @app.delete("/templates/{template_id}", status_code=204)
    async def delete_snapshot(template_id: str) -> Response:
        room.delete_snapshot(template_id)
        return Response(status_code=204)

    @app.put("/sandboxes/{sandbox_id}/network", status_code=204)
    async def update_network(sandbox_id: str, body: NetworkConfig) -> Response:
        await room.update_network(sandbox_id, policy(True, body) or NetworkPolicy.no_egress())
        return Response(status_code=204)

    @app.get("/snapshots")
    async def snapshots(sandbox_id: Annotated[str | None, Query(alias="sandboxID")] = None) -> list[dict[str, Any]]:
        if sandbox_id is not None:
            sandbox_id = room.sandbox(sandbox_id).id
        return [plane.snapshot_info(c) for c in room.snapshots(sandbox_id)]

    @app.get("/sandboxes/{sandbox_id}/logs")
    async def logs(sandbox_id: str) -> dict[str, Any]:
        """The sandbox's lifecycle journal (stasis' transitions: created, suspended, resumed...) as E2B's logs."""
        entries = plane.log_entries(room.sandbox(sandbox_id).id)
        return {"logs": [{"timestamp": e["timestamp"], "line": e["message"]} for e in entries], "logEntries": entries}

    @app.get("/v2/sandboxes/{sandbox_id}/logs")
    async def logs_v2(sandbox_id: str) -> dict[str, Any]:
        return {"logs": plane.log_entries(room.sandbox(sandbox_id).id)}

    @app.get("/sandboxes/{sandbox_id}/metrics")
    async def metrics(sandbox_id: str) -> list[dict[str, Any]]:
        """One sample, taken now (stasis keeps no history of them); none for a paused sandbox."""
        sample = await room.metrics(sandbox_id)
        if sample is None:
            return []
        now = time.time()
        return [{
            "timestamp": iso(now), "timestampUnix": int(now), "cpuCount": sample["cpu_count"],
            "cpuUsedPct": sample["cpu_used_pct"], "memUsed": sample["mem_used"], "memTotal": sample["mem_total"],
            "memCache": sample["mem_cache"], "diskUsed": sample["disk_used"], "diskTotal": sample["disk_total"],
        }]  # fmt: skip

    return app
