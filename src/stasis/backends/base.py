"""The Backend protocol: the lifecycle of one sandbox on one isolation technology.

A backend owns the sandbox's directory and everything on the host that runs it.
It knows nothing of names, the store or HTTP; the daemon's service drives it.
What it needs to remember about a sandbox is its own pydantic model (a
:class:`BackendState`), which the daemon persists without looking inside.
Every method is idempotent where a crash could make the daemon call it twice.
"""

from __future__ import annotations

import enum
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


class Backend(Protocol):
    name: ClassVar[str]
    kill_points: ClassVar[tuple[str, ...]]  # its STASIS_KILL_POINT names (see stasis.faults)
    network_device: ClassVar[Device]  # what a networked sandbox's kernel is given (see stasis.network)
    # whether its guest agent may set hostname and kernel RNG (a claimed pool member gets its own)
    sets_identity: ClassVar[bool]

    async def initialize(self) -> None:
        """Probe the host once (versions, platform) before the first sandbox."""
        ...

    async def close(self) -> None:
        """The daemon stops: undo what ``initialize`` set up on the host where no sandbox needs it any more."""
        ...

    def describe(self) -> dict[str, Any]:
        """Version, platform and anything a user should see in `stasis doctor`."""
        ...

    def describe_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """One sandbox's backend state as a user should see it in `stasis info`."""
        ...

    async def start(self, box: BoxRef) -> tuple[GuestChannel, BackendState]:
        """Boot a sandbox (on its own files if it has some already); a ready channel and the state to keep."""
        ...

    async def start_from(
        self, box: BoxRef, source: Path, memory: bool, source_state: dict[str, Any]
    ) -> tuple[GuestChannel, BackendState]:
        """A new sandbox from a checkpoint directory: its files, and (``memory``) its processes."""
        ...

    async def checkpoint(self, box: BoxRef, channel: GuestChannel, dest: Path, memory: bool) -> None:
        """Write a checkpoint of one instant into ``dest``; the sandbox keeps running."""
        ...

    async def suspend(self, box: BoxRef, channel: GuestChannel) -> None:
        """Save memory, processes and files to disk; afterwards nothing of it runs on the host.

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

    async def stop(self, box: BoxRef) -> None:
        """Stop all processes and unmount, keep the files (rolls back a failed start; idempotent)."""
        ...

    async def destroy(self, box: BoxRef) -> None:
        """Stop everything and remove the sandbox's directory."""
        ...

    async def sweep(self, known_ids: set[str]) -> list[str]:
        """Stop what runs on the host for sandboxes the daemon does not know; return their ids."""
        ...

    async def quiesce(self, box: BoxRef) -> None:
        """Before a stopped sandbox's files are copied off the host: wait until nothing writes them any more."""
        ...

    def relocate(self, directory: Path) -> None:
        """Files of a sandbox or checkpoint made on another node, just fetched into ``directory``: make
        what they name of the host (boot files) this node's own copies."""
        ...
