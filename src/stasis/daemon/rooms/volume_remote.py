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
import time
from pathlib import Path
from typing import Any

from ...errors import CheckpointCorrupt, InvalidRequest, NameTaken, NotFound, VolumeNotFound, echo
from ...models import RemoteEntry, TransferResult
from ...remote.chunks import Transfer
from ...remote.manifest import FORMAT, VolumeManifest
from ...validation import validate_name
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
                                  files=section, pushed_by=remote.node, pushed_at=time.time())  # fmt: skip
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
        transfers: list[Transfer] = []

        def fill(dest: Path) -> None:
            transfers.append(self.remote.chunks.download_tree(manifest.files, dest))

        limit = manifest.max_size_mb
        if limit is not None and self.store.disk.kind != "btrfs":
            log.warning("volume %s had a %d MiB limit; this node keeps volumes as plain directories, without", name,
                        limit)  # fmt: skip
            limit = None
        await asyncio.to_thread(self.store.create, name, None, limit, fill)
        log.info("pulled volume %s: %s", name, transfers[0].as_dict())
        return self._result(name, key, transfers[0])

    async def entries(self) -> list[RemoteEntry]:
        found = []
        for key in await asyncio.to_thread(self.remote.objects.list, "volumes/"):
            document = await asyncio.to_thread(self.remote.objects.read_document, key)
            if document is None:
                continue
            try:
                m = VolumeManifest.parse(document[0], key)
            except CheckpointCorrupt as exc:  # the store's word: a bad one is left out of the listing, and logged
                log.warning("%s", exc)
                continue
            found.append(RemoteEntry(kind="volume", id=m.name, name=m.name, backend="", image="",
                                     pushed_by=m.pushed_by, pushed_at=m.pushed_at))  # fmt: skip
        return found

    # -- with a sandbox

    async def send(self, mounts: list[VolumeMount]) -> None:
        """A sandbox leaves for the store: its volumes go too (each a copy; it stays here for others)."""
        for name in dict.fromkeys(m.name for m in mounts):
            await self.push(name)

    async def fetch_missing(self, mounts: list[VolumeMount]) -> None:
        """A sandbox arrives: the volumes it mounts that this node lacks come from the store."""
        for name in dict.fromkeys(m.name for m in mounts):
            try:
                await asyncio.to_thread(self.store.get, name)
            except NotFound:
                await self.pull(name)

    def _result(self, name: str, key: str, transfer: Transfer) -> TransferResult:
        return TransferResult(kind="volume", id=name, name=name, url=self.remote.objects.url(key),
                              **transfer.as_dict())  # fmt: skip
