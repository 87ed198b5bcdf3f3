"""The Backend protocol: the lifecycle of one sandbox on one isolation technology.

A backend owns the sandbox's directory and everything on the host that runs it.
It knows nothing of names, the store or HTTP; the daemon's service drives it.
Every method is idempotent where a crash could make the daemon call it twice.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..guest.channel import GuestChannel
from ..models import SandboxSpec


@dataclass(frozen=True)
class BoxRef:
    """What a backend needs to know about a sandbox."""

    id: str
    hostname: str
    spec: SandboxSpec
    directory: Path  # owned by the backend; removed by destroy()
    image_rootfs: Path
    backend_state: dict[str, Any]  # what start() returned, persisted by the daemon


class HostState(enum.Enum):
    """What is actually on the host, as opposed to what the store says."""

    RUNNING = "running"  # processes are up
    SUSPENDED = "suspended"  # no processes, a complete suspend image exists
    STOPPED = "stopped"  # no processes, no suspend image (crashed, or the host rebooted)


class Backend(Protocol):
    name: str

    async def initialize(self) -> None:
        """Probe the host once (versions, platform) before the first sandbox."""
        ...

    def describe(self) -> dict[str, Any]:
        """Version, platform and anything a user should see in `stasis info`."""
        ...

    async def start(self, box: BoxRef) -> tuple[GuestChannel, dict[str, Any]]:
        """Boot a fresh sandbox; return a ready channel and the state to persist for it."""
        ...

    async def start_from(
        self, box: BoxRef, source: Path, memory: bool, source_state: dict[str, Any]
    ) -> tuple[GuestChannel, dict[str, Any]]:
        """A new sandbox from a checkpoint directory: its files, and (``memory``) its processes."""
        ...

    async def checkpoint(self, box: BoxRef, channel: GuestChannel, dest: Path, memory: bool) -> None:
        """Write a checkpoint of one instant into ``dest``; the sandbox keeps running."""
        ...

    async def suspend(self, box: BoxRef, channel: GuestChannel) -> None:
        """Save memory, processes and files to disk; afterwards nothing of it runs on the host."""
        ...

    async def resume(self, box: BoxRef) -> GuestChannel:
        """Bring a suspended sandbox back exactly where it was."""
        ...

    async def connect(self, box: BoxRef) -> GuestChannel:
        """Reattach to a sandbox that is still running (after a daemon restart)."""
        ...

    async def host_state(self, box: BoxRef) -> HostState: ...

    async def discard_partial(self, box: BoxRef) -> None:
        """Remove what an interrupted suspend left behind, keeping the sandbox as it is."""
        ...

    async def discard_suspend_image(self, box: BoxRef) -> None:
        """Forget the suspend image of a sandbox that runs again."""
        ...

    async def salvage(self, box: BoxRef) -> GuestChannel | None:
        """Try to bring back a sandbox whose suspend was cut off after it stopped."""
        ...

    async def delete_container(self, sandbox_id: str) -> None:
        """Remove a runtime object that no sandbox owns."""
        ...

    async def stop(self, box: BoxRef) -> None:
        """Stop all processes and unmount, keep the files (rolls back a failed start; idempotent)."""
        ...

    async def destroy(self, box: BoxRef) -> None:
        """Stop everything and remove the sandbox's directory."""
        ...

    async def leftovers(self, known_ids: set[str]) -> list[str]:
        """Ids of sandboxes running on the host that the daemon does not know (to reap)."""
        ...
