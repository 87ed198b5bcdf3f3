"""The daemon's child reaper: it owns what it started and orphans, and nothing else."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.fast

# Run in a process of its own: the reaper (and the subreaper flag) last for a process's lifetime.
SCRIPT = textwrap.dedent("""
    import asyncio, os, subprocess, time
    from stasis import procs
    procs.share_children()

    async def started_by_the_reaper() -> int:
        return (await procs.run(["sh", "-c", "exit 4"], timeout=10)).returncode

    assert asyncio.run(started_by_the_reaper()) == 4

    # A child that outlives its event loop (asyncio.run ended) exits into a closed loop: the reaper lives on.
    async def leave_one_behind() -> None:
        procs.spawn(["sleep", "0.3"])

    asyncio.run(leave_one_behind())
    time.sleep(0.8)
    assert asyncio.run(started_by_the_reaper()) == 4
    # With share_children, children other code starts keep their exit status, however long they ran.
    assert subprocess.run(["sh", "-c", "exit 3"]).returncode == 3
    assert subprocess.run(["sh", "-c", "sleep 1.2; exit 5"]).returncode == 5
    assert procs.run_blocking(["sh", "-c", "exit 6"]).returncode == 6
    # An orphan (a grandchild whose parent exited) is re-parented here and reaped, not left a zombie.
    out = subprocess.run(["sh", "-c", "sleep 0.3 & echo $!"], capture_output=True, text=True).stdout
    orphan = int(out)
    time.sleep(1.5)
    assert not os.path.exists(f"/proc/{orphan}"), open(f"/proc/{orphan}/status").read()
    print("ok")
""")


@pytest.mark.slow  # seconds of its own: the full suite runs it, the fast tier not
def test_the_reaper_leaves_other_childrens_exit_status_to_their_owner_and_reaps_orphans() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
