"""What E2B's control plane speaks: its request bodies, and its answers made from stasis' records (the
presenter every route of :mod:`.control` shares, reached through ``PlaneDep``)."""

from __future__ import annotations

import datetime
import re
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ....errors import InvalidRequest, clip
from ....models import MAX_SECONDS, CheckpointInfo, SandboxInfo
from ....netpolicy import NetworkPolicy
from ....volume_models import VolumeMount
from .records import Record
from .room import PAUSED, Defaults, E2bRoom

ENVD_VERSION = "0.6.4"  # the envd features served here (see e2b.envd.versions): metadata, watch entries, all of them
CLIENT_ID = "stasis"
ALL_TRAFFIC = "0.0.0.0/0"
WIDE_OPEN = (
    "allowOut ({rules}) without denyOut 0.0.0.0/0 narrows nothing (E2B's semantics): the sandbox may connect to the "
    "whole internet; to allow only allowOut, add denyOut ['0.0.0.0/0']"
)


class _Body(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class Transform(_Body):
    headers: dict[str, str] = Field(default_factory=dict)


class Rule(_Body):
    transform: Transform | None = None


class NetworkConfig(_Body):
    allow_out: list[str] | None = Field(None, alias="allowOut")
    deny_out: list[str] | None = Field(None, alias="denyOut")
    allow_public_traffic: bool | None = Field(None, alias="allowPublicTraffic")
    rules: dict[str, list[Rule]] | None = None  # per host: headers set on its requests (secrets as placeholders)


E2B_SECRET = re.compile(r"\$\{e2b\.secrets\.([^}]*)\}")


def egress_headers(network: NetworkConfig | None) -> dict[str, dict[str, str]]:
    """E2B's per-host header transforms as stasis' ``egress_headers``: ``${e2b.secrets.NAME}`` becomes
    ``${secrets.NAME}``, which the egress proxy fills in per request. Workload identity is not served here."""
    out: dict[str, dict[str, str]] = {}
    for host, rules in (network.rules or {}).items() if network else []:
        for rule in rules:
            for header, value in (rule.transform.headers if rule.transform else {}).items():
                if "${e2b.identity." in value:
                    raise InvalidRequest("workload identity tokens (${e2b.identity...}) are not supported by stasis")
                out.setdefault(host, {})[header] = E2B_SECRET.sub(lambda m: "${secrets." + m.group(1).lower() + "}",
                                                                  value)  # fmt: skip
    return out


class NewSandbox(_Body):
    template_id: str = Field(alias="templateID", min_length=1, max_length=200)
    timeout: int | None = Field(None, ge=0, le=MAX_SECONDS)
    auto_pause: bool = Field(False, alias="autoPause")
    auto_pause_memory: bool = Field(True, alias="autoPauseMemory")  # False: a timeout's pause keeps the files only
    metadata: dict[str, str] = Field(default_factory=dict)
    env_vars: dict[str, str] = Field(default_factory=dict, alias="envVars")
    allow_internet_access: bool | None = None
    network: NetworkConfig | None = None
    volume_mounts: list[VolumeMount] = Field(default_factory=list, alias="volumeMounts", max_length=16)


class Pause(_Body):
    memory: bool = True  # False: E2B's filesystem-only pause (a resume boots it again with its files)
    require_healthy_guest: bool | None = Field(None, alias="requireHealthyGuest")


class Timeout(_Body):
    timeout: int = Field(ge=0, le=MAX_SECONDS)


class Connect(_Body):
    timeout: int | None = Field(None, ge=0, le=MAX_SECONDS)


class Fork(_Body):
    timeout: int | None = Field(None, ge=0, le=MAX_SECONDS)
    count: int = Field(1, ge=1, le=64)


class Snapshot(_Body):
    name: str | None = None
    memory: bool = True  # False: E2B's "filesystem" mode


def policy(allow_internet_access: bool | None, network: NetworkConfig | None) -> NetworkPolicy | None:
    """E2B's network options as a stasis policy. Unlike E2B, no network unless asked (stasis' default).
    ``allow_internet_access=False`` is E2B's ``denyOut: [0.0.0.0/0]``. An allowOut with nothing denied narrows
    nothing (E2B's semantics): the whole internet, said in the policy's note (`stasis info`, the answers)."""
    allow = list(network.allow_out or []) if network else []
    deny = [rule for rule in (network.deny_out or []) if rule not in allow] if network else []
    if allow_internet_access is False and not allow:
        return None
    if ALL_TRAFFIC in deny or allow_internet_access is False:  # deny everything, then allow these (allow wins)
        return NetworkPolicy(allow_out=allow) if allow else NetworkPolicy.no_egress()
    if allow:
        shown = ", ".join(allow[:5]) + (f" and {len(allow) - 5} more" if len(allow) > 5 else "")
        return NetworkPolicy(deny_out=deny, note=WIDE_OPEN.format(rules=shown[:200]))
    if allow_internet_access or deny:
        return NetworkPolicy(deny_out=deny)
    return None


def warnings(info: SandboxInfo) -> dict[str, list[str]]:
    """What an answer about the sandbox says beside E2B's fields (the SDKs keep unknown fields): its policy's note."""
    network = info.spec.network
    return {"warnings": [network.note]} if network is not None and network.note else {}


def iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


def error(status: int, message: str) -> JSONResponse:
    """E2B's error body; what a client sent is never echoed at length (see :func:`stasis.errors.clip`)."""
    return JSONResponse({"code": status, "message": clip(message)}, status_code=status)


class ControlPlane:
    def __init__(self, room: E2bRoom, defaults: Defaults, domain: str | None) -> None:
        self.room = room
        self.defaults = defaults
        self.domain = domain

    def created(self, info: SandboxInfo, record: Record) -> dict[str, Any]:
        return {
            "templateID": record.template, "sandboxID": info.id, "clientID": CLIENT_ID, "envdVersion": ENVD_VERSION,
            "envdAccessToken": self.room.keys.envd_token(info.id), "alias": record.template, "domain": self.domain,
            "trafficAccessToken": None if record.public_traffic else self.room.keys.traffic_token(info.id),
            **warnings(info),
        }  # fmt: skip

    def listed(self, info: SandboxInfo, record: Record) -> dict[str, Any]:
        return {
            "templateID": record.template, "sandboxID": info.id, "clientID": CLIENT_ID, "alias": record.template,
            "startedAt": iso(info.created_at), "endAt": iso(self.room.ends_at(info)),
            "cpuCount": max(1, round(info.spec.cpus)), "memoryMB": info.spec.memory_mb, "diskSizeMB": info.spec.disk_mb,
            "envdVersion": ENVD_VERSION,
            "state": "paused" if info.status in PAUSED else "running", "metadata": record.metadata,
        }  # fmt: skip

    def detail(self, info: SandboxInfo, record: Record) -> dict[str, Any]:
        network = info.spec.network
        detail = {
            **self.listed(info, record), "envdAccessToken": self.room.keys.envd_token(info.id), "domain": self.domain,
            "allowInternetAccess": network is not None and not network.allow_out and "*" not in network.deny_out,
            **warnings(info),
        }  # fmt: skip
        if network is not None:
            detail["network"] = {"allowOut": network.allow_out, "denyOut": network.deny_out}
        if info.spec.egress_headers:
            detail.setdefault("network", {})["rules"] = {
                host: [{"transform": {"headers": {k: v.replace("${secrets.", "${e2b.secrets.") for k, v in h.items()}}}]
                for host, h in info.spec.egress_headers.items()
            }
        return detail

    def log_entries(self, sandbox_id: str) -> list[dict[str, Any]]:
        rows = self.room.core.journal(sandbox_id)
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


async def plane_of(request: Request) -> ControlPlane:
    return request.app.state.plane  # type: ignore[no-any-return]


PlaneDep = Annotated[ControlPlane, Depends(plane_of)]
