"""What a sandbox costs the host: CPU time and memory of its host processes.

Its processes are those whose command line names its id (runsc's sandbox, gofer and systrap stubs;
QEMU). Memory is the proportional set size (shared pages split between their sharers).

CPU time for accounting (:func:`cpu_reading`) comes from the sandbox's own cgroup where it has one (gVisor: every
process runsc starts for it, exited ones too, exact), else from the processes that carry its id as a whole
argument (QEMU's ``-name stasis-ID``; runsc's container id): never a substring, which a sandbox's name could
plant in another's command line.
"""

from __future__ import annotations

import os
from pathlib import Path

from ... import procs

TICKS = os.sysconf("SC_CLK_TCK")
CGROUP_V1 = "/sys/fs/cgroup/cpuacct/stasis/{id}"  # cpuacct.usage: nanoseconds
CGROUP_V2 = "/sys/fs/cgroup/stasis/{id}"  # cpu.stat: usage_usec


def _stat(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _cpu_seconds(pid: int, children: bool = False) -> float:
    """utime and stime (with ``children``: and those of its children that exited and were waited for)."""
    fields = _stat(pid)
    try:
        return sum(int(fields[i]) for i in ((11, 12, 13, 14) if children else (11, 12))) / TICKS
    except (IndexError, ValueError):
        return 0.0


def _pss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


def host_usage(sandbox_id: str) -> tuple[float, float]:
    """(CPU seconds used so far, MiB of memory now) of the sandbox's host processes."""
    pids = [pid for pid, _ in procs.processes(lambda cmd: sandbox_id in cmd)]
    return sum(_cpu_seconds(pid) for pid in pids), sum(_pss_mib(pid) for pid in pids)


def cpu_reading(sandbox_id: str) -> float | None:
    """CPU seconds the sandbox's current run has used so far, or None when nothing of it runs here."""
    for pattern, read in ((CGROUP_V1, _cgroup_v1), (CGROUP_V2, _cgroup_v2)):
        try:
            return read(Path(pattern.format(id=sandbox_id)))
        except (OSError, ValueError, KeyError):
            continue
    names = {sandbox_id, f"stasis-{sandbox_id}"}
    pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and names & set(_argv(int(entry)))]
    return sum(_cpu_seconds(pid, children=True) for pid in pids) if pids else None


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _cgroup_v1(directory: Path) -> float:
    return int((directory / "cpuacct.usage").read_text()) / 1e9


def _cgroup_v2(directory: Path) -> float:
    stat = dict(line.split() for line in (directory / "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"]) / 1e6
