"""QEMU for one microVM: its command line, its launch, and the QMP commands stasis uses.

The machine is described once (:class:`Machine`) and stored with the sandbox, so a
resume starts QEMU with exactly the arguments the state was saved from. Guest RAM
lives in a file mapped shared: with the ``x-ignore-shared`` migration capability a
save writes only device state (milliseconds), and the RAM file *is* the memory image.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shlex
import shutil
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from qemu.qmp import QMPClient, QMPError

from ... import procs
from ...errors import BackendError, StartupError
from ...network.namespaces import GATEWAY_DEVICE

log = logging.getLogger(__name__)

QMP_TIMEOUT = 30.0
MIGRATION_TIMEOUT = 600.0
TB_SIZE_MB = 128  # TCG's translation cache; QEMU's default (1 GiB) would dominate an idle VM's RSS


def find_qemu() -> str:
    binary = shutil.which("qemu-system-x86_64")
    if binary is None:
        raise BackendError("qemu-system-x86_64 is missing; install it with: apt-get install qemu-system-x86 qemu-utils")
    return binary


async def qemu_version(binary: str) -> str:
    result = await procs.run([binary, "--version"], timeout=30)
    match = re.search(r"version (\S+)", result.stdout.decode(errors="replace"))
    return match.group(1) if match else "unknown"


GUEST_MAC = "52:54:00:c8:00:02"  # the same in every VM: each is alone on its link


@dataclass(frozen=True)
class Machine:
    """Everything that must be identical between saving a VM and loading it again."""

    accel: str
    cpus: int
    memory_mb: int
    kernel: str
    initramfs: str
    cmdline: str
    network: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class VmFiles:
    """Where one VM's state lives: files in its directory, sockets in the runtime dir."""

    directory: Path
    runtime: Path

    @property
    def disk(self) -> Path:
        return self.directory / "disk.qcow2"

    @property
    def memory(self) -> Path:
        return self.directory / "memory.ram"

    @property
    def console(self) -> Path:
        return self.directory / "console.log"

    @property
    def qmp(self) -> Path:
        return self.runtime / "qmp.sock"

    @property
    def agent(self) -> Path:
        return self.runtime / "agent.sock"

    @property
    def pidfile(self) -> Path:
        return self.runtime / "qemu.pid"


def command_line(binary: str, machine: Machine, files: VmFiles, name: str, incoming: bool) -> list[str]:
    if machine.accel == "kvm":
        accel = ["-accel", "kvm", "-cpu", "host", "-M", "microvm,acpi=on"]
    else:
        accel = ["-accel", f"tcg,tb-size={TB_SIZE_MB}", "-cpu", "max", "-M", "microvm,pit=on,pic=on,rtc=on,acpi=on"]
    ram = f"memory-backend-file,id=ram,size={machine.memory_mb}M,mem-path={files.memory},share=on"
    argv = [
        binary, "-name", name, *accel,
        "-smp", str(machine.cpus), "-m", f"{machine.memory_mb}M",
        "-object", ram, "-machine", "memory-backend=ram",
        "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
        "-kernel", machine.kernel, "-initrd", machine.initramfs, "-append", machine.cmdline,
        "-chardev", f"file,id=console,path={files.console},append=on", "-serial", "chardev:console",
        "-drive", f"file={files.disk},if=none,id=root,format=qcow2,discard=unmap",
        "-device", "virtio-blk-device,drive=root",
        "-device", "virtio-serial-device",
        "-chardev", f"socket,id=agent,path={files.agent},server=on,wait=off",
        "-device", "virtserialport,chardev=agent,name=stasis.agent",
        "-qmp", f"unix:{files.qmp},server=on,wait=off",
        "-pidfile", str(files.pidfile), "-daemonize",
    ]  # fmt: skip
    if machine.network:  # the tap "gw0" of the gateway namespace QEMU is started in (stasis.network)
        argv += ["-netdev", f"tap,id=net0,ifname={GATEWAY_DEVICE},script=no,downscript=no",
                 "-device", f"virtio-net-device,netdev=net0,mac={GUEST_MAC}"]  # fmt: skip
    else:
        argv += ["-nic", "none"]
    if incoming:
        argv += ["-S", "-incoming", "defer"]
    return argv


async def launch(argv: list[str], files: VmFiles, netns: Path | None = None) -> int:
    """Start QEMU detached (it outlives the daemon), in network namespace ``netns`` if given;
    return its pid once QMP is up."""
    files.runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
    for stale in (files.qmp, files.agent, files.pidfile):
        stale.unlink(missing_ok=True)
    if netns is not None:
        argv = ["nsenter", f"--net={netns}", "--", *argv]
    result = await procs.run(argv, timeout=60)
    if result.returncode != 0:
        raise StartupError(f"QEMU did not start: {result.output or f'exit code {result.returncode}'}")
    pid = read_pid(files)
    if pid is None:
        raise StartupError(f"QEMU started but wrote no pid to {files.pidfile}")
    return pid


def read_pid(files: VmFiles) -> int | None:
    try:
        return int(files.pidfile.read_text().strip())
    except (OSError, ValueError):
        return None


def running_pid(files: VmFiles) -> int | None:
    """The pid of this VM's QEMU if it runs (checked against its command line, not just the pidfile)."""
    pid = read_pid(files)
    if pid is None or not procs.pid_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if str(files.qmp).encode() in cmdline else None


async def kill(files: VmFiles) -> None:
    """Stop this VM's QEMU now (SIGKILL by pid: the guest state is either saved already or not wanted)."""
    pid = running_pid(files)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not await procs.wait_gone(pid, 10):
            raise BackendError(f"QEMU (pid {pid}) did not exit after SIGKILL")
    shutil.rmtree(files.runtime, ignore_errors=True)


@contextlib.asynccontextmanager
async def qmp(files: VmFiles) -> AsyncIterator[QMPClient]:
    client = QMPClient(files.runtime.name)
    try:
        await asyncio.wait_for(client.connect(str(files.qmp)), QMP_TIMEOUT)
    except (OSError, QMPError, TimeoutError) as exc:
        raise BackendError(f"cannot reach QEMU's monitor at {files.qmp}: {exc}") from exc
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            await client.disconnect()


async def execute(client: QMPClient, command: str, **arguments: Any) -> Any:
    try:
        return await asyncio.wait_for(client.execute(command, arguments or None), QMP_TIMEOUT)
    except (QMPError, TimeoutError) as exc:
        raise BackendError(f"QMP {command} failed: {exc}") from exc


async def status(client: QMPClient) -> str:
    return str((await execute(client, "query-status"))["status"])


async def _migration_setup(client: QMPClient) -> None:
    await execute(client, "migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])


async def save_state(client: QMPClient, dest: Path) -> float:
    """Stop the guest and write its device state to ``dest``; RAM stays in the shared file.

    Afterwards the VM is stopped ("postmigrate"); `cont` runs it again. Returns seconds taken.
    """
    started = time.monotonic()
    await execute(client, "stop")
    await _migration_setup(client)
    await execute(client, "migrate-set-parameters", **{"max-bandwidth": 1 << 40})  # default: 32 MiB/s
    await execute(client, "migrate", uri=f"exec:cat > {shlex.quote(str(dest))}")
    await _wait_migration(client, dest)
    return time.monotonic() - started


async def load_state(client: QMPClient, source: Path) -> float:
    """Load device state into a QEMU started with ``-incoming defer -S``, then run the guest."""
    started = time.monotonic()
    await _migration_setup(client)
    await execute(client, "migrate-incoming", uri=f"exec:cat {shlex.quote(str(source))}")
    deadline = time.monotonic() + MIGRATION_TIMEOUT
    while (state := await status(client)) == "inmigrate":
        if time.monotonic() > deadline:
            raise BackendError(f"loading VM state from {source} did not finish in {MIGRATION_TIMEOUT:.0f}s")
        await asyncio.sleep(0.002)
    if state not in ("paused", "prelaunch"):
        raise BackendError(f"loading VM state from {source} failed (QEMU state: {state})")
    await execute(client, "cont")
    return time.monotonic() - started


async def _wait_migration(client: QMPClient, dest: Path) -> None:
    deadline = time.monotonic() + MIGRATION_TIMEOUT
    while True:
        info = await execute(client, "query-migrate")
        state = info.get("status")
        if state == "completed":
            return
        if state in ("failed", "cancelled"):
            raise BackendError(f"saving VM state to {dest} failed: {info.get('error-desc', state)}")
        if time.monotonic() > deadline:
            await execute(client, "migrate_cancel")
            raise BackendError(f"saving VM state to {dest} did not finish in {MIGRATION_TIMEOUT:.0f}s")
        await asyncio.sleep(0.002)


async def quit_vm(client: QMPClient, files: VmFiles) -> None:
    """Ask QEMU to exit and wait until it has (falls back to SIGKILL)."""
    pid = running_pid(files)
    with contextlib.suppress(BackendError):
        await execute(client, "quit")
    if pid is not None and not await procs.wait_gone(pid, 10):
        log.warning("QEMU (pid %d) ignored quit; killing it", pid)
        await kill(files)
