"""Volumes to and from the remote store, so that a volume follows its sandboxes to another node.

    volumes/<name>.json     a volume's manifest: its files as one node last pushed them (the newest push wins)

A push sends the volume's files as a snapshot takes them (on btrfs: at one instant); a pull makes a new volume of
that name here. A volume in the store is a copy, not a shared disk: two nodes that both write their copies
diverge, and the next push replaces the store's. A sandbox pushed to the store takes its volumes with it, and a
node that pulls the sandbox pulls the volumes it does not have (one it has is used as it is here).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from ...errors import CheckpointCorrupt, Conflict, InvalidRequest, NameTaken, NoSpace, NotFound, VolumeNotFound, echo
from ...models import RemoteEntry, TransferResult
from ...remote.chunks import CHUNK, Transfer
from ...remote.manifest import FORMAT, VolumeManifest
from ...validation import validate_name
from ...volume_copy import RESERVE
from ...volume_models import VolumeMount
from .remote import RemoteService
from .volumes import VolumesRoom

log = logging.getLogger(__name__)


class VolumeTransfers:
    def __init__(self, remote: RemoteService, volumes: VolumesRoom) -> None:
        self.remote = remote
        self.store = volumes.store

    @staticmethod
    def _key(name: str) -> str:
        try:
            return f"volumes/{validate_name(name, 'volume')}.json"
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None

    async def push(self, name: str) -> TransferResult:
        info = await asyncio.to_thread(self.store.get, name)
        key = self._key(name)
        remote = self.remote
        section, transfer = await asyncio.to_thread(self._upload, name)
        manifest = VolumeManifest(format=FORMAT, kind="volume", name=name, max_size_mb=info.max_size_mb,
                                  incarnation=info.incarnation, team=info.team, files=section, pushed_by=remote.node,
                                  pushed_at=time.time())  # fmt: skip
        existing = await asyncio.to_thread(remote.objects.read_document, key)
        await asyncio.to_thread(remote.objects.write_document, key, manifest.model_dump(mode="json"),
                                replacing=existing[1] if existing else None)  # fmt: skip
        log.info("pushed volume %s: %s", name, transfer.as_dict())
        return self._result(name, key, transfer)

    def _upload(self, name: str) -> tuple[dict[str, Any], Transfer]:
        with self.store.frozen(name) as files:
            return self.remote.chunks.upload_tree(files)

    async def pull(self, name: str) -> TransferResult:
        """A new volume here with the store's copy of the files."""
        key = self._key(name)
        try:
            await asyncio.to_thread(self.store.get, name)
        except NotFound:
            pass
        else:
            raise NameTaken(f"a volume named {echo(name)} is on this node; remove it (`stasis volume rm {name}`) "
                            "to pull the store's copy instead", name=name)  # fmt: skip
        found = await asyncio.to_thread(self.remote.objects.read_document, key)
        if found is None:
            raise VolumeNotFound(f"no volume {echo(name)} in the remote store {self.remote.config.url}")
        manifest = VolumeManifest.parse(found[0], self.remote.objects.url(key))
        if manifest.name != name:
            raise InvalidRequest(f"{self.remote.objects.url(key)} describes volume {manifest.name!r}; refused")
        await asyncio.to_thread(self.store.disk.ready, True)  # the store made and mounted: its free space counts
        self._check_size(manifest, limit := self._limit(manifest))
        transfers: list[Transfer] = []

        def fill(dest: Path) -> None:
            transfers.append(self.remote.chunks.download_tree(manifest.files, dest))

        await asyncio.to_thread(self.store.create, name, None, limit, fill, manifest.incarnation or None,
                                manifest.team)  # fmt: skip
        log.info("pulled volume %s: %s", name, transfers[0].as_dict())
        return self._result(name, key, transfers[0])

    def _limit(self, manifest: VolumeManifest) -> int | None:
        limit = manifest.max_size_mb
        if limit is not None and self.store.disk.kind != "btrfs":
            log.warning("volume %s had a %d MiB limit; this node keeps volumes as plain directories, without",
                        manifest.name, limit)  # fmt: skip
            return None
        return limit

    def _check_size(self, manifest: VolumeManifest, limit_mb: int | None) -> None:
        """The store's word on how much a pull writes, checked before a byte is: within the volume's limit, and
        leaving the disk the volumes are on RESERVE free. (The limit holds while it is written, too.)"""
        try:
            tar, blobs = manifest.files["tar"], manifest.files["blobs"]
            pieces = len(tar["chunks"]) + sum(1 for blob in blobs for sha in blob["chunks"] if sha)
        except (KeyError, TypeError):
            raise CheckpointCorrupt(f"volume {manifest.name}'s manifest lists no files stasis can read") from None
        size = pieces * CHUNK
        if limit_mb is not None and size > (limit_mb << 20) + CHUNK * (1 + len(blobs)):
            raise CheckpointCorrupt(f"volume {manifest.name} in the store holds more than its {limit_mb} MiB limit")
        free = shutil.disk_usage(self.store.directory).free
        if size > free - RESERVE:
            raise NoSpace(f"volume {manifest.name} is up to {size >> 20} MiB, and the disk its volumes are on has "
                          f"{free >> 20} MiB free; free some, then pull again")  # fmt: skip

    async def entries(self) -> list[RemoteEntry]:
        found = []
        for key in await asyncio.to_thread(self.remote.objects.list, "volumes/"):
            document = await asyncio.to_thread(self.remote.objects.read_document, key)
            if document is None:
                continue
            try:
                m = VolumeManifest.parse(document[0], key)
            except (CheckpointCorrupt, ValueError) as exc:  # the store's word: a bad one is left out, and logged
                log.warning("%s", exc)
                continue
            found.append(RemoteEntry(kind="volume", id=m.name, name=m.name, backend="", image="",
                                     pushed_by=m.pushed_by, pushed_at=m.pushed_at))  # fmt: skip
        return found

    # -- with a sandbox

    async def send(self, mounts: list[VolumeMount]) -> dict[str, str]:
        """A sandbox leaves for the store: its volumes go too (each a copy; it stays here for others). Each
        volume's incarnation, for the sandbox's manifest."""
        sent = {}
        for name in dict.fromkeys(m.name for m in mounts):
            await self.push(name)
            sent[name] = (await asyncio.to_thread(self.store.get, name)).incarnation
        return sent

    async def fetch_missing(self, sandbox: str, mounts: list[VolumeMount], incarnations: dict[str, str]) -> None:
        """A sandbox arrives: the volumes it mounts that this node lacks come from the store. One this node has
        must be the same volume (a copy of the one it left with), never another that only shares its name."""
        for name in dict.fromkeys(m.name for m in mounts):
            try:
                local = await asyncio.to_thread(self.store.get, name)
            except NotFound:
                await self.pull(name)
                continue
            if not local.incarnation or incarnations.get(name) != local.incarnation:
                raise Conflict(f"sandbox {sandbox} mounts volume {echo(name)}, and this node's volume of that name "
                               "is another volume, not a copy of the one it left with; remove or rename this "
                               "node's, then pull again")  # fmt: skip

    def _result(self, name: str, key: str, transfer: Transfer) -> TransferResult:
        return TransferResult(kind="volume", id=name, name=name, url=self.remote.objects.url(key),
                              **transfer.as_dict())  # fmt: skip
