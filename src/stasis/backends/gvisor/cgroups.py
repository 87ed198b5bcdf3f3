"""What the host's cgroups say of a gVisor sandbox: how much memory it uses, and whether the host OOM
killer ended it (cgroup v1 here, v2 where the host has it)."""

from __future__ import annotations

from pathlib import Path


def memory_usage(sandbox_id: str) -> int:
    """Bytes of memory the sandbox uses now (what its suspend image will about hold); 0 if unknown."""
    for usage in (
        Path(f"/sys/fs/cgroup/memory/stasis/{sandbox_id}/memory.usage_in_bytes"),
        Path(f"/sys/fs/cgroup/stasis/{sandbox_id}/memory.current"),
    ):
        try:
            return int(usage.read_text())
        except (OSError, ValueError):
            continue
    return 0


def stop_reason(sandbox_id: str, memory_mb: int) -> str:
    """Why a sandbox died, from its memory cgroup (v1 or v2), which lives until `runsc delete`."""
    for events in (
        Path(f"/sys/fs/cgroup/memory/stasis/{sandbox_id}/memory.oom_control"),
        Path(f"/sys/fs/cgroup/stasis/{sandbox_id}/memory.events"),
    ):
        try:
            counters = dict(line.split() for line in events.read_text().splitlines() if len(line.split()) == 2)
        except (OSError, ValueError):
            continue
        if int(counters.get("oom_kill", "0")) > 0:
            return (
                f"killed by the host OOM killer: the sandbox used all of its memory_mb ({memory_mb} MiB); "
                "resume it to boot it again with its files, or recreate it with more memory"
            )
    return "the sandbox's processes on the host exited unexpectedly (killed on the host?); resume it to boot it again"
