"""A host reboot, simulated: runsc and QEMU processes, mounts and /run are gone, the disk is not."""

from __future__ import annotations

import os
import re
import shutil
import signal

from stasis import Sandbox, SandboxStatus, StateError
from stasis.backends.gvisor import mounts
from tests.conftest import Daemon, sandbox_processes_under, wait_until

S = SandboxStatus


def reboot_host(daemon: Daemon) -> None:
    """Everything a reboot takes away, for this daemon's sandboxes only (our own processes, by pid)."""
    daemon.kill()
    for line in sandbox_processes_under(daemon.paths.home):
        os.kill(int(line.split(":")[0]), signal.SIGKILL)
    wait_until(lambda: sandbox_processes_under(daemon.paths.home) == [])
    for rootfs in daemon.paths.sandboxes.glob("*/bundle/rootfs"):
        mounts.unmount(rootfs)
    shutil.rmtree(daemon.paths.runtime)  # /run is a tmpfs


def test_suspended_sandboxes_survive_a_reboot_and_running_ones_are_kept(own_daemon: Daemon, backend: str) -> None:
    own_daemon.start()
    client = own_daemon.client()
    sleeper = Sandbox.create("sleeper", memory_mb=256, backend=backend, client=client)
    sleeper.write_file("/root/state", b"before reboot")
    proc = sleeper.start_process(["sleep", "1000"])
    sleeper.suspend()
    worker = Sandbox.create("worker", memory_mb=256, backend=backend, client=client)
    worker.write_file("/root/work.txt", b"unsaved? no: files live on the host disk")

    reboot_host(own_daemon)
    own_daemon.start()
    client = own_daemon.client()

    sleeper = Sandbox.connect("sleeper", client=client)
    assert sleeper.status == S.SUSPENDED
    assert sleeper.run("cat /root/state").stdout == "before reboot"  # auto-resumed across the reboot
    assert sleeper.get_process(proc.id).status == "running"

    worker = Sandbox.connect("worker", client=client)
    assert worker.status == S.FAILED, "never silently dropped"
    assert "host restart" in (worker.info().error or "")
    try:
        worker.run("true")
        raise AssertionError("a failed sandbox must not auto-resume")
    except StateError as exc:
        assert "stasis resume worker" in str(exc)
    worker.resume()  # boots it again with its files
    assert worker.status == S.RUNNING
    assert worker.read_file("/root/work.txt") == b"unsaved? no: files live on the host disk"


def test_no_runsc_state_is_left_under_run_after_removal(own_daemon: Daemon) -> None:
    own_daemon.start()
    sbx = Sandbox.create("tidy", memory_mb=256, client=own_daemon.client())
    records = list(own_daemon.paths.runsc_root.iterdir())
    assert any(re.search(sbx.id, p.name) for p in records)
    sbx.terminate()
    assert list(own_daemon.paths.runsc_root.iterdir()) == []
