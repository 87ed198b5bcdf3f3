"""gVisor backend: each sandbox is a runsc container with its own user-space kernel.

Directory of one sandbox::

    bundle/config.json   OCI spec          bundle/rootfs   overlay mount point
    upper/ work/         the sandbox's own writable layer (its files live here)
    to_guest.fifo from_guest.fifo          the agent's stdin/stdout
    console.log          the agent's stderr and runsc's complaints
    suspend/             a complete suspend image (checkpoint.img); suspend.partial/ while written

Suspend = `runsc checkpoint` (the sandbox exits), then `runsc delete`, then the
overlay is unmounted: nothing of the sandbox remains on the host but files.
Resume = remount, `runsc restore` with the same bundle and fresh FIFO fds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ... import faults, procs
from ...errors import BackendError, StartupError, StateError
from ...fsutil import atomic_write, fsync_dir, fsync_tree
from ...guest.channel import GuestChannel
from ...paths import Paths
from ..base import BoxRef, HostState
from . import mounts
from .bundle import AGENT_PATH, oci_config
from .runsc import Runsc, choose_platform, find_runsc, runsc_version, supported_flags

log = logging.getLogger(__name__)

AGENT_SOURCE = Path(__file__).resolve().parents[2] / "guest" / "agent.py"
READY_TIMEOUT = 30.0
# Uncompressed and without zero pages: measured 0.67 s vs 1.45 s (flate) to suspend 200 MB of live data.
PREFERRED_CHECKPOINT_FLAGS = ("--compression=none", "--exclude-committed-zero-pages")


class GvisorBackend:
    name = "gvisor"

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.binary = find_runsc()
        self.version = "unknown"
        self.platform = "unknown"
        self.platform_reason = ""
        self.checkpoint_flags: tuple[str, ...] = ()
        self.runsc = Runsc(self.binary, paths.runsc_root, "ptrace")

    async def initialize(self) -> None:
        self.version = await runsc_version(self.binary)
        self.platform, self.platform_reason = await choose_platform(self.binary, self.version, self.paths.home)
        self.runsc = Runsc(self.binary, self.paths.runsc_root, self.platform)
        self.runsc.root.mkdir(parents=True, exist_ok=True)
        self.checkpoint_flags = await supported_flags(self.binary, "checkpoint", PREFERRED_CHECKPOINT_FLAGS)

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "runsc_version": self.version,
            "platform": self.platform,
            "platform_reason": self.platform_reason,
            "checkpoint_flags": " ".join(self.checkpoint_flags),
        }

    # ------------------------------------------------------------ layout

    @staticmethod
    def _paths(box: BoxRef) -> dict[str, Path]:
        d = box.directory
        return {
            "bundle": d / "bundle",
            "rootfs": d / "bundle" / "rootfs",
            "upper": d / "upper",
            "work": d / "work",
            "to_guest": d / "to_guest.fifo",
            "from_guest": d / "from_guest.fifo",
            "console": d / "console.log",
            "suspend": d / "suspend",
            "partial": d / "suspend.partial",
        }

    def _runsc_for(self, box: BoxRef) -> Runsc:
        """A restore must use the runsc build and platform the sandbox was started with."""
        version = box.backend_state.get("runsc_version")
        if version and version != self.version:
            raise StateError(
                f"sandbox {box.id} was suspended by runsc {version} but this host has runsc {self.version}; "
                "reinstall that runsc build to resume it"
            )
        return Runsc(self.binary, self.runsc.root, box.backend_state.get("platform", self.platform))

    # ------------------------------------------------------------ lifecycle

    async def start(self, box: BoxRef) -> tuple[GuestChannel, dict[str, Any]]:
        if box.spec.network:
            raise StateError("network access inside gVisor sandboxes is not supported yet; create it with network off")
        p = self._prepare(box)
        agent = p["upper"] / AGENT_PATH.lstrip("/")
        agent.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(AGENT_SOURCE, agent)  # every fresh boot gets this version of the agent
        await self.runsc.delete(box.id)  # a stale record, when booting a failed sandbox again
        runsc = Runsc(self.binary, self.runsc.root, self.platform)
        args = ("run", "-detach", "--bundle", str(p["bundle"]), box.id)
        channel = await self._boot(box, runsc, args, "gvisor.start.after_mount", "gvisor.start.after_launch")
        return channel, {"runsc_version": self.version, "platform": self.platform}

    def _prepare(self, box: BoxRef) -> dict[str, Path]:
        """The sandbox's directory, its FIFOs and its OCI bundle (idempotent)."""
        p = self._paths(box)
        box.directory.mkdir(parents=True, exist_ok=True)
        for fifo in (p["to_guest"], p["from_guest"]):
            if not fifo.exists():
                os.mkfifo(fifo, 0o600)
        p["bundle"].mkdir(exist_ok=True)
        config = oci_config(box.id, box.hostname, box.spec, str(p["rootfs"]))
        atomic_write(p["bundle"] / "config.json", json.dumps(config, indent=1).encode())
        return p

    async def _boot(
        self, box: BoxRef, runsc: Runsc, args: tuple[str, ...], after_mount: str | None, after_launch: str
    ) -> GuestChannel:
        """Mount the root, run runsc (`run` or `restore`), wait for the agent; on any failure stop again."""
        p = self._paths(box)
        mounts.mount_overlay(box.image_rootfs, p["upper"], p["work"], p["rootfs"])
        try:
            if after_mount:
                faults.point(after_mount)
            await self._launch(runsc, box, *args)
            faults.point(after_launch)
            return await self._connect(box)
        except BaseException:
            await self.stop(box)
            raise

    async def _launch(self, runsc: Runsc, box: BoxRef, *args: str) -> None:
        """Start runsc with the agent's stdio on the FIFOs (O_RDWR: the agent never sees EOF)."""
        p = self._paths(box)
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

    async def connect(self, box: BoxRef) -> GuestChannel:
        state = await self.runsc.state(box.id)
        if state is not None and state.get("status") == "paused":  # a checkpoint was cut off mid-way
            await self.runsc.call("resume", box.id)
        return await self._connect(box)

    # ------------------------------------------------------------ checkpoints

    async def checkpoint(self, box: BoxRef, channel: GuestChannel, dest: Path, memory: bool) -> None:
        """Write ``dest/files`` (and ``dest/memory`` for a MEMORY checkpoint); the sandbox keeps running.

        The sandbox is paused while its files are copied and its memory saved, so both
        are the same instant; then it continues, none the wiser.
        """
        p = self._paths(box)
        runsc = self._runsc_for(box)
        await channel.call("sync", timeout=60)
        await runsc.call("pause", box.id)
        try:
            faults.point("gvisor.checkpoint.paused")
            await copy_tree(p["upper"], dest / "files")
            faults.point("gvisor.checkpoint.after_files")
            if memory:
                (dest / "memory").mkdir()
                flags = self.checkpoint_flags
                await runsc.call("checkpoint", "--leave-running", *flags, "--image-path", str(dest / "memory"), box.id)
                faults.point("gvisor.checkpoint.after_memory")
        finally:
            await runsc.call("resume", box.id)

    async def start_from(
        self, box: BoxRef, source: Path, memory: bool, source_state: dict[str, Any]
    ) -> tuple[GuestChannel, dict[str, Any]]:
        """A new sandbox from a checkpoint: its files, and (MEMORY) its processes where they were."""
        p = self._paths(box)
        if memory and source_state.get("runsc_version") != self.version:
            raise StateError(
                f"this checkpoint was made by runsc {source_state.get('runsc_version')} and cannot be restored "
                f"by runsc {self.version}; restore it on a host with that runsc build, or make a FILESYSTEM checkpoint"
            )
        box.directory.mkdir(parents=True, exist_ok=True)
        await copy_tree(source / "files", p["upper"])
        faults.point("gvisor.start_from.after_copy")
        if not memory:
            return await self.start(box)
        self._prepare(box)
        platform = source_state.get("platform", self.platform)
        runsc = Runsc(self.binary, self.runsc.root, platform)
        args = ("restore", "--detach", "--bundle", str(p["bundle"]), "--image-path", str(source / "memory"), box.id)
        channel = await self._boot(box, runsc, args, None, "gvisor.start_from.after_restore")
        return channel, {"runsc_version": self.version, "platform": platform}

    async def suspend(self, box: BoxRef, channel: GuestChannel) -> None:
        p = self._paths(box)
        runsc = self._runsc_for(box)
        await channel.call("sync", timeout=60)
        faults.point("gvisor.suspend.after_sync")
        shutil.rmtree(p["partial"], ignore_errors=True)
        p["partial"].mkdir()
        faults.point("gvisor.suspend.before_checkpoint")
        started = time.monotonic()
        await runsc.call("checkpoint", *self.checkpoint_flags, "--image-path", str(p["partial"]), box.id, timeout=600)
        log.info("checkpointed %s in %.3fs", box.id, time.monotonic() - started)
        faults.point("gvisor.suspend.after_checkpoint")
        await asyncio.to_thread(fsync_tree, p["partial"])
        os.rename(p["partial"], p["suspend"])
        fsync_dir(box.directory)
        faults.point("gvisor.suspend.after_rename")
        await channel.close()
        await runsc.delete(box.id)
        faults.point("gvisor.suspend.after_delete")
        mounts.unmount(p["rootfs"])

    async def resume(self, box: BoxRef) -> GuestChannel:
        p = self._paths(box)
        if not (p["suspend"] / "checkpoint.img").exists():
            raise StateError(f"sandbox {box.id} has no suspend image to resume from")
        runsc = self._runsc_for(box)
        await runsc.delete(box.id)  # a stale record from an interrupted resume
        faults.point("gvisor.resume.before_mount")
        args = ("restore", "--detach", "--bundle", str(p["bundle"]), "--image-path", str(p["suspend"]), box.id)
        channel = await self._boot(box, runsc, args, "gvisor.resume.before_restore", "gvisor.resume.after_restore")
        # The files move on from here: the image must never be restored again.
        await self.discard_suspend_image(box)
        return channel

    async def host_state(self, box: BoxRef) -> HostState:
        state = await self.runsc.state(box.id)
        # After a checkpoint runsc still says "running" until delete: look at the process too.
        if state is not None and state.get("status") in ("running", "paused") and procs.pid_alive(state.get("pid")):
            return HostState.RUNNING
        if (self._paths(box)["suspend"] / "checkpoint.img").exists():
            return HostState.SUSPENDED
        return HostState.STOPPED

    async def salvage(self, box: BoxRef) -> GuestChannel | None:
        """A suspend was cut off after the sandbox exited but before its image was sealed.

        runsc may well have finished writing it: try to restore from it. If the agent
        answers, the sandbox is back as it was; if not, there is nothing to save.
        """
        p = self._paths(box)
        if not (p["partial"] / "checkpoint.img").exists():
            return None
        shutil.rmtree(p["suspend"], ignore_errors=True)
        os.rename(p["partial"], p["suspend"])
        try:
            return await self.resume(box)
        except Exception as exc:
            log.warning("could not salvage sandbox %s from its unsealed suspend image: %s", box.id, exc)
            shutil.rmtree(p["suspend"], ignore_errors=True)
            return None

    async def discard_suspend_image(self, box: BoxRef) -> None:
        shutil.rmtree(self._paths(box)["suspend"], ignore_errors=True)

    async def discard_partial(self, box: BoxRef) -> None:
        shutil.rmtree(self._paths(box)["partial"], ignore_errors=True)

    async def stop(self, box: BoxRef) -> None:
        """Nothing of the sandbox runs or stays mounted afterwards; its files stay."""
        await self.runsc.delete(box.id)
        mounts.unmount(self._paths(box)["rootfs"])

    async def destroy(self, box: BoxRef) -> None:
        await self.stop(box)
        faults.point("gvisor.destroy.after_stop")
        if box.directory.exists():
            await asyncio.to_thread(shutil.rmtree, box.directory)

    async def leftovers(self, known_ids: set[str]) -> list[str]:
        return [sid for sid in await self.runsc.list_ids() if sid not in known_ids]

    async def delete_container(self, sandbox_id: str) -> None:
        await self.runsc.delete(sandbox_id)


async def copy_tree(source: Path, dest: Path) -> None:
    """Copy a sandbox's writable layer (whiteouts and xattrs included); reflinks where the fs allows."""
    dest.mkdir(parents=True, exist_ok=True)
    result = await procs.run(["cp", "-a", "--reflink=auto", f"{source}/.", str(dest)], timeout=3600)
    if result.returncode != 0:
        raise BackendError(f"copying {source} to {dest} failed: {result.output}")
