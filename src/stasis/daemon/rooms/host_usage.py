"""What a sandbox costs the host: CPU time and memory of its host processes.

Its processes are those whose command line names its id (runsc's sandbox, gofer and systrap stubs;
QEMU). Memory is the proportional set size (shared pages split between their sharers).

CPU time for accounting (:func:`cpu_reading`) comes from the sandbox's own cgroup where it has one (gVisor: every
process runsc starts for it, exited ones too, exact), else from its processes (QEMU: one process, its threads
included). Each reading names the run it belongs to: the cgroup or process made when the sandbox started or
resumed, so a counter that starts again at zero is a new run, never a step back.
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


def cpu_reading(sandbox_id: str) -> tuple[str, float] | None:
    """(the run it counts, CPU seconds of that run so far), or None when nothing of the sandbox runs here."""
    for pattern, read in ((CGROUP_V1, _cgroup_v1), (CGROUP_V2, _cgroup_v2)):
        directory = Path(pattern.format(id=sandbox_id))
        try:
            made = directory.stat()
            return f"cgroup:{made.st_ino}:{made.st_ctime_ns}", read(directory)
        except (OSError, ValueError, KeyError):
            continue
    pids = [pid for pid, _ in procs.processes(lambda cmd: sandbox_id in cmd)]
    started = {pid: int(fields[19]) for pid in pids if len(fields := _stat(pid)) > 19}
    if not started:
        return None
    first = min(started, key=lambda pid: (started[pid], pid))
    return f"process:{first}:{started[first]}", sum(_cpu_seconds(pid, children=True) for pid in started)


def _cgroup_v1(directory: Path) -> float:
    return int((directory / "cpuacct.usage").read_text()) / 1e9


def _cgroup_v2(directory: Path) -> float:
    stat = dict(line.split() for line in (directory / "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"]) / 1e6
