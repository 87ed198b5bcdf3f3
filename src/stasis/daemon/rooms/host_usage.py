"""What a sandbox costs the host right now: CPU time and memory of its host processes.

Its processes are those whose command line names its id (runsc's sandbox, gofer and systrap stubs;
QEMU). Memory is the proportional set size (shared pages split between their sharers).
"""

from __future__ import annotations

import os
from pathlib import Path

from ... import procs

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
    except (OSError, IndexError, ValueError):
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
