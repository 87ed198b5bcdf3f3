"""Checkpoints and suspended sandboxes to and from the remote store, so that another node restores
or resumes them.

Keys under the store's prefix::

    chunks/ab/<sha256>             a piece of some artifact (lz4), named by the hash of its bytes
    checkpoints/<id>.json          a checkpoint's manifest: immutable once written
    sandboxes/<id>.json            a sandbox's manifest, and who owns it: ``owner`` is a node, or None
                                   while the sandbox waits in the store; ``generation`` counts hand-overs
    externals/<key>.json           a file sandboxes depend on outside their directory (a microVM's base
                                   disk, by its file system's UUID), sent once, fetched where missing
    names/{sandboxes,checkpoints}/<name>   the id a name stands for

A manifest is written last, after every piece it names: a cut-off push is never visible. Ownership is
a compare-and-swap on the sandbox manifest (S3 conditional writes, If-Match on its ETag), so of two
nodes racing to take a sandbox exactly one wins. A node only pushes a sandbox it owns, and removes its
own copy only after the store has taken it over; a push cut off by a daemon kill is settled on restart
(see :meth:`RemoteService.settle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from ... import faults, hostpath
from ...backends.base import External
from ...errors import (
    CheckpointCorrupt,
    CheckpointNotFound,
    Conflict,
    InvalidRequest,
    NameTaken,
    NotFound,
    SandboxNotFound,
    StasisError,
    StoreUnreachable,
    Unsupported,
)
from ...models import (
    CheckpointInfo,
    RemoteEntry,
    SandboxInfo,
    SandboxStatus,
    TransferResult,
)
from ...remote.cache import ChunkCache
from ...remote.chunks import Chunks, Transfer
from ...remote.config import RemoteConfig, node_name
from ...remote.directory import DirectoryStore
from ...remote.manifest import FORMAT, ImageRef, Manifest
from ...validation import ID_PATTERN, NAME_PATTERN
from ...volume_models import VolumeMount
from ..core.service import SandboxService
from ..core.tables import PushTable
from .checkpointing import Checkpoints

if TYPE_CHECKING:
    from ...remote.objects import ObjectStore


def s3_store(config: RemoteConfig) -> ObjectStore:
    """An S3 bucket's store: boto3 (0.13 s of every start) is imported only by a daemon that has one."""
    from ...remote.objects import ObjectStore

    return ObjectStore(config)


class VolumeTransfers(Protocol):
    """Volumes to and from the store (:mod:`.volume_remote`), which follow the sandboxes that mount them."""

    async def push(self, name: str) -> TransferResult: ...
    async def pull(self, name: str) -> TransferResult: ...
    async def entries(self) -> list[RemoteEntry]: ...
    async def send(self, mounts: list[VolumeMount]) -> dict[str, str]: ...
    async def fetch_missing(self, sandbox: str, mounts: list[VolumeMount], incarnations: dict[str, str]) -> None: ...


log = logging.getLogger(__name__)

S = SandboxStatus
CHECKPOINT_ID = re.compile(r"ck-[0-9a-z]{12}")
EXTERNAL_KEY = re.compile(r"[a-z0-9]{1,16}-[0-9a-f]{8,64}")  # a backend's name for a file's content
FOLDERS = {"sandbox": "sandboxes", "checkpoint": "checkpoints"}


class RemoteService:
    def __init__(
        self, service: SandboxService, config: RemoteConfig, checkpoints: Checkpoints, table: PushTable
    ) -> None:
        self.service = service
        self.config = config
        self.checkpoints = checkpoints
        self.table = table  # pushes under way: this room is its one writer
        self.node = node_name(service.paths.home)
        self.objects: ObjectStore | DirectoryStore = DirectoryStore(config) if config.directory else s3_store(config)
        self.cache = ChunkCache(service.paths.home / "remote-cache", config.cache_limit_bytes)
        self.chunks = Chunks(self.objects, self.cache)
        self.externals = service.paths.images / "remote-externals"  # files sandboxes depend on, fetched here
        self.volumes: VolumeTransfers | None = None  # volumes follow their sandboxes (set where volumes are kept)

    # ------------------------------------------------------------ checkpoints

    async def push_checkpoint(self, ref: str) -> TransferResult:
        checkpoint = self.checkpoints.get(ref)
        key = f"checkpoints/{checkpoint.id}.json"
        source = self.checkpoints.files.path(checkpoint.id)
        section, transfer = await asyncio.to_thread(self.chunks.upload_tree, source)
        externals = await self._push_externals(checkpoint.backend, source)
        manifest = self._manifest("checkpoint", checkpoint.id, checkpoint.name, checkpoint.backend, checkpoint.image,
                                  checkpoint.spec.image, checkpoint.runtime, checkpoint.model_dump(mode="json"),
                                  section, externals)  # fmt: skip
        existing = await asyncio.to_thread(self.objects.read_document, key)
        if existing is None:
            await asyncio.to_thread(self.objects.write_document, key, manifest.document(), replacing=None)
        elif Manifest.parse(existing[0], key).record.get("sha256") != checkpoint.sha256:
            raise Conflict(f"{self.objects.url(key)} holds a different checkpoint of the same id; not overwritten")
        if checkpoint.name:
            await asyncio.to_thread(self.objects.put, f"names/checkpoints/{checkpoint.name}", checkpoint.id.encode())
        log.info("pushed checkpoint %s: %s", checkpoint.id, transfer.as_dict())
        return self._result("checkpoint", checkpoint.id, checkpoint.name, key, transfer)

    async def pull_checkpoint(self, ref: str) -> TransferResult:
        """Fetch a checkpoint into this node (a copy: it stays in the store for others)."""
        key, (manifest, _) = await self._find("checkpoint", ref)
        checkpoint = CheckpointInfo.model_validate(manifest.record)
        _check_id(checkpoint.id, CHECKPOINT_ID, key)
        try:
            local = self.checkpoints.get(checkpoint.id)
            return self._result("checkpoint", local.id, local.name, key, Transfer())  # here already
        except NotFound:
            pass
        self._check_runnable(manifest)
        files = self.checkpoints.files
        files.root.mkdir(parents=True, exist_ok=True)
        dest = files.path(checkpoint.id)
        shutil.rmtree(dest, ignore_errors=True)  # a pull cut off after the rename, before the record
        transfer = await self._download(manifest, dest)
        try:
            await asyncio.to_thread(files.verify, checkpoint.id, checkpoint.sha256)
            self.checkpoints.adopt(checkpoint)
        except BaseException:
            files.remove(checkpoint.id)
            raise
        log.info("pulled checkpoint %s: %s", checkpoint.id, transfer.as_dict())
        return self._result("checkpoint", checkpoint.id, checkpoint.name, key, transfer)

    # ------------------------------------------------------------ sandboxes

    async def push_sandbox(self, ref: str) -> TransferResult:
        """Suspend it (if it runs), send it, hand it to the store, remove it here."""
        service = self.service
        info = service.record(ref)
        if info.pool is not None:
            raise InvalidRequest(f"{info.id} waits in pool {info.pool!r}; only a claimed sandbox can move")
        if info.status == S.RUNNING:
            info = await service.suspend(info.id)
        key = f"sandboxes/{info.id}.json"
        async with service.locked(info.id) as info:
            if info.status != S.SUSPENDED:
                raise Conflict(f"sandbox {info.name or info.id} is {info.status.value}; only a suspended one can move")
            existing = await asyncio.to_thread(self.objects.read_document, key)
            previous = Manifest.parse(existing[0], key) if existing is not None else None
            if previous is not None and previous.owner not in (self.node, None):
                raise Conflict(f"the store says sandbox {info.id} is owned by node {previous.owner!r}")
            directory = service.files_of(info)  # suspended: nothing of the host holds its files
            section, transfer = await asyncio.to_thread(self.chunks.upload_tree, directory)
            externals = await self._push_externals(info.spec.backend, directory)
            volumes = await self.volumes.send(info.spec.volumes) if self.volumes is not None else {}
            record = info.model_dump(mode="json")
            manifest = self._manifest("sandbox", info.id, info.name, info.spec.backend, info.image_key or "",
                                      info.spec.image, info.runtime, record, section, externals)  # fmt: skip
            faults.point("remote.push.after_chunks")
            push_id = secrets.token_hex(8)
            generation = previous.generation + 1 if previous is not None else 1
            manifest = manifest.model_copy(
                update={"owner": None, "generation": generation, "push_id": push_id, "volumes": volumes}
            )
            if info.name:  # the name's pointer first: the manifest may be the last thing this daemon writes
                await asyncio.to_thread(self.objects.put, f"names/sandboxes/{info.name}", info.id.encode())
            self.table.begin_push(info.id, push_id)  # intent: a restart settles it against the store
            try:
                await asyncio.to_thread(
                    self.objects.write_document, key, manifest.document(), replacing=existing[1] if existing else None
                )
            except BaseException:
                self.table.end_push(info.id)
                raise
            faults.point("remote.push.after_manifest")
            await self._leave(info, self.objects.url(key))
        log.info("pushed sandbox %s (generation %d): %s", info.id, generation, transfer.as_dict())
        return self._result("sandbox", info.id, info.name, key, transfer, owner=None)

    async def pull_sandbox(self, ref: str) -> TransferResult:
        """Take the sandbox over from the store (exactly one node wins) and fetch it, suspended."""
        key, (manifest, etag) = await self._find("sandbox", ref)
        sandbox_id = manifest.id
        owner = manifest.owner
        if owner not in (None, self.node):
            raise Conflict(
                f"sandbox {manifest.name or sandbox_id} moved to node {owner!r}; it runs there now "
                f"(push it from there to move it again)"
            )
        self._check_runnable(manifest)
        info = SandboxInfo.model_validate(manifest.record)
        _check_id(info.id, ID_PATTERN, key)
        if info.id != manifest.id or info.name != manifest.name:  # the store's word: one manifest, one sandbox
            raise CheckpointCorrupt(f"{self.objects.url(key)} describes {manifest.id}, but its record another sandbox")
        if self.unsettled(info.id):
            await self.settle()  # a push of ours the daemon did not see through: finish it first
        local = self._local(info.id)
        if local is not None and local.status != S.TERMINATED:
            if owner == self.node:
                return self._result("sandbox", info.id, info.name, key, Transfer(), owner=self.node)  # here already
            raise Conflict(f"sandbox {info.id} is both here ({local.status.value}) and waiting in the store; "
                           "remove one of them")  # fmt: skip
        if info.name and owner is None:
            try:
                here = self.service.record(info.name)
            except NotFound:
                here = None
            if here is not None and here.id != info.id:
                raise NameTaken(
                    f"a different sandbox named {info.name!r} is on this node; remove or rename it, then pull again",
                    name=info.name,
                )
        if self.volumes is not None:
            await self.volumes.fetch_missing(info.id, info.spec.volumes, manifest.volumes)  # before it is taken
        if owner is None:  # take it: of nodes racing here exactly one write succeeds
            taken = manifest.model_copy(
                update={"owner": self.node, "generation": manifest.generation + 1, "taken_at": time.time()}
            ).document()
            try:
                await asyncio.to_thread(self.objects.write_document, key, taken, replacing=etag)
            except Conflict:
                raise Conflict(
                    f"another node took sandbox {manifest.name or sandbox_id} from the store just now"
                ) from None
            faults.point("remote.pull.after_take")
        dest = self.service.home_for(info.id)
        if dest.exists():
            shutil.rmtree(dest)  # a pull cut off after the rename: we own it, fetch it whole again
        dest.parent.mkdir(parents=True, exist_ok=True)
        transfer = await self._download(manifest, dest)
        self.service.arrived(info, f"pulled from {self.objects.url(key)} (generation {manifest.generation})")
        log.info("pulled sandbox %s: %s", info.id, transfer.as_dict())
        return self._result("sandbox", info.id, info.name, key, transfer, owner=self.node)

    async def push(self, ref: str, kind: str | None) -> TransferResult:
        if kind == "volume":
            return await self._volumes().push(ref)
        if kind == "checkpoint":
            return await self.push_checkpoint(ref)
        if kind == "sandbox":
            return await self.push_sandbox(ref)
        try:
            self.service.record(ref)
        except NotFound:
            return await self.push_checkpoint(ref)
        return await self.push_sandbox(ref)

    async def pull(self, ref: str, kind: str | None) -> TransferResult:
        if kind == "volume":
            return await self._volumes().pull(ref)
        if kind == "checkpoint":
            return await self.pull_checkpoint(ref)
        if kind == "sandbox":
            return await self.pull_sandbox(ref)
        try:
            return await self.pull_sandbox(ref)
        except NotFound:
            return await self.pull_checkpoint(ref)

    async def listing(self) -> list[RemoteEntry]:
        """What the store holds: every sandbox (and who owns it) and checkpoint, oldest push first."""
        entries = []
        for folder in FOLDERS.values():
            for name in await asyncio.to_thread(self.objects.list, folder + "/"):
                found = await asyncio.to_thread(self.objects.read_document, name)
                if found is None:
                    continue  # removed since it was listed
                try:
                    m = Manifest.parse(found[0], name)
                except CheckpointCorrupt as exc:
                    log.warning("%s", exc)
                    continue
                fields = ("kind", "id", "name", "backend", "owner", "generation", "pushed_by")
                record = None
                if m.kind == "sandbox":  # the store's word, checked as any input: a bad record is shown without it
                    with contextlib.suppress(ValidationError):
                        record = SandboxInfo.model_validate(m.record)
                entries.append(RemoteEntry(**m.model_dump(include=set(fields)), image=m.image.ref,
                                           pushed_at=m.pushed_at, sandbox=record))  # fmt: skip
        if self.volumes is not None:
            entries += await self.volumes.entries()
        return sorted(entries, key=lambda e: e.pushed_at)

    # ------------------------------------------------------------ after a restart

    async def settle(self) -> None:
        """Pushes a daemon kill cut off: if the store took the sandbox over, finish removing it here;
        if not, it stays here, suspended. While the store cannot be reached nothing is decided."""
        for sandbox_id, push_id in self.table.pushes().items():
            try:
                found = await asyncio.to_thread(self.objects.read_document, f"sandboxes/{sandbox_id}.json")
            except StoreUnreachable as exc:
                log.warning("push of %s not settled (the store is unreachable: %s)", sandbox_id, exc)
                continue
            if found is not None and found[0].get("push_id") == push_id:
                info = self.service.record(sandbox_id)
                await self._leave(info, self.objects.url(f"sandboxes/{sandbox_id}.json"))
                log.info("settled push of %s: the store has it", sandbox_id)
            else:
                self.table.end_push(sandbox_id)
                log.info("settled push of %s: it never reached the store; it stays here", sandbox_id)

    def unsettled(self, sandbox_id: str) -> bool:
        return sandbox_id in self.table.pushes()

    # ------------------------------------------------------------ helpers

    def _volumes(self) -> VolumeTransfers:
        if self.volumes is None:
            raise Unsupported("this daemon keeps no volumes")
        return self.volumes

    async def _leave(self, info: SandboxInfo, url: str) -> None:
        """The store owns it now: remove this node's copy (a restart finishes this if cut off)."""
        await self.service.leave(info, moved_to=url)
        self.table.end_push(info.id)

    def _local(self, sandbox_id: str) -> SandboxInfo | None:
        try:
            return self.service.record(sandbox_id)
        except NotFound:
            return None

    async def _find(self, kind: str, ref: str) -> tuple[str, tuple[Manifest, str]]:
        """(its manifest's key, (the manifest, its ETag)) of the sandbox or checkpoint a name or id stands for."""
        if not NAME_PATTERN.fullmatch(ref) or ".." in ref:  # it becomes part of an object key
            raise InvalidRequest(f"{ref[:80]!r} is not a sandbox or checkpoint name or id")
        try:
            artifact_id = (await asyncio.to_thread(self.objects.get, f"names/{FOLDERS[kind]}/{ref}")).decode()
        except NotFound:
            artifact_id = ref
        key = f"{FOLDERS[kind]}/{artifact_id}.json"
        found = await asyncio.to_thread(self.objects.read_document, key)
        if found is None:
            missing = SandboxNotFound if kind == "sandbox" else CheckpointNotFound
            raise missing(f"no {kind} named or with id {ref[:80]!r} here or in the remote store {self.config.url}")
        return key, (Manifest.parse(found[0], self.objects.url(key)), found[1])

    def _check_runnable(self, manifest: Manifest) -> None:
        """Refuse before taking anything: the backend must be here, and the exact image build."""
        service = self.service
        backend = manifest.backend
        try:
            service.available(backend)
        except Unsupported as exc:
            raise Unsupported(f"{manifest.kind} {manifest.id} needs the {backend} backend: {exc}") from None
        image = manifest.image
        try:
            service.images.rootfs_by_key(image.key)
        except StasisError:
            raise InvalidRequest(
                f"{manifest.kind} {manifest.name or manifest.id} runs on image {image.ref!r}, build "
                f"{image.key[:16]}, which this node does not have; import or build that same image here "
                "(`stasis image import` / `stasis image build`), then pull again"
            ) from None

    def _manifest(
        self, kind: str, artifact_id: str, name: str | None, backend: str, image_key: str, image_ref: str,
        runtime: dict[str, Any], record: dict[str, Any], files: dict[str, Any], externals: list[str],
    ) -> Manifest:  # fmt: skip
        return Manifest(
            format=FORMAT, kind=kind, id=artifact_id, name=name, backend=backend, runtime=runtime,  # type: ignore[arg-type]
            image=ImageRef(ref=image_ref, key=image_key), record=record, files=files, externals=externals,
            pushed_by=self.node, pushed_at=time.time(),
        )  # fmt: skip

    async def _download(self, manifest: Manifest, dest: Path) -> Transfer:
        transfer = await asyncio.to_thread(self.chunks.download_tree, manifest.files, dest)
        await self.service.available(manifest.backend).rebind(dest, manifest.externals, self._fetch_external)
        return transfer

    async def _push_externals(self, backend: str, directory: Path) -> list[str]:
        """What the files depend on outside their directory (a microVM's base disk), each sent once for every
        node under its content's identity; their keys, for the manifest."""
        found = await self.service.available(backend).externals(directory)
        for external in found:
            await self._push_external(external)
        return [external.key for external in found]

    async def _push_external(self, external: External) -> None:
        key = f"externals/{hostpath.child(self.externals, external.key, 'external', EXTERNAL_KEY).name}.json"
        if await asyncio.to_thread(self.objects.exists, key):
            return
        with tempfile.TemporaryDirectory(dir=external.path.parent, prefix=".push-") as staging:
            os.link(external.path, Path(staging) / "file")
            section, transfer = await asyncio.to_thread(self.chunks.upload_tree, Path(staging))
        await asyncio.to_thread(self.objects.put, key, json.dumps({"key": external.key, "files": section}).encode())
        log.info("pushed %s: %s", external.key, transfer.as_dict())

    async def _fetch_external(self, key: str) -> Path:
        """This node's fetched copy of an external the store holds (fetched now if it has none)."""
        folder = hostpath.child(self.externals, key, "external", EXTERNAL_KEY)
        if (folder / "file").is_file():
            return folder / "file"
        document = json.loads(await asyncio.to_thread(self.objects.get, f"externals/{key}.json"))
        self.externals.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self.chunks.download_tree, document["files"], folder)
        return folder / "file"

    def _result(
        self, kind: str, artifact_id: str, name: str | None, key: str, transfer: Transfer, owner: str | None = None
    ) -> TransferResult:
        return TransferResult(kind=kind, id=artifact_id, name=name, url=self.objects.url(key), owner=owner,
                              **{k: v for k, v in transfer.as_dict().items()})  # fmt: skip


def _check_id(artifact_id: str, pattern: re.Pattern[str], key: str) -> None:
    """An id from the store names a directory here: only one of ours."""
    if not pattern.fullmatch(artifact_id):
        raise CheckpointCorrupt(f"{key} names {artifact_id[:80]!r}, which is not an id stasis makes; refused")
