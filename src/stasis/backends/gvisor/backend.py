"""gVisor backend: each sandbox is a runsc container with its own user-space kernel.

Directory of one sandbox::

    bundle/config.json   OCI spec          bundle/rootfs   overlay mount point
    disk.ext4            the sandbox's own disk (sparse, ``disk_mb``), mounted at disk/ while it runs:
    disk/upper disk/work   its writable layer (its files live here)
    disk/tmp               its /tmp (a bind mount: on its disk, not in its memory)
    to_guest.fifo from_guest.fifo          the agent's stdin/stdout (made anew at every boot)
    console.log          the agent's stderr and runsc's complaints
    suspend/             a sealed suspend image (checkpoint.img); suspend.partial/ while written

The agent's files are a read-only bind mount of a host directory per agent build
(see :mod:`.agentdir`): the daemon never writes into a sandbox's tree.

Suspend = `runsc checkpoint` (the sandbox exits), then `runsc delete`, then the
overlay and the disk are unmounted: nothing of the sandbox remains on the host but files.
Resume = remount, `runsc restore` with the same bundle and fresh FIFO fds.

Sandboxes made before they had a disk (state ``disk_mb`` 0) keep their layer in upper/ and
work/ beside the bundle, unbounded, with gVisor's own tmpfs at /tmp.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

from ... import faults, procs
from ...errors import BackendError, Incompatible, StartupError
from ...fsutil import atomic_write, check_free_space, no_space
from ...guest import agent_digest
from ...guest import protocol as P
from ...guest.client import GuestChannel
from ...images.runtime import agent_runtime
from ...network import namespaces
from ...network.namespaces import Device
from ...paths import Paths
from ...volumes import Volumes, choose_disk
from ..base import BackendState, BoxRef, External, Fetch, FromCheckpoint, HostState
from ..suspend_image import SuspendImage
from . import changes, disk, fifos, mounts
from .agentdir import agent_dir
from .bundle import oci_config
from .cgroups import memory_usage, stop_reason
from .runsc import Runsc, choose_platform, find_runsc, runsc_version, supported_flags, unsaveable
from .trees import copy_tree, remove_tree, resolv_conf

log = logging.getLogger(__name__)

READY_TIMEOUT = 30.0
# Uncompressed and without zero pages: measured 0.67 s vs 1.45 s (flate) to suspend 200 MB of live data.
PREFERRED_CHECKPOINT_FLAGS = ("--compression=none", "--exclude-committed-zero-pages")


class GvisorState(BackendState):
    runsc_version: str
    platform: str
    agent: str = ""  # the agent build mounted at /opt/stasis; "" for sandboxes made before that mount
    disk_mb: int = 0  # size of its own disk; 0 for sandboxes made before they had one
    storage: str = "durable"  # "fast": its writable layer lives in the sentry (runsc --overlay2=root:self)


class GvisorBackend:
    name: ClassVar[str] = "gvisor"
    network_device: ClassVar[Device] = "veth"
    sets_identity: ClassVar[bool] = False

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.binary = find_runsc()
        self.version = "unknown"
        self.platform = "unknown"
        self.platform_reason = ""
        self.checkpoint_flags: tuple[str, ...] = ()
        self.runsc = Runsc(self.binary, paths.runsc_root, "ptrace")
        self.agents = paths.home / "agent"

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        await self._initialize()
        try:
            yield
        finally:
            mounts.unshare_if_unused(self.paths.sandboxes)

    async def _initialize(self) -> None:
        self.version = await runsc_version(self.binary)
        cache = self.paths.runtime.parent  # host-wide: every home shares the probe
        self.platform, self.platform_reason = await choose_platform(self.binary, self.version, cache)
        self.runsc = Runsc(self.binary, self.paths.runsc_root, self.platform)
        self.runsc.root.mkdir(parents=True, exist_ok=True)
        self.checkpoint_flags = await supported_flags(self.binary, "checkpoint", PREFERRED_CHECKPOINT_FLAGS)
        await asyncio.to_thread(agent_dir, self.agents)
        mounts.share(self.paths.sandboxes)

    def describe(self, state: dict[str, Any] | None = None) -> dict[str, Any]:
        if state is not None:
            return GvisorState.model_validate(state).model_dump() if state else {}
        return {
            "backend": self.name,
            "runsc_version": self.version,
            "platform": self.platform,
            "platform_reason": self.platform_reason,
            "checkpoint_flags": " ".join(self.checkpoint_flags),
        }

    def _new_state(self, disk_mb: int, storage: str) -> GvisorState:
        return GvisorState(
            runsc_version=self.version, platform=self.platform, agent=agent_digest(), disk_mb=disk_mb, storage=storage
        )

    # ------------------------------------------------------------ layout

    @staticmethod
    def _state(box: BoxRef) -> GvisorState:
        """What this backend stored of the sandbox, typed: the one place its state is read."""
        return GvisorState.model_validate(box.state)

    def _disk_mb(self, box: BoxRef) -> int:
        """Its disk's size; a sandbox not started yet gets the one its spec asks for."""
        return self._state(box).disk_mb if box.state else box.spec.disk_mb

    def _storage(self, box: BoxRef) -> str:
        return self._state(box).storage if box.state else box.spec.storage

    def _paths(self, box: BoxRef) -> dict[str, Path]:
        d = box.directory
        layer = d / "disk" if self._disk_mb(box) else d
        return {
            "bundle": d / "bundle",
            "rootfs": d / "bundle" / "rootfs",
            "disk_image": d / "disk.ext4",
            "disk": d / "disk",
            "upper": layer / "upper",
            "work": layer / "work",
            "tmp": d / "disk" / "tmp",
            "to_guest": d / "to_guest.fifo",
            "from_guest": d / "from_guest.fifo",
            "console": d / "console.log",
        }

    @staticmethod
    def _image(box: BoxRef) -> SuspendImage:
        return SuspendImage(box.directory, "checkpoint.img")

    def _runsc_for(self, state: GvisorState, what: str, network: bool = False) -> Runsc:
        """A restore must use the runsc build and platform that made the image."""
        if state.runsc_version != self.version:
            raise Incompatible(
                f"{what} was saved by runsc {state.runsc_version} but this host has runsc {self.version}; "
                "reinstall that runsc build to restore it (or restore a FILESYSTEM checkpoint instead)"
            )
        return Runsc(self.binary, self.runsc.root, state.platform, network).with_storage(state.storage)

    # ------------------------------------------------------------ booting

    def _prepare(self, box: BoxRef, agent: str) -> dict[str, Path]:
        """The sandbox's directory and its OCI bundle (idempotent). ``agent`` "" is a sandbox from before
        the agent was a mount: its restore must see the bundle it was saved with."""
        p = self._paths(box)
        box.directory.mkdir(parents=True, exist_ok=True)
        p["bundle"].mkdir(exist_ok=True)
        agent_path = agent_dir(self.agents, agent) if agent else None
        tmp = p["tmp"] if self._disk_mb(box) else None
        netns = box.network.inner_path if box.network else None
        resolv = resolv_conf(self.paths.home) if box.network else None
        own = None if box.python else agent_runtime(self.paths.images)  # an image without python3
        image = box.image_rootfs if self._storage(box) == "fast" else None
        store = Volumes(self.paths.volumes, choose_disk(self.paths.volumes, self.paths.volume_image))
        volumes = [(m.path, store.data(m.name), m.read_only) for m in box.spec.volumes]
        config = oci_config(box.id, box.hostname, box.spec, str(p["rootfs"]), agent_path, tmp, netns, resolv,
                            box.python, own, image, volumes)  # fmt: skip
        atomic_write(p["bundle"] / "config.json", json.dumps(config, indent=1).encode())
        return p

    async def _attach_disk(self, box: BoxRef, empty_tmp: bool = False) -> None:
        """Its disk made (first boot) and mounted, with the directories on it that the sandbox uses;
        ``empty_tmp`` for a cold boot: /tmp starts empty, as a tmpfs would."""
        size = self._disk_mb(box)
        if not size:
            return
        p = self._paths(box)
        await disk.create(p["disk_image"], size)
        await disk.attach(p["disk_image"], p["disk"])
        for name in ("upper", "work"):
            p[name].mkdir(exist_ok=True)
        if empty_tmp or not p["tmp"].is_dir():
            disk.fresh_dir(p["tmp"], 0o1777)

    def _unmount(self, box: BoxRef) -> None:
        """Its root (the overlay), then its disk."""
        mounts.unmount(self._paths(box)["rootfs"])
        disk.detach(self._paths(box)["disk"])

    async def _boot(
        self,
        box: BoxRef,
        runsc: Runsc,
        args: tuple[str, ...],
        after_mount: str | None,
        after_launch: str,
        cold: bool = False,
    ) -> GuestChannel:
        """Mount the root, run runsc (`run` or, not ``cold``, `restore`), wait for the agent; on any
        failure stop again."""
        p = self._paths(box)
        try:
            await self._attach_disk(box, empty_tmp=cold)
            mounts.mount_overlay(box.image_rootfs, p["upper"], p["work"], p["rootfs"])
            if after_mount:
                faults.point(after_mount)
            if box.network is not None:  # runsc took eth0's address at the last boot: it reads it again now
                await asyncio.to_thread(namespaces.configure_inner, box.network)
                runsc = dataclasses.replace(runsc, network=True)
            await self._launch(runsc, box, *args)
            faults.point(after_launch)
            return await self._connect(box)
        except BaseException:
            await self.stop(box)
            raise

    async def _launch(self, runsc: Runsc, box: BoxRef, *args: str) -> None:
        """Start runsc with the agent's stdio on new FIFOs (O_RDWR: the agent never sees EOF).

        New FIFOs at every boot: bytes left in the old ones (a request that timed out, for an
        agent that died) must never reach the agent that boots now."""
        p = self._paths(box)
        for fifo in (p["to_guest"], p["from_guest"]):
            fifo.unlink(missing_ok=True)
            os.mkfifo(fifo, 0o600)
        stdin = os.open(p["to_guest"], os.O_RDWR)
        stdout = os.open(p["from_guest"], os.O_RDWR)
        console = os.open(p["console"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            await runsc.call(*args, stdin=stdin, stdout=stdout, stderr=console)
        except BackendError as exc:
            tail = p["console"].read_text(errors="replace").strip().splitlines()[-3:]
            raise StartupError(f"{exc}{' '.join(tail)} (log: {p['console']})") from exc
        finally:
            for fd in (stdin, stdout, console):
                os.close(fd)

    async def _connect(self, box: BoxRef) -> GuestChannel:
        p = self._paths(box)
        channel = await GuestChannel.open_fifos(p["to_guest"], p["from_guest"], f"sandbox {box.id}")
        try:
            await channel.wait_ready(READY_TIMEOUT)
        except BaseException:
            await channel.close()
            raise
        return channel

    # ------------------------------------------------------------ lifecycle

    async def start(self, box: BoxRef, source: FromCheckpoint | None = None) -> tuple[GuestChannel, GvisorState]:
        if source is not None:
            return await self._start_from(box, source.directory, source.memory, source.state)
        """A cold boot: a new sandbox, a failed one booting again on its files, a FILESYSTEM restore."""
        state = self._new_state(self._disk_mb(box), box.spec.storage)
        box = dataclasses.replace(box, state=state.model_dump())
        self._prepare(box, state.agent)
        await self.runsc.delete(box.id)  # a stale record, when booting a failed sandbox again
        runsc = Runsc(self.binary, self.runsc.root, state.platform).with_storage(state.storage)
        args = ("run", "-detach", "--bundle", str(self._paths(box)["bundle"]), box.id)
        points = ("gvisor.start.after_mount", "gvisor.start.after_launch")
        channel = await self._boot(box, runsc, args, *points, cold=True)
        return channel, state

    async def _start_from(
        self, box: BoxRef, source: Path, memory: bool, source_state: dict[str, Any]
    ) -> tuple[GuestChannel, GvisorState]:
        """A new sandbox from a checkpoint: its files, and (MEMORY) its processes where they were."""
        saved = GvisorState.model_validate(source_state)
        runsc = self._runsc_for(saved, "this checkpoint") if memory else self.runsc
        if memory:  # restored processes must find the layout (the mounts) they were saved with
            size = box.spec.disk_mb if saved.disk_mb else 0
            box = dataclasses.replace(box, state=saved.model_copy(update={"disk_mb": size}).model_dump())
        p = self._paths(box)
        box.directory.mkdir(parents=True, exist_ok=True)
        try:
            await self._attach_disk(box)
            await copy_tree(source / "files", p["upper"])
            if memory and self._disk_mb(box):
                await copy_tree(source / "tmp", p["tmp"])
            faults.point("gvisor.start_from.after_copy")
        except BaseException:
            self._unmount(box)
            raise
        if not memory:
            return await self.start(box)  # on the disk as mounted now
        self._prepare(box, saved.agent)
        args = ("restore", "--detach", "--bundle", str(p["bundle"]), "--image-path", str(source / "memory"), box.id)
        channel = await self._boot(box, runsc, args, None, "gvisor.start_from.after_restore")
        return channel, self._state(box).model_copy(update={"runsc_version": self.version})

    async def connect(self, box: BoxRef) -> GuestChannel:
        state = await self.runsc.state(box.id)
        if state is not None and state.get("status") == "paused":  # a checkpoint was cut off mid-way
            await self.runsc.call("resume", box.id)
        self._image(box).discard()  # it runs: any suspend image is stale
        return await self._connect(box)

    async def checkpoint(self, box: BoxRef, channel: GuestChannel, dest: Path, memory: bool) -> None:
        """Write ``dest/files`` (and ``dest/memory`` for a MEMORY checkpoint); the sandbox keeps running.

        The sandbox is paused while its files are copied and its memory saved, so both
        are the same instant; then it continues, none the wiser.
        """
        runsc = self._runsc_for(self._state(box), f"sandbox {box.id}", box.network is not None)
        await channel.call(P.Sync(), timeout=60)
        fast = self._storage(box) == "fast"
        if fast and not memory:  # its layer is in its kernel: read through the sandbox, which keeps running
            await changes.read_layer(channel, self._paths(box)["tmp"], dest / "files", self._disk_mb(box) << 20)
            return
        pipes = [] if memory else await fifos.listed(channel)  # a MEMORY checkpoint keeps them in its memory
        await runsc.call("pause", box.id)
        try:
            faults.point("gvisor.checkpoint.paused")
            # fast: runsc's backing file of the layer is no file of the sandbox's (its memory holds the files)
            await copy_tree(
                self._paths(box)["upper"], dest / "files", skip_prefix=changes.FILESTORE_PREFIX if fast else None
            )
            await asyncio.to_thread(fifos.add, pipes, dest / "files", box.image_rootfs)
            if memory and self._disk_mb(box):  # open files in /tmp must be there when its processes return
                await copy_tree(self._paths(box)["tmp"], dest / "tmp")
            faults.point("gvisor.checkpoint.after_files")
            if memory:
                (dest / "memory").mkdir()
                flags = self.checkpoint_flags
                try:
                    await runsc.call(
                        "checkpoint", "--leave-running", *flags, "--image-path", str(dest / "memory"), box.id
                    )
                except BackendError as exc:
                    raise unsaveable(exc, box.id, "checkpoint") from exc
                faults.point("gvisor.checkpoint.after_memory")
        finally:
            await runsc.call("resume", box.id)

    async def suspend(self, box: BoxRef, channel: GuestChannel) -> None:
        """Pause, write the image with the sandbox left in place, seal it, then remove the container.

        Until the seal the sandbox only sleeps: any failure (a full disk) resumes it as it was."""
        runsc = self._runsc_for(self._state(box), f"sandbox {box.id}", box.network is not None)
        image = self._image(box)
        check_free_space(box.directory, memory_usage(box.id), f"suspending sandbox {box.id}")
        await channel.call(P.Sync(), timeout=60)
        faults.point("gvisor.suspend.after_sync")
        partial = image.begin()
        faults.point("gvisor.suspend.before_checkpoint")
        started = time.monotonic()
        await runsc.call("pause", box.id)
        try:
            flags = ("--leave-running", *self.checkpoint_flags)
            await runsc.call("checkpoint", *flags, "--image-path", str(partial), box.id, timeout=600)
            log.info("checkpointed %s in %.3fs", box.id, time.monotonic() - started)
            faults.point("gvisor.suspend.after_checkpoint")
            await asyncio.to_thread(image.seal)
        except BaseException as exc:
            image.discard()
            await runsc.call("resume", box.id)
            if (full := no_space(exc, box.directory)) is not exc:
                raise full from exc
            if isinstance(exc, BackendError):
                raise unsaveable(exc, box.id, "suspend") from exc
            raise
        faults.point("gvisor.suspend.after_rename")
        await channel.close()
        await runsc.delete(box.id)
        faults.point("gvisor.suspend.after_delete")
        self._unmount(box)
        try:  # a busy unmount detached lazily: suspended means its disk is closed
            await disk.released(self._paths(box)["disk_image"], timeout=30)
        except BackendError as exc:
            log.warning("suspended %s, but %s", box.id, exc)

    async def resume(self, box: BoxRef) -> GuestChannel:
        image = self._image(box)
        salvaging = image.seal_unsealed()  # a suspend cut off after runsc wrote its image: it may be whole
        if not image.sealed:
            raise BackendError(f"sandbox {box.id} has no suspend image to resume from")
        state = self._state(box)
        try:
            runsc = self._runsc_for(state, f"sandbox {box.id}", box.network is not None)
            await runsc.delete(box.id)  # a stale record from an interrupted resume
            self._prepare(box, state.agent)
            faults.point("gvisor.resume.before_mount")
            p = self._paths(box)
            args = ("restore", "--detach", "--bundle", str(p["bundle"]), "--image-path", str(image.final), box.id)
            channel = await self._boot(box, runsc, args, "gvisor.resume.before_restore", "gvisor.resume.after_restore")
        except BaseException:
            if salvaging:
                log.warning("could not salvage sandbox %s from its unsealed suspend image", box.id)
                image.discard()
            raise
        image.discard()  # the files move on from here: the image must never be restored again
        return channel

    async def host_state(self, box: BoxRef) -> HostState:
        state = await self.runsc.state(box.id)
        # After a checkpoint runsc still says "running" until delete: look at the process too.
        if state is not None and state.get("status") in ("running", "paused") and procs.pid_alive(state.get("pid")):
            return HostState.RUNNING
        return self._image(box).host_state()

    async def host_pid(self, box: BoxRef) -> int | None:
        pid = self.runsc.recorded_pid(box.id)
        if pid is None:  # a record runsc changed the shape of: ask runsc
            state = await self.runsc.state(box.id)
            pid = state.get("pid") if state else None
        return pid if procs.pid_alive(pid) else None

    def stop_reason(self, box: BoxRef) -> str:
        return stop_reason(box.id, box.spec.memory_mb)

    async def stop(self, box: BoxRef, remove: bool = False) -> None:
        """Nothing of the sandbox runs or stays mounted afterwards; its files stay unless ``remove``."""
        await self.runsc.delete(box.id)
        self._unmount(box)
        if remove:
            faults.point("gvisor.destroy.after_stop")
            await asyncio.to_thread(remove_tree, box.directory)

    async def externals(self, directory: Path) -> list[External]:
        return []  # its files are whole: the image is named by key, the bundle written anew at every start

    async def rebind(self, directory: Path, needs: list[str], fetch: Fetch) -> None:
        pass  # nothing names this host's paths

    async def sweep(self, known_ids: set[str]) -> list[str]:
        reaped = [sid for sid in await self.runsc.list_ids() if sid not in known_ids]
        for sandbox_id in reaped:
            log.warning("reaping runsc container %s that no live sandbox owns", sandbox_id)
            await self.runsc.delete(sandbox_id)
        return reaped
