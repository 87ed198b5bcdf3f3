"""The Backend protocol: the lifecycle of one sandbox on one isolation technology.

A backend owns the sandbox's directory and everything on the host that runs it.
It knows nothing of names, the store or HTTP; the daemon's service drives it.
What it needs to remember about a sandbox is its own pydantic model (a
:class:`BackendState`), which the daemon persists without looking inside.
Every method is idempotent where a crash could make the daemon call it twice.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from ..guest.client import GuestChannel
from ..models import SandboxSpec
from ..network.namespaces import Device, SandboxNet


class BackendState(BaseModel):
    """What a backend remembers about one sandbox (its build, platform, machine); shown by `stasis info`."""

    model_config = ConfigDict(extra="ignore")


@dataclass(frozen=True)
class BoxRef:
    """What a backend needs to know about a sandbox."""

    id: str
    hostname: str
    spec: SandboxSpec
    directory: Path  # owned by the backend; removed by destroy()
    image_key: str
    image_rootfs: Path
    state: dict[str, Any]  # the backend's own state as last persisted (a BackendState dumped); {} before start
    network: SandboxNet | None = None  # its namespaces (made by the daemon before it boots); None: no network
    python: str = "/usr/bin/python3"  # the image's python3, which runs the agent; "": stasis's own (images/runtime)


class HostState(enum.Enum):
    """What is actually on the host, as opposed to what the store says."""

    RUNNING = "running"  # processes are up
    SUSPENDED = "suspended"  # no processes, a complete (sealed) suspend image exists
    PARTIAL = "partial"  # no processes, a suspend image that was written but never sealed
    STOPPED = "stopped"  # no processes, no suspend image (crashed, or the host rebooted)


@dataclass(frozen=True)
class FromCheckpoint:
    """A checkpoint directory to start a sandbox from: its files, and (``memory``) its processes."""

    directory: Path
    memory: bool
    state: dict[str, Any]  # the backend state of the sandbox it was taken of


@dataclass(frozen=True)
class External:
    """A file that a sandbox's (or a checkpoint's) files depend on outside their directory, named by its
    content's identity (one plain name), so that it travels once and is found again on another node."""

    key: str
    path: Path


Fetch = Callable[[str], Awaitable[Path]]  # an External's key -> this node's copy of it, fetched if need be


class Backend(Protocol):
    """What every backend does: the lifecycle of one sandbox on this host, and nothing above it."""

    name: ClassVar[str]
    network_device: ClassVar[Device]  # what a networked sandbox's kernel is given (see stasis.network)
    # whether its guest agent may set hostname and kernel RNG (a claimed pool member gets its own)
    sets_identity: ClassVar[bool]

    def serving(self) -> AbstractAsyncContextManager[None]:
        """While the daemon serves: probe the host once (versions, platform) before the first sandbox, and
        undo on the way out what no sandbox needs any more."""
        ...

    def describe(self, state: dict[str, Any] | None = None) -> dict[str, Any]:
        """What `stasis doctor` shows (version, platform), or with ``state`` one sandbox's backend state as
        `stasis info` shows it."""
        ...

    async def start(self, box: BoxRef, source: FromCheckpoint | None = None) -> tuple[GuestChannel, BackendState]:
        """Boot a sandbox (on its own files if it has some already), or start it from a checkpoint; a ready
        channel and the state to keep."""
        ...

    async def checkpoint(self, box: BoxRef, channel: GuestChannel, dest: Path, memory: bool) -> None:
        """Write a checkpoint of one instant into ``dest``; the sandbox keeps running."""
        ...

    async def suspend(self, box: BoxRef, channel: GuestChannel) -> None:
        """Save memory, processes and files to disk; afterwards nothing of it runs on the host (and nothing of
        the host holds its files: they may be copied off).

        On failure the partial image is gone; the sandbox runs on if it still can (see host_state)."""
        ...

    async def resume(self, box: BoxRef) -> GuestChannel:
        """Bring a suspended sandbox back exactly where it was, and forget its suspend image.

        A suspend cut off after its image was written (HostState.PARTIAL) is completed this way
        too; if that image does not load, it is discarded."""
        ...

    async def connect(self, box: BoxRef) -> GuestChannel:
        """Reattach to a sandbox that runs (after a daemon restart): unpause it if an operation
        was cut off mid-way, and drop suspend images it has outlived."""
        ...

    async def host_state(self, box: BoxRef) -> HostState: ...

    async def host_pid(self, box: BoxRef) -> int | None:
        """The host process whose exit means the sandbox died (runsc's sandbox, QEMU); None if none runs."""
        ...

    def stop_reason(self, box: BoxRef) -> str:
        """Why a sandbox stopped without being asked to (the host OOM killer, ...), as a user should read it."""
        ...

    async def stop(self, box: BoxRef, remove: bool = False) -> None:
        """Stop all processes and unmount, and with ``remove`` its directory too; idempotent (it rolls back a
        failed start, and removal always works)."""
        ...

    async def sweep(self, known_ids: set[str]) -> list[str]:
        """Stop what runs on the host for sandboxes the daemon does not know; return their ids."""
        ...

    async def externals(self, directory: Path) -> list[External]:
        """What the files in ``directory`` (a stopped sandbox's, a checkpoint's) depend on outside it."""
        ...

    async def rebind(self, directory: Path, needs: list[str], fetch: Fetch) -> None:
        """Files just fetched into ``directory`` from another node: point them at this node's copies of the
        externals ``needs`` names (its own where it has the same content, else what ``fetch`` brings) and
        of anything else of the host they name (boot files)."""
        ...
