"""microVM backend: each sandbox is a QEMU `microvm` machine running a real Linux kernel.

Directory of one sandbox::

    disk.qcow2        its root disk: a qcow2 overlay on the image's shared, read-only ext4
    memory.ram        its RAM (mapped shared by QEMU: the live memory *is* this file)
    vm.json           the machine QEMU was started as, and its exact command line; a resume uses the same
    console.log       the guest's serial console
    suspend/vmstate   device state of a complete suspend; suspend.partial/ while written

Sockets and the pidfile live in the runtime dir (tmpfs): a host reboot forgets them.

Suspend = QMP stop, save the device state (RAM stays in its file), quit QEMU, fsync.
Resume = start QEMU with the same machine and ``-incoming``, load the state, cont.
Create = restore a copy of a *template*: the image booted once and saved right after
its agent came up, so a new sandbox does not pay the kernel boot. Each one is then
given its own hostname, machine id, clock and a reseeded kernel RNG. A *spare* copy
of the template's files is kept ready (files only, no process), so a create renames
it instead of copying, and the next spare is copied in the background.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from ... import faults, procs
from ...errors import BackendError, StartupError, StateError
from ...fsutil import atomic_write, fsync_dir, fsync_file, fsync_tree
from ...guest.channel import GuestChannel
from ...models import SandboxSpec
from ...paths import Paths
from ..base import BoxRef, HostState
from . import qemu
from .accel import Accelerator, choose_accelerator, tsc_khz
from .artifacts import BootFiles, boot_files, root_disk
from .qemu import Machine, VmFiles

log = logging.getLogger(__name__)

BOOT_TIMEOUT = 90.0  # a cold boot on TCG takes ~3 s; a loaded CI host, much longer
RESTORE_TIMEOUT = 30.0
TEMPLATE_FORMAT = 2  # bump when what a template contains changes


class MicrovmBackend:
    name = "microvm"

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.binary = qemu.find_qemu()
        self.cache = paths.images / "microvm"
        self.vm_runtime = paths.runtime / "vm"
        self.version = "unknown"
        self.boot: BootFiles | None = None
        self.accel = Accelerator("tcg", "not probed yet")
        self.tsc_khz = 0
        self._template_locks: dict[str, asyncio.Lock] = {}
        self.spares = paths.home / "microvm-spares"
        self._refills: dict[str, asyncio.Task[None]] = {}

    async def initialize(self) -> None:
        self.version = await qemu.qemu_version(self.binary)
        self.boot = await asyncio.to_thread(boot_files, self.cache)
        cache = self.paths.home / "microvm-accelerator.json"
        self.accel = await choose_accelerator(self.binary, self.version, self.boot.kernel, self.boot.initramfs, cache)
        self.tsc_khz = tsc_khz()
        self.vm_runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.spares.mkdir(parents=True, exist_ok=True)

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "qemu_version": self.version,
            "accelerator": self.accel.name,
            "accelerator_reason": self.accel.reason,
            "kernel": str(self.boot.kernel) if self.boot else "",
        }

    # ------------------------------------------------------------ layout

    def _files(self, box_id: str, directory: Path) -> VmFiles:
        return VmFiles(directory, self.vm_runtime / box_id)

    def _box_files(self, box: BoxRef) -> VmFiles:
        return self._files(box.id, box.directory)

    def _machine(self, spec: SandboxSpec, hostname: str) -> Machine:
        assert self.boot is not None, "initialize() first"
        cmdline = " ".join(
            [
                "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init",
                f"tsc_early_khz={self.tsc_khz}" if self.accel.name == "tcg" else "",
                f"stasis.hostname={hostname}",
            ]
        )
        return Machine(
            accel=self.accel.name,
            cpus=vcpus(spec),
            memory_mb=spec.memory_mb,
            kernel=str(self.boot.kernel),
            initramfs=str(self.boot.initramfs),
            cmdline=" ".join(cmdline.split()),
        )

    @staticmethod
    def _stored_machine(directory: Path) -> Machine:
        try:
            return Machine(**json.loads((directory / "vm.json").read_text())["machine"])
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise StateError(f"the machine description {directory / 'vm.json'} is missing or damaged: {exc!r}") from exc

    def _state(self, machine: Machine) -> dict[str, Any]:
        """What a restore of this sandbox's memory needs to match."""
        assert self.boot is not None
        return {
            "qemu_version": self.version,
            "accelerator": machine.accel,
            "accelerator_reason": self.accel.reason if machine.accel == self.accel.name else "",
            "boot_key": self.boot.key,
            "cpus": machine.cpus,
            "memory_mb": machine.memory_mb,
        }

    def _check_restorable(self, state: dict[str, Any], machine: Machine, what: str, instead: str) -> None:
        """A saved VM loads only into the QEMU build that saved it, with the kernel it booted."""
        if state.get("qemu_version") != self.version:
            raise StateError(
                f"{what} was saved by QEMU {state.get('qemu_version')} but this host has QEMU {self.version}; "
                f"reinstall that QEMU build to restore it, or {instead}"
            )
        if not Path(machine.kernel).exists():
            raise StateError(f"{what} needs the kernel {machine.kernel}, which is gone; {instead}")

    # ------------------------------------------------------------ booting

    async def _launch(self, box_id: str, directory: Path, machine: Machine, incoming: bool) -> VmFiles:
        files = self._files(box_id, directory)
        name = f"stasis-{box_id}"
        # What is kept is the machine's command line; a restore adds `-S -incoming defer` to it.
        stored = {"machine": machine.to_json(), "argv": qemu.command_line(self.binary, machine, files, name, False)}
        description, path = json.dumps(stored, indent=1).encode(), directory / "vm.json"
        if not path.exists() or path.read_bytes() != description:  # not on every resume: an fsync saved
            atomic_write(path, description)
        await qemu.launch(qemu.command_line(self.binary, machine, files, name, incoming), files)
        return files

    async def _connect(
        self, files: VmFiles, label: str, timeout: float, first: tuple[str, dict[str, Any]] = ("health", {})
    ) -> GuestChannel:
        """Connect to the agent's port, retrying while the guest boots, until ``first`` is answered.

        After a restore the first guest work runs through a cold TCG translation cache
        (a new QEMU process), so every round trip saved there counts.
        """
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if qemu.running_pid(files) is None:
                raise StartupError(f"{label}: QEMU exited{_console_tail(files)}")
            try:
                channel = await GuestChannel.open_unix(files.agent, label)
            except OSError as exc:
                if left <= 0:
                    raise StartupError(f"{label}: cannot connect to the agent port: {exc}") from exc
                await asyncio.sleep(0.01)
                continue
            try:
                await channel.call(*first, timeout=max(0.5, min(left, 5.0)))
                return channel
            except Exception as exc:
                await channel.close()
                if time.monotonic() >= deadline:
                    why = f"{label}: the agent did not answer in {timeout:.0f}s{_console_tail(files)}"
                    raise StartupError(why) from exc

    async def _cold_boot(self, box: BoxRef, new_identity: bool) -> GuestChannel:
        """Boot the kernel on the sandbox's disk (which must exist), with fresh, empty RAM."""
        machine = self._machine(box.spec, box.hostname)
        files = self._box_files(box)
        files.memory.unlink(missing_ok=True)
        await self._launch(box.id, box.directory, machine, incoming=False)
        try:
            channel = await self._connect(files, f"sandbox {box.id}", BOOT_TIMEOUT)
            await channel.call("identity", self._identity(box, new_identity))
            return channel
        except BaseException:
            await qemu.kill(files)
            raise

    async def _restore(
        self, box: BoxRef, machine: Machine, vmstate: Path, new_identity: bool | None, after_load: str | None = None
    ) -> GuestChannel:
        """Start QEMU from saved state; ``new_identity`` None keeps hostname and machine id."""
        files = await self._launch(box.id, box.directory, machine, incoming=True)
        try:
            async with qemu.qmp(files) as client:
                seconds = await qemu.load_state(client, vmstate)
            log.debug("loaded VM state of %s in %.3fs", box.id, seconds)
            if after_load:
                faults.point(after_load)
            identity = ("identity", self._identity(box, new_identity))
            return await self._connect(files, f"sandbox {box.id}", RESTORE_TIMEOUT, identity)
        except BaseException:
            await qemu.kill(files)
            raise

    @staticmethod
    def _identity(box: BoxRef, new_identity: bool | None) -> dict[str, Any]:
        """The guest's clock is wherever it was saved; a copy of someone else's memory also needs its own
        hostname, machine id and RNG state. The call is idempotent: sending it twice is harmless."""
        args: dict[str, Any] = {"time": time.time()}
        if new_identity is not None:
            args["hostname"] = box.hostname
        if new_identity:
            args["machine_id"] = uuid.uuid4().hex
            args["entropy"] = base64.b64encode(os.urandom(64)).decode()
        return args

    # ------------------------------------------------------------ templates

    async def _template(self, spec: SandboxSpec, image_key: str, rootfs: Path) -> Path:
        """A saved VM of this image, booted once, its agent up; made on first use (one boot)."""
        assert self.boot is not None
        base = await root_disk(self.cache, image_key, rootfs)
        machine = self._machine(spec, "stasis-template")
        identity = [self.boot.key, image_key, self.version, self.accel.name, machine.cpus, machine.memory_mb]
        key = hashlib.sha256(json.dumps([TEMPLATE_FORMAT, *identity]).encode()).hexdigest()[:16]
        directory = self.cache / "templates" / key
        if (directory / "vmstate").exists():
            return directory
        async with self._template_locks.setdefault(key, asyncio.Lock()):
            directory.parent.mkdir(parents=True, exist_ok=True)
            lock_fd = os.open(directory.parent / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                await asyncio.to_thread(fcntl.flock, lock_fd, fcntl.LOCK_EX)  # other daemons share the cache
                if not (directory / "vmstate").exists():
                    await self._build_template(directory, key, base, machine)
            finally:
                os.close(lock_fd)
        return directory

    async def _build_template(self, directory: Path, key: str, base: Path, machine: Machine) -> None:
        started = time.monotonic()
        for stale in directory.parent.glob(f".{key}.*"):  # we hold the lock: whoever made these is gone
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=directory.parent))
        files = self._files(f"template-{key[:12]}", staging)
        try:
            await create_overlay(base, files.disk)
            await self._launch(files.runtime.name, staging, machine, incoming=False)
            channel = await self._connect(files, f"template {key}", BOOT_TIMEOUT)
            await channel.call("sync", timeout=60)
            await channel.close()
            async with qemu.qmp(files) as client:
                await qemu.save_state(client, staging / "vmstate")
                await qemu.quit_vm(client, files)
            await asyncio.to_thread(fsync_tree, staging)
            shutil.rmtree(directory, ignore_errors=True)
            os.rename(staging, directory)
            fsync_dir(directory.parent)
            log.info("built microVM template %s in %.1fs", key, time.monotonic() - started)
        finally:
            await qemu.kill(files)
            shutil.rmtree(staging, ignore_errors=True)

    def _take_spare(self, key: str, directory: Path) -> bool:
        """Move a ready copy of the template's files into an empty sandbox directory (one rename)."""
        try:
            os.rename(self.spares / key, directory)  # allowed onto an empty directory; atomic
        except OSError:
            return False  # none ready (or taken by a concurrent create): copy instead
        return True

    def _refill_spare(self, template: Path) -> None:
        key = template.name
        if key not in self._refills or self._refills[key].done():
            self._refills[key] = asyncio.get_running_loop().create_task(self._make_spare(template))

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

    # ------------------------------------------------------------ lifecycle

    async def start(self, box: BoxRef) -> tuple[GuestChannel, dict[str, Any]]:
        if box.spec.network:
            raise StateError("network access inside microVM sandboxes is not supported yet; create it with network off")
        files = self._box_files(box)
        box.directory.mkdir(parents=True, exist_ok=True)
        if files.disk.exists():  # its own files already (a failed sandbox booting again): a real boot
            channel = await self._cold_boot(box, new_identity=False)
            return channel, self._state(self._stored_machine(box.directory))
        image_key = str(box.backend_state.get("image_key") or box.image_rootfs.parent.name)
        template = await self._template(box.spec, image_key, box.image_rootfs)
        if not self._take_spare(template.name, box.directory):
            await copy_file(template / "disk.qcow2", files.disk)
            await copy_file(template / "memory.ram", files.memory)
        self._refill_spare(template)
        machine = self._stored_machine(template)
        channel = await self._restore(box, machine, template / "vmstate", True, "microvm.start.after_restore")
        return channel, {**self._state(machine), "template": template.name}

    async def connect(self, box: BoxRef) -> GuestChannel:
        files = self._box_files(box)
        async with qemu.qmp(files) as client:
            if await qemu.status(client) != "running":  # a suspend or checkpoint was cut off mid-way
                await qemu.execute(client, "cont")
        return await self._connect(files, f"sandbox {box.id}", RESTORE_TIMEOUT)

    async def suspend(self, box: BoxRef, channel: GuestChannel) -> None:
        files = self._box_files(box)
        partial, final = box.directory / "suspend.partial", box.directory / "suspend"
        await channel.call("sync", timeout=60)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        async with qemu.qmp(files) as client:
            seconds = await qemu.save_state(client, partial / "vmstate")
            faults.point("microvm.suspend.after_save")
            await qemu.quit_vm(client, files)
        await channel.close()
        faults.point("microvm.suspend.after_quit")
        started = time.monotonic()
        await asyncio.to_thread(_fsync_all, files.memory, files.disk, partial / "vmstate")
        fsync_dir(partial)
        os.rename(partial, final)
        fsync_dir(box.directory)
        faults.point("microvm.suspend.after_rename")
        shutil.rmtree(files.runtime, ignore_errors=True)
        log.info("saved %s in %.3fs, fsync %.3fs", box.id, seconds, time.monotonic() - started)

    async def resume(self, box: BoxRef) -> GuestChannel:
        vmstate = box.directory / "suspend" / "vmstate"
        if not vmstate.exists():
            raise StateError(f"sandbox {box.id} has no suspend image to resume from")
        await qemu.kill(self._box_files(box))  # a QEMU left by an interrupted resume
        machine = self._stored_machine(box.directory)
        self._check_restorable(box.backend_state, machine, f"sandbox {box.id}", "remove it (`stasis rm`)")
        channel = await self._restore(box, machine, vmstate, None, "microvm.resume.after_load")
        # The guest runs on from here: its memory file moved on, the image must never be loaded again.
        await self.discard_suspend_image(box)
        return channel

    async def host_state(self, box: BoxRef) -> HostState:
        if qemu.running_pid(self._box_files(box)) is not None:
            return HostState.RUNNING
        if (box.directory / "suspend" / "vmstate").exists():
            return HostState.SUSPENDED
        return HostState.STOPPED

    async def salvage(self, box: BoxRef) -> GuestChannel | None:
        """QEMU quit after saving but the state was not sealed: it is complete if loading it works."""
        partial, final = box.directory / "suspend.partial", box.directory / "suspend"
        if not (partial / "vmstate").exists():
            return None
        shutil.rmtree(final, ignore_errors=True)
        os.rename(partial, final)
        try:
            return await self.resume(box)
        except Exception as exc:
            log.warning("could not salvage sandbox %s from its unsealed suspend image: %s", box.id, exc)
            shutil.rmtree(final, ignore_errors=True)
            return None

    async def discard_suspend_image(self, box: BoxRef) -> None:
        shutil.rmtree(box.directory / "suspend", ignore_errors=True)

    async def discard_partial(self, box: BoxRef) -> None:
        shutil.rmtree(box.directory / "suspend.partial", ignore_errors=True)

    async def stop(self, box: BoxRef) -> None:
        await qemu.kill(self._box_files(box))

    async def destroy(self, box: BoxRef) -> None:
        await self.stop(box)
        if box.directory.exists():
            await asyncio.to_thread(shutil.rmtree, box.directory)

    async def leftovers(self, known_ids: set[str]) -> list[str]:
        running = {path.name for path in self.vm_runtime.iterdir()} if self.vm_runtime.exists() else set()
        return sorted(i for i in running if i not in known_ids)  # includes templates a killed daemon was building

    async def delete_container(self, sandbox_id: str) -> None:
        await qemu.kill(self._files(sandbox_id, self.paths.sandboxes / sandbox_id))

    # ------------------------------------------------------------ checkpoints

    async def checkpoint(self, box: BoxRef, channel: GuestChannel, dest: Path, memory: bool) -> None:
        """``dest/disk.qcow2`` (and for MEMORY ``memory.ram`` + ``vmstate``) of one stopped instant."""
        files = self._box_files(box)
        await channel.call("sync", timeout=60)
        async with qemu.qmp(files) as client:
            if memory:
                await qemu.save_state(client, dest / "vmstate")
            else:
                await qemu.execute(client, "stop")  # flushes the disk
            try:
                faults.point("microvm.checkpoint.after_save")
                await copy_file(files.disk, dest / "disk.qcow2")
                if memory:
                    await copy_file(files.memory, dest / "memory.ram")
                    shutil.copyfile(box.directory / "vm.json", dest / "vm.json")
            finally:
                await qemu.execute(client, "cont")

    async def start_from(
        self, box: BoxRef, source: Path, memory: bool, source_state: dict[str, Any]
    ) -> tuple[GuestChannel, dict[str, Any]]:
        files = self._box_files(box)
        box.directory.mkdir(parents=True, exist_ok=True)
        if not memory:
            await copy_file(source / "disk.qcow2", files.disk)
            channel = await self._cold_boot(box, new_identity=True)
            return channel, self._state(self._stored_machine(box.directory))
        machine = self._stored_machine(source)
        self._check_restorable(source_state, machine, "this checkpoint", "make a FILESYSTEM checkpoint")
        if vcpus(box.spec) != machine.cpus:
            raise StateError(f"a MEMORY checkpoint of a microVM restores with the {machine.cpus} CPUs it had")
        await copy_file(source / "disk.qcow2", files.disk)
        await copy_file(source / "memory.ram", files.memory)
        channel = await self._restore(box, machine, source / "vmstate", new_identity=True)
        return channel, self._state(machine)


def vcpus(spec: SandboxSpec) -> int:
    """A VM has whole CPUs: a fractional share rounds up."""
    return max(1, math.ceil(spec.cpus))


async def create_overlay(base: Path, disk: Path) -> None:
    argv = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(base), str(disk)]
    result = await procs.run(argv, timeout=60)
    if result.returncode != 0:
        raise BackendError(f"qemu-img could not create {disk}: {result.output}")


async def copy_file(source: Path, dest: Path) -> None:
    """Copy keeping holes (guest RAM is mostly untouched); reflinks where the file system allows."""
    result = await procs.run(["cp", "--sparse=always", "--reflink=auto", str(source), str(dest)], timeout=3600)
    if result.returncode != 0:
        raise BackendError(f"copying {source} to {dest} failed: {result.output}")


def _fsync_all(*paths: Path) -> None:
    for path in paths:
        fsync_file(path)


def _console_tail(files: VmFiles) -> str:
    with contextlib.suppress(OSError):
        lines = files.console.read_text(errors="replace").strip().splitlines()[-3:]
        if lines:
            return f" (console: {' | '.join(lines)}; log: {files.console})"
    return ""
