"""``Volume``: a named directory tree that outlives sandboxes, mounted into them (gVisor).

    data = Volume.create("data")
    a = Sandbox.create(volumes={"/data": "data"})
    b = Sandbox.create(volumes={"/data": {"name": "data", "read_only": True}})
    snap = data.snapshot()                                  # a read-only copy of its files now
    fork = Volume.create("data-fork", from_snapshot=snap.id)   # writable, diverges from "data"
    Volume.create("scratch", max_size_mb=512)               # past 512 MiB a write fails (EDQUOT)
    data.push(); Volume.pull("data")                         # through the remote store, to another node

A volume's files are not in a sandbox's checkpoints: a restore or fork mounts the same volume again.
``AsyncVolume`` is the same over :class:`AsyncClient`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ..models import TransferResult, build
from ..volume_models import (
    CreateVolumeRequest,
    SnapshotVolumeRequest,
    UpdateVolumeRequest,
    VolumeInfo,
    VolumeSnapshotInfo,
)
from ._base import Call, _model, _models
from ._client import AsyncClient, Client
from ._host import remote_call


def _create(name: str, from_snapshot: str | None, max_size_mb: int | None) -> Call:
    body = build(CreateVolumeRequest, name=name, from_snapshot=from_snapshot, max_size_mb=max_size_mb).model_dump()
    return Call("POST", "/v1/volumes", _model(VolumeInfo), json=body)


def _update(name: str, max_size_mb: int | None) -> Call:
    body = build(UpdateVolumeRequest, max_size_mb=max_size_mb).model_dump()
    return Call("PATCH", f"/v1/volumes/{quote(name)}", _model(VolumeInfo), json=body)


def _snapshot(name: str, snapshot_name: str | None) -> Call:
    body = build(SnapshotVolumeRequest, name=snapshot_name).model_dump()
    return Call("POST", f"/v1/volumes/{quote(name)}/snapshots", _model(VolumeSnapshotInfo), json=body)


def _files(name: str, path: str) -> Call:
    return Call("GET", f"/v1/volumes/{quote(name)}/files", lambda r: r.json(), params={"path": path})


def _info(name: str) -> Call:
    return Call("GET", f"/v1/volumes/{quote(name)}", _model(VolumeInfo))


def _remove(name: str) -> Call:
    return Call("DELETE", f"/v1/volumes/{quote(name)}", lambda r: None)


LIST = Call("GET", "/v1/volumes", _models(VolumeInfo))


def _snapshots(volume: str | None) -> Call:
    params = {"volume": volume} if volume else {}
    return Call("GET", "/v1/volume-snapshots", _models(VolumeSnapshotInfo), params=params)


def _remove_snapshot(ref: str) -> Call:
    return Call("DELETE", f"/v1/volume-snapshots/{quote(ref)}", lambda r: None)


@dataclass
class Volume:
    name: str
    client: Client

    @classmethod
    def create(
        cls, name: str, *, from_snapshot: str | None = None, max_size_mb: int | None = None,
        client: Client | None = None,
    ) -> Volume:  # fmt: skip
        """An empty volume, or (``from_snapshot``: a snapshot's id or name) a writable fork of a snapshot.
        ``max_size_mb``: a size limit (a fork keeps its snapshot's); past it a write fails with EDQUOT."""
        client = client or Client()
        client.call(_create(name, from_snapshot, max_size_mb))
        return cls(name, client)

    @classmethod
    def get(cls, name: str, client: Client | None = None) -> Volume:
        client = client or Client()
        client.call(_info(name))
        return cls(name, client)

    @staticmethod
    def list(client: Client | None = None) -> list[VolumeInfo]:
        return (client or Client()).call(LIST)  # type: ignore[no-any-return]

    @staticmethod
    def snapshots(volume: str | None = None, client: Client | None = None) -> list[VolumeSnapshotInfo]:
        return (client or Client()).call(_snapshots(volume))  # type: ignore[no-any-return]

    @staticmethod
    def delete_snapshot(ref: str, client: Client | None = None) -> None:
        (client or Client()).call(_remove_snapshot(ref))

    def info(self) -> VolumeInfo:
        """Its size and the sandboxes that mount it, now."""
        return self.client.call(_info(self.name))  # type: ignore[no-any-return]

    def snapshot(self, name: str | None = None) -> VolumeSnapshotInfo:
        return self.client.call(_snapshot(self.name, name))  # type: ignore[no-any-return]

    def set_max_size(self, max_size_mb: int | None) -> VolumeInfo:
        """A new size limit (None: none). Below what it holds, it keeps its files and takes no more writes."""
        return self.client.call(_update(self.name, max_size_mb))  # type: ignore[no-any-return]

    def push(self) -> TransferResult:
        """Send a copy of its files to the daemon's remote store (the newest push of a name wins)."""
        return self.client.call(remote_call("push", self.name, "volume"))  # type: ignore[no-any-return]

    @classmethod
    def pull(cls, name: str, client: Client | None = None) -> Volume:
        """A new volume here with the remote store's copy of volume ``name``."""
        client = client or Client()
        client.call(remote_call("pull", name, "volume"))
        return cls(name, client)

    def files(self, path: str = "/") -> list[dict[str, Any]]:
        """The entries of one directory of the volume (name, type, path, size, mode, uid, gid, times; a link's
        target): links are listed, never followed."""
        return self.listing(path)["entries"]  # type: ignore[no-any-return]

    def listing(self, path: str = "/") -> dict[str, Any]:
        return self.client.call(_files(self.name, path))  # type: ignore[no-any-return]

    def delete(self) -> None:
        """Gone with its files (refused while a sandbox that is not terminated mounts it); its snapshots stay."""
        self.client.call(_remove(self.name))


@dataclass
class AsyncVolume:
    name: str
    client: AsyncClient

    @classmethod
    async def create(
        cls, name: str, *, client: AsyncClient, from_snapshot: str | None = None, max_size_mb: int | None = None
    ) -> AsyncVolume:
        await client.call(_create(name, from_snapshot, max_size_mb))
        return cls(name, client)

    @staticmethod
    async def list(client: AsyncClient) -> list[VolumeInfo]:
        return await client.call(LIST)  # type: ignore[no-any-return]

    async def info(self) -> VolumeInfo:
        return await self.client.call(_info(self.name))  # type: ignore[no-any-return]

    async def snapshot(self, name: str | None = None) -> VolumeSnapshotInfo:
        return await self.client.call(_snapshot(self.name, name))  # type: ignore[no-any-return]

    async def set_max_size(self, max_size_mb: int | None) -> VolumeInfo:
        return await self.client.call(_update(self.name, max_size_mb))  # type: ignore[no-any-return]

    async def files(self, path: str = "/") -> list[dict[str, Any]]:
        return (await self.client.call(_files(self.name, path)))["entries"]  # type: ignore[no-any-return]

    async def delete(self) -> None:
        await self.client.call(_remove(self.name))
