"""A working fake backend for the fast tier: the real guest agent as a host subprocess on FIFOs.

No runsc, no QEMU, no image. It is honest about what it is not: there is no isolation (the
agent runs on the host as the test's user, so tests only touch paths under their own temp
dirs), a "suspend" stops the agent's process group with SIGSTOP (memory stays in the host
process, not on disk) and a checkpoint keeps no memory. What it exercises for real: the
agent, the typed channel, the service's state machine, the store, recovery and the reaper.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

from stasis import procs
from stasis.backends.base import BackendState, BoxRef, External, Fetch, FromCheckpoint, HostState
from stasis.backends.suspend_image import SuspendImage
from stasis.errors import BackendError
from stasis.guest import AGENT_DIR
from stasis.guest.client import GuestChannel
from stasis.paths import Paths

MARKER = "stasis-fake-agent"  # on the agent's command line, with the sandbox directory: leaks are found by it


class FakeState(BackendState):
    boots: int = 0


class FakeBackend:
    name: ClassVar[str] = "fake"
    network_device: ClassVar[str] = "veth"
    sets_identity: ClassVar[bool] = False

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.fail_next: dict[str, Exception] = {}  # operation -> error it raises once (a broken host)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        yield

    def describe(self, state: dict[str, Any] | None = None) -> dict[str, Any]:
        if state is not None:
            return FakeState.model_validate(state).model_dump()
        return {"backend": self.name, "agent": str(AGENT_DIR / "agent.py")}

    def _fail(self, operation: str) -> None:
        if operation in self.fail_next:
            raise self.fail_next.pop(operation)

    @staticmethod
    def _pidfile(box: BoxRef) -> Path:
        return box.directory / "agent.pid"

    @staticmethod
    def _image(box: BoxRef) -> SuspendImage:
        return SuspendImage(box.directory, "stopped")

    def pid(self, box: BoxRef) -> int | None:
        try:
            pid = int(self._pidfile(box).read_text())
        except (OSError, ValueError):
            return None
        return pid if procs.pid_alive(pid) else None

    async def _connect(self, box: BoxRef) -> GuestChannel:
        d = box.directory
        channel = await GuestChannel.open_fifos(d / "to_guest.fifo", d / "from_guest.fifo", f"fake {box.id}")
        try:
            await channel.wait_ready(10)
        except BaseException:
            await channel.close()
            raise
        return channel

    async def start(self, box: BoxRef, source: FromCheckpoint | None = None) -> tuple[GuestChannel, FakeState]:
        self._fail("start")
        d = box.directory
        (d / "state").mkdir(parents=True, exist_ok=True)
        for fifo in (d / "to_guest.fifo", d / "from_guest.fifo"):
            fifo.unlink(missing_ok=True)
            os.mkfifo(fifo, 0o600)
        stdin, stdout = os.open(d / "to_guest.fifo", os.O_RDWR), os.open(d / "from_guest.fifo", os.O_RDWR)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-u", str(AGENT_DIR / "boot.py"), MARKER, str(d)],
                stdin=stdin,
                stdout=stdout,
                stderr=subprocess.DEVNULL,
                env={"PATH": os.environ["PATH"], "STASIS_AGENT_STATE": str(d / "state")},
                start_new_session=True,  # its own group: suspend stops all of it
            )
        finally:
            os.close(stdin)
            os.close(stdout)
        self._pidfile(box).write_text(str(proc.pid))
        proc.returncode = 0  # never waited on here: killed by pid, reaped by whoever reaps
        state = FakeState.model_validate(box.state) if box.state else FakeState()
        return await self._connect(box), state.model_copy(update={"boots": state.boots + 1})

    async def checkpoint(self, box: BoxRef, channel: GuestChannel, dest: Path, memory: bool) -> None:
        self._fail("checkpoint")
        (dest / "fake-checkpoint").write_text(box.id)

    async def suspend(self, box: BoxRef, channel: GuestChannel) -> None:
        self._fail("suspend")
        image = self._image(box)
        partial = image.begin()
        pid = self.pid(box)
        if pid is None:
            raise BackendError(f"fake {box.id}: the agent is gone")
        os.killpg(pid, signal.SIGSTOP)
        (partial / "stopped").write_text(str(pid))
        await channel.close()
        image.seal()

    async def resume(self, box: BoxRef) -> GuestChannel:
        self._fail("resume")
        image = self._image(box)
        image.seal_unsealed()
        pid = self.pid(box)
        if not image.sealed or pid is None:
            raise BackendError(f"fake {box.id} has nothing to resume")
        os.killpg(pid, signal.SIGCONT)
        image.discard()
        return await self._connect(box)

    async def connect(self, box: BoxRef) -> GuestChannel:
        pid = self.pid(box)
        if pid is not None:
            os.killpg(pid, signal.SIGCONT)
        self._image(box).discard()
        return await self._connect(box)

    async def host_state(self, box: BoxRef) -> HostState:
        pid = self.pid(box)
        image = self._image(box)
        if pid is not None and not _stopped(pid):
            return HostState.RUNNING
        if image.sealed and pid is not None:
            return HostState.SUSPENDED
        if image.unsealed and pid is not None:
            return HostState.PARTIAL
        return HostState.STOPPED

    async def host_pid(self, box: BoxRef) -> int | None:
        return self.pid(box)

    def stop_reason(self, box: BoxRef) -> str:
        return "the fake agent died"

    async def stop(self, box: BoxRef, remove: bool = False) -> None:
        """Nothing runs afterwards. A suspended fake's stopped process *is* its image: it stays (unless
        ``remove``)."""
        if remove:
            self._image(box).discard()
        pid = self.pid(box)
        if pid is not None and not (self._image(box).sealed and _stopped(pid)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            await procs.wait_gone(pid, 10)
        if remove:
            await asyncio.to_thread(shutil.rmtree, box.directory, True)

    async def externals(self, directory: Path) -> list[External]:
        return []

    async def rebind(self, directory: Path, needs: list[str], fetch: Fetch) -> None:
        pass

    async def sweep(self, known_ids: set[str]) -> list[str]:
        reaped = []
        for pid, cmdline in fake_agents(self.paths.sandboxes):
            sandbox_id = Path(cmdline.split()[-1]).name
            if sandbox_id not in known_ids:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                reaped.append(sandbox_id)
        return reaped


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"T"
    except OSError:
        return False


def fake_agents(under: Path) -> list[tuple[int, str]]:
    """(pid, command line) of fake agents whose sandbox directory is below ``under``."""
    return procs.processes(lambda cmd: MARKER in cmd and str(under) in cmd)
