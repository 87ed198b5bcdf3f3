"""microVM backend: each sandbox is a QEMU `microvm` machine running a real Linux kernel.

Directory of one sandbox::

    disk.qcow2        its root disk: a qcow2 overlay on the image's shared, read-only ext4
    memory.ram        its RAM (mapped shared by QEMU: the live memory *is* this file)
    vm.json           the machine QEMU was started as, and its exact command line; a resume uses the same
    console.log       the guest's serial console
    suspend/vmstate   device state of a sealed suspend; suspend.partial/ while written

Sockets and the pidfile live in the runtime dir (tmpfs): a host reboot forgets them.

Suspend = QMP stop, save the device state (RAM stays in its file), quit QEMU, fsync.
Resume = start QEMU with the same machine and ``-incoming``, load the state, cont.
Create = restore a copy of a template (see :mod:`.templates`), then give the copy its
own hostname, machine id, clock and a reseeded kernel RNG.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

from ... import faults
from ...errors import BackendError, Incompatible, InvalidRequest, StartupError
from ...fsutil import atomic_write
from ...guest import protocol as P
from ...guest.client import GuestChannel
from ...images.runtime import agent_runtime
from ...models import SandboxSpec
from ...network import namespaces
from ...network.namespaces import Device, SandboxNet
from ...paths import Paths
from ..base import BackendState, BoxRef, External, Fetch, FromCheckpoint, HostState
from ..suspend_image import SuspendImage
from . import portable, qemu
from .accel import Accelerator, choose_accelerator, tsc_khz
from .artifacts import BootFiles, boot_files, root_disk
from .boot_snapshots import SNAPSHOT_VM_PREFIX, BootSnapshots
from .files import copy_file, grow_disk
from .qemu import Machine, VmFiles

log = logging.getLogger(__name__)

BOOT_TIMEOUT = 90.0  # a cold boot on TCG takes ~3 s; a loaded CI host, much longer
RESTORE_TIMEOUT = 90.0  # a restore answers in ~1 s; on a loaded CI host its cold TCG cache took >30 s


class MicrovmState(BackendState):
    qemu_version: str
    accelerator: str
    accelerator_reason: str = ""
    boot_key: str = ""
    cpus: int
    memory_mb: int
    template: str = ""


class MicrovmBackend:
    name: ClassVar[str] = "microvm"
    network_device: ClassVar[Device] = "tap"
    sets_identity: ClassVar[bool] = True

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.binary = qemu.find_qemu()
        self.cache = paths.images / "microvm"
        self.vm_runtime = paths.runtime / "vm"
        self.version = "unknown"
        self.boot: BootFiles | None = None
        self.accel = Accelerator("tcg", "not probed yet")
        self.tsc_khz = 0
        spares = paths.home / "microvm-spares"
        self.boot_snapshots = BootSnapshots(self.cache, spares, self._launch, self._connect_booted)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        await self._initialize()
        yield  # nothing of the host to undo: a VM's files are its own

    async def _initialize(self) -> None:
        self.version = await qemu.qemu_version(self.binary)
        self.boot = await asyncio.to_thread(boot_files, self.cache)
        cache = self.paths.home / "microvm-accelerator.json"
        self.accel = await choose_accelerator(self.binary, self.version, self.boot.kernel, self.boot.initramfs, cache)
        self.tsc_khz = tsc_khz()
        self.vm_runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.boot_snapshots.spares.mkdir(parents=True, exist_ok=True)

    def describe(self, state: dict[str, Any] | None = None) -> dict[str, Any]:
        if state is not None:
            return MicrovmState.model_validate(state).model_dump() if state else {}
        return {
            "backend": self.name,
            "qemu_version": self.version,
            "accelerator": self.accel.name,
            "accelerator_reason": self.accel.reason,
            "kernel": str(self.boot.kernel) if self.boot else "",
        }

    # ------------------------------------------------------------ layout

    def _files(self, vm_id: str, directory: Path) -> VmFiles:
        return VmFiles(directory, self.vm_runtime / vm_id)

    def _box_files(self, box: BoxRef) -> VmFiles:
        return self._files(box.id, box.directory)

    @staticmethod
    def _image(box: BoxRef) -> SuspendImage:
        return SuspendImage(box.directory, "vmstate")

    def _machine(self, spec: SandboxSpec, hostname: str, python: str = "/usr/bin/python3") -> Machine:
        assert self.boot is not None, "initialize() first"
        cmdline = " ".join(
            [
                "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init",
                f"tsc_early_khz={self.tsc_khz}" if self.accel.name == "tcg" else "",
                f"stasis.hostname={hostname}",
                "stasis.fence",  # the agent grows / to its disk and fences commands into a cgroup
                "stasis.net" if spec.network else "",  # its init configures eth0
                f"stasis.python={python}" if python != "/usr/bin/python3" else "",  # the image's, for the agent
            ]
        )
        return Machine(
            accel=self.accel.name,
            cpus=vcpus(spec),
            memory_mb=spec.memory_mb,
            kernel=str(self.boot.kernel),
            initramfs=str(self.boot.initramfs),
            cmdline=" ".join(cmdline.split()),
            network=spec.network is not None,
        )

    @staticmethod
    def _python(box: BoxRef) -> str:
        """The image's python3 for the agent, or "bundled": stasis's own, put on the image's base disk."""
        return box.python or "bundled"

    @staticmethod
    def _stored_machine(directory: Path) -> Machine:
        try:
            return Machine(**json.loads((directory / "vm.json").read_text())["machine"])
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise Incompatible(
                f"the machine description {directory / 'vm.json'} is missing or damaged: {exc!r}"
            ) from exc

    def _state(self, machine: Machine, template: str = "") -> MicrovmState:
        """What a restore of this sandbox's memory needs to match."""
        assert self.boot is not None
        return MicrovmState(
            qemu_version=self.version,
            accelerator=machine.accel,
            accelerator_reason=self.accel.reason if machine.accel == self.accel.name else "",
            boot_key=self.boot.key,
            cpus=machine.cpus,
            memory_mb=machine.memory_mb,
            template=template,
        )

    def _check_restorable(self, state: dict[str, Any], machine: Machine, what: str, instead: str) -> None:
        """A saved VM loads only into the QEMU build that saved it, with the kernel it booted."""
        if state.get("qemu_version") != self.version:
            raise Incompatible(
                f"{what} was saved by QEMU {state.get('qemu_version')} but this host has QEMU {self.version}; "
                f"reinstall that QEMU build to restore it, or {instead}"
            )
        if not Path(machine.kernel).exists():
            raise Incompatible(f"{what} needs the kernel {machine.kernel}, which is gone; {instead}")

    # ------------------------------------------------------------ booting

    async def _launch(self, vm_id: str, directory: Path, machine: Machine, incoming: bool) -> VmFiles:
        files = self._files(vm_id, directory)
        name = f"stasis-{vm_id}"
        # What is kept is the machine's command line; a restore adds `-S -incoming defer` to it.
        stored = {"machine": machine.to_json(), "argv": qemu.command_line(self.binary, machine, files, name, False)}
        description, path = json.dumps(stored, indent=1).encode(), directory / "vm.json"
        if not path.exists() or path.read_bytes() != description:  # not on every resume: an fsync saved
            atomic_write(path, description)
        netns = None
        if machine.network:  # made by the daemon for a sandbox; a template's is made here, for its one boot
            net = self._net(vm_id)
            if vm_id.startswith(SNAPSHOT_VM_PREFIX):
                await namespaces.create(net, "tap")
            netns = net.gateway_path
        await qemu.launch(qemu.command_line(self.binary, machine, files, name, incoming), files, netns)
        return files

    def _net(self, vm_id: str) -> SandboxNet:
        return SandboxNet(self.paths.runtime.name, vm_id)

    async def _connect_booted(self, files: VmFiles, label: str) -> GuestChannel:
        return await self._connect(files, label, BOOT_TIMEOUT)

    async def _connect(
        self, files: VmFiles, label: str, timeout: float, first: P.Operation[Any] | None = None
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
                await channel.call(first or P.Health(), timeout=max(0.5, min(left, 5.0)))
                return channel
            except Exception as exc:
                await channel.close()
                if time.monotonic() >= deadline:
                    why = f"{label}: the agent did not answer in {timeout:.0f}s{_console_tail(files)}"
                    raise StartupError(why) from exc

    async def _cold_boot(self, box: BoxRef, new_identity: bool) -> GuestChannel:
        """Boot the kernel on the sandbox's disk (which must exist), with fresh, empty RAM."""
        machine = self._machine(box.spec, box.hostname, self._python(box))
        files = self._box_files(box)
        files.memory.unlink(missing_ok=True)
        await self._launch(box.id, box.directory, machine, incoming=False)
        try:
            channel = await self._connect(files, f"sandbox {box.id}", BOOT_TIMEOUT)
            await channel.call(self._identity(box, new_identity))
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
            identity = self._identity(box, new_identity)
            return await self._connect(files, f"sandbox {box.id}", RESTORE_TIMEOUT, identity)
        except BaseException:
            await qemu.kill(files)
            raise

    @staticmethod
    def _identity(box: BoxRef, new_identity: bool | None) -> P.SetIdentity:
        """The guest's clock is wherever it was saved; a copy of someone else's memory also needs its own
        hostname, machine id and RNG state. The call is idempotent: sending it twice is harmless."""
        identity = P.SetIdentity(time=time.time())
        if new_identity is not None:
            identity.hostname = box.hostname
        if new_identity:
            identity.machine_id = uuid.uuid4().hex
            identity.entropy = base64.b64encode(os.urandom(64)).decode()
        return identity

    # ------------------------------------------------------------ lifecycle

    async def start(self, box: BoxRef, source: FromCheckpoint | None = None) -> tuple[GuestChannel, MicrovmState]:
        if source is not None:
            return await self._start_from(box, source.directory, source.memory, source.state)
        files = self._box_files(box)
        box.directory.mkdir(parents=True, exist_ok=True)
        if files.disk.exists():  # its own files already (a failed sandbox booting again): a real boot
            channel = await self._cold_boot(box, new_identity=False)
            return channel, self._state(self._stored_machine(box.directory), box.state.get("template", ""))
        assert self.boot is not None
        own = agent_runtime(self.paths.images) if self._python(box) == "bundled" else None
        base = await root_disk(self.cache, box.image_key, box.image_rootfs, own)
        if (needed := base.stat().st_size) > box.spec.disk_mb << 20:
            raise InvalidRequest(
                f"image {box.spec.image!r} needs a disk of at least {needed >> 20} MiB on a microVM; "
                "ask for a bigger disk_mb"
            )
        machine = self._machine(box.spec, "stasis-template", self._python(box))
        identity = [
            self.boot.key, box.image_key, self.version, self.accel.name, machine.cpus, machine.memory_mb,
            box.spec.disk_mb, base.name, *(["network"] if machine.network else []),
        ]  # fmt: skip
        key = BootSnapshots.key(identity)
        try:
            template = await self.boot_snapshots.get(key, base, machine, box.spec.disk_mb)
        finally:
            if machine.network:
                await namespaces.remove(self._net(SNAPSHOT_VM_PREFIX + key[:12]))
        await self.boot_snapshots.copy_into(template, box.directory, files.disk, files.memory)
        machine = self._stored_machine(template)
        channel = await self._restore(box, machine, template / "vmstate", True, "microvm.start.after_restore")
        return channel, self._state(machine, template.name)

    async def _start_from(
        self, box: BoxRef, source: Path, memory: bool, source_state: dict[str, Any]
    ) -> tuple[GuestChannel, MicrovmState]:
        files = self._box_files(box)
        box.directory.mkdir(parents=True, exist_ok=True)
        if not memory:
            await copy_file(source / "disk.qcow2", files.disk)
            await grow_disk(files.disk, box.spec.disk_mb)
            channel = await self._cold_boot(box, new_identity=True)
            return channel, self._state(self._stored_machine(box.directory))
        machine = self._stored_machine(source)
        self._check_restorable(source_state, machine, "this checkpoint", "make a FILESYSTEM checkpoint")
        if vcpus(box.spec) != machine.cpus:
            raise InvalidRequest(f"a MEMORY checkpoint of a microVM restores with the {machine.cpus} CPUs it had")
        await copy_file(source / "disk.qcow2", files.disk)
        await copy_file(source / "memory.ram", files.memory)
        channel = await self._restore(box, machine, source / "vmstate", new_identity=True)
        return channel, self._state(machine)

    async def connect(self, box: BoxRef) -> GuestChannel:
        files = self._box_files(box)
        async with qemu.qmp(files) as client:
            if await qemu.status(client) != "running":  # a suspend or checkpoint was cut off mid-way
                await qemu.execute(client, "cont")
        self._image(box).discard()  # it runs: any suspend image is stale
        return await self._connect(files, f"sandbox {box.id}", RESTORE_TIMEOUT)

    async def suspend(self, box: BoxRef, channel: GuestChannel) -> None:
        files, image = self._box_files(box), self._image(box)
        await channel.call(P.Sync(), timeout=60)
        partial = image.begin()
        try:
            async with qemu.qmp(files) as client:
                seconds = await qemu.save_state(client, partial / "vmstate")
                faults.point("microvm.suspend.after_save")
                await qemu.quit_vm(client, files)
        except BaseException:
            if qemu.running_pid(files) is not None:  # not quit yet: it goes on, the image is worthless
                image.discard_partial()
                with contextlib.suppress(BackendError):
                    async with qemu.qmp(files) as client:
                        await qemu.execute(client, "cont")
            raise
        await channel.close()
        faults.point("microvm.suspend.after_quit")
        started = time.monotonic()
        await asyncio.to_thread(image.seal, files.memory, files.disk)
        faults.point("microvm.suspend.after_rename")
        shutil.rmtree(files.runtime, ignore_errors=True)
        log.info("saved %s in %.3fs, fsync %.3fs", box.id, seconds, time.monotonic() - started)

    async def resume(self, box: BoxRef) -> GuestChannel:
        image = self._image(box)
        salvaging = image.seal_unsealed()  # QEMU quit after saving but the state was never sealed
        if not image.sealed:
            raise BackendError(f"sandbox {box.id} has no suspend image to resume from")
        try:
            await qemu.kill(self._box_files(box))  # a QEMU left by an interrupted resume
            machine = self._stored_machine(box.directory)
            self._check_restorable(box.state, machine, f"sandbox {box.id}", "remove it (`stasis rm`)")
            channel = await self._restore(box, machine, image.final / "vmstate", None, "microvm.resume.after_load")
        except BaseException:
            if salvaging:
                log.warning("could not salvage sandbox %s from its unsealed suspend image", box.id)
                image.discard()
            raise
        image.discard()  # the guest runs on from here: its memory file moved on, never load this again
        return channel

    async def host_state(self, box: BoxRef) -> HostState:
        if qemu.running_pid(self._box_files(box)) is not None:
            return HostState.RUNNING
        return self._image(box).host_state()

    async def host_pid(self, box: BoxRef) -> int | None:
        return qemu.running_pid(self._box_files(box))

    def stop_reason(self, box: BoxRef) -> str:
        tail = _console_tail(self._box_files(box))
        return f"QEMU exited unexpectedly{tail}; resume it to boot it again with its files"

    async def stop(self, box: BoxRef, remove: bool = False) -> None:
        await qemu.kill(self._box_files(box))
        if remove and box.directory.exists():
            await asyncio.to_thread(shutil.rmtree, box.directory)

    async def externals(self, directory: Path) -> list[External]:
        return await portable.externals(directory)

    async def rebind(self, directory: Path, needs: list[str], fetch: Fetch) -> None:
        await portable.rebind(directory, needs, fetch, self.cache, self.boot)

    async def sweep(self, known_ids: set[str]) -> list[str]:
        running = {path.name for path in self.vm_runtime.iterdir()} if self.vm_runtime.exists() else set()
        reaped = sorted(i for i in running if i not in known_ids)  # includes templates a killed daemon was building
        for vm_id in reaped:
            log.warning("reaping QEMU %s that no live sandbox owns", vm_id)
            await qemu.kill(self._files(vm_id, self.paths.sandboxes / vm_id))
        return reaped

    # ------------------------------------------------------------ checkpoints

    async def checkpoint(self, box: BoxRef, channel: GuestChannel, dest: Path, memory: bool) -> None:
        """``dest/disk.qcow2`` (and for MEMORY ``memory.ram`` + ``vmstate``) of one stopped instant."""
        files = self._box_files(box)
        await channel.call(P.Sync(), timeout=60)
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


def vcpus(spec: SandboxSpec) -> int:
    """A VM has whole CPUs: a fractional share rounds up."""
    return max(1, math.ceil(spec.cpus))


def _console_tail(files: VmFiles) -> str:
    with contextlib.suppress(OSError):
        lines = files.console.read_text(errors="replace").strip().splitlines()[-3:]
        if lines:
            return f" (console: {' | '.join(lines)}; log: {files.console})"
    return ""
