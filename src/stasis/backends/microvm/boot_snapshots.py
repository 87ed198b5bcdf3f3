"""microVM boot snapshots: an image booted once and saved right after its agent came up (not to be
confused with a user's warm template, :class:`stasis.Template`: that one is a MEMORY checkpoint).

A create restores a copy of a boot snapshot instead of booting a kernel. A *spare* copy
of the snapshot's files is kept ready (files only, no process), so a create renames
it instead of copying, and the next spare is copied in the background.

    <cache>/templates/<key>/   disk.qcow2 memory.ram vmstate vm.json   (shared, read-only)
    <home>/microvm-spares/<key>/   disk.qcow2 memory.ram                 (one ready copy)
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from ... import hostpath
from ...fsutil import fsync_dir, fsync_tree
from ...guest import protocol as P
from ...guest.client import GuestChannel
from . import qemu
from .files import copy_file, create_overlay
from .qemu import Machine, VmFiles

log = logging.getLogger(__name__)

TEMPLATE_FORMAT = 3  # bump when what a template contains changes
SNAPSHOT_VM_PREFIX = "template-"  # the VM id of a boot snapshot's one boot (the name on disk predates the rename)

Launch = Callable[[str, Path, Machine, bool], Awaitable[VmFiles]]
Connect = Callable[[VmFiles, str], Awaitable[GuestChannel]]


class BootSnapshots:
    def __init__(self, cache: Path, spares: Path, launch: Launch, connect: Connect) -> None:
        self.root = cache / "templates"
        self.spares = spares
        self._launch = launch
        self._connect = connect
        self._locks: dict[str, asyncio.Lock] = {}
        self._refills: dict[str, asyncio.Task[None]] = {}

    @staticmethod
    def key(identity: list[object]) -> str:
        return hashlib.sha256(json.dumps([TEMPLATE_FORMAT, *identity]).encode()).hexdigest()[:16]

    async def get(self, key: str, base: Path, machine: Machine, disk_mb: int) -> Path:
        """The template ``key`` (of ``machine`` on a ``disk_mb`` disk over ``base``), built on first use (one boot)."""
        directory = hostpath.child(self.root, key, "template key", hostpath.HEX_KEY)
        if (directory / "vmstate").exists():
            return directory
        async with self._locks.setdefault(key, asyncio.Lock()):
            self.root.mkdir(parents=True, exist_ok=True)
            lock_fd = os.open(self.root / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                await asyncio.to_thread(fcntl.flock, lock_fd, fcntl.LOCK_EX)  # other daemons share the cache
                if not (directory / "vmstate").exists():
                    await self._build(directory, key, base, machine, disk_mb)
            finally:
                os.close(lock_fd)
        return directory

    async def _build(self, directory: Path, key: str, base: Path, machine: Machine, disk_mb: int) -> None:
        started = time.monotonic()
        for stale in self.root.glob(f".{key}.*"):  # we hold the lock: whoever made these is gone
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.root))
        vm_id = f"{SNAPSHOT_VM_PREFIX}{key[:12]}"
        files: VmFiles | None = None
        try:
            await create_overlay(base, staging / "disk.qcow2", disk_mb)
            files = await self._launch(vm_id, staging, machine, False)
            channel = await self._connect(files, f"template {key}")
            await channel.call(P.Sync(), timeout=60)
            await channel.close()
            async with qemu.qmp(files) as client:
                await qemu.save_state(client, staging / "vmstate")
                await qemu.quit_vm(client, files)
            await asyncio.to_thread(fsync_tree, staging)
            shutil.rmtree(directory, ignore_errors=True)
            os.rename(staging, directory)
            fsync_dir(self.root)
            log.info("built microVM template %s in %.1fs", key, time.monotonic() - started)
        finally:
            if files is not None:
                await qemu.kill(files)
            shutil.rmtree(staging, ignore_errors=True)

    async def copy_into(self, template: Path, directory: Path, disk: Path, memory: Path) -> None:
        """The template's disk and RAM as a new sandbox's: a spare if one is ready, else a copy."""
        if not self._take_spare(template.name, directory):
            await copy_file(template / "disk.qcow2", disk)
            await copy_file(template / "memory.ram", memory)
        key = template.name
        if key not in self._refills or self._refills[key].done():
            self._refills[key] = asyncio.get_running_loop().create_task(self._make_spare(template))

    def _take_spare(self, key: str, directory: Path) -> bool:
        """Move a ready copy of the template's files into an empty sandbox directory (one rename)."""
        try:
            os.rename(self.spares / key, directory)  # allowed onto an empty directory; atomic
        except OSError:
            return False  # none ready (or taken by a concurrent create): copy instead
        return True

    async def _make_spare(self, template: Path) -> None:
        # Only this task makes this template's spares in this home: its staging dirs here were left
        # by a killed daemon. Spares of templates that are gone go too.
        for entry in self.spares.iterdir():
            stale = entry.name.startswith(f".{template.name}.")
            if stale or not (entry.name.startswith(".") or (template.parent / entry.name).exists()):
                shutil.rmtree(entry, ignore_errors=True)
        staging = self.spares / f".{template.name}.{uuid.uuid4().hex[:8]}"
        try:
            staging.mkdir()
            for name in ("disk.qcow2", "memory.ram"):
                await copy_file(template / name, staging / name)
            await asyncio.to_thread(fsync_tree, staging)  # it becomes a sandbox's memory: it must be on disk
            os.rename(staging, self.spares / template.name)
        except Exception as exc:
            log.debug("no spare for template %s: %s", template.name, exc)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
