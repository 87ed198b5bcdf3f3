"""Faults and attacks from inside a sandbox stay inside it; a sandbox that dies on the host is seen at once."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from stasis import Client, NoSpace, Sandbox, SandboxStatus, StasisError, StateError
from tests.conftest import Daemon, loop_devices_under, wait_until

S = SandboxStatus


def host_pid(daemon: Daemon, sbx: Sandbox, backend: str) -> int:
    """The host process that is the sandbox (runsc's sandbox process, or QEMU)."""
    if backend == "microvm":
        return int((daemon.paths.runtime / "vm" / sbx.id / "qemu.pid").read_text())
    out = subprocess.run(
        ["runsc", "--root", str(daemon.paths.runsc_root), "state", sbx.id], capture_output=True, text=True, check=True
    )
    return int(json.loads(out.stdout)["pid"])


@pytest.fixture
def victims(tmp_path: Path) -> dict[str, Path]:
    """Host paths a sandbox must never reach: a file, a directory, a FIFO (opening it would hang)."""
    found = {"file": tmp_path / "victim.txt", "dir": tmp_path / "victim-dir", "fifo": tmp_path / "victim.fifo"}
    found["file"].write_text("untouched")
    found["dir"].mkdir()
    os.mkfifo(found["fifo"])
    return found


def assert_untouched(victims: dict[str, Path]) -> None:
    assert victims["file"].read_text() == "untouched"
    assert list(victims["dir"].iterdir()) == []
    assert stat.S_ISFIFO(os.lstat(victims["fifo"]).st_mode)


PLANT = """
set -e
ln -s {file} /root/link-file; ln -s {dir} /root/link-dir; ln -s {fifo} /root/link-fifo
ln -s /nonexistent/host/path /root/dangling; mkfifo /root/own.fifo  # gVisor keeps this one in its memory
mkdir -p /root/deep/er && ln -s {dir} /root/deep/er/link-dir
ln -s {dir} /tmp/link-dir; ln -s {fifo} /tmp/link-fifo  # /tmp: copied by MEMORY checkpoints, emptied at boot
"""


def test_links_planted_in_a_sandbox_never_lead_the_daemon_to_host_files(
    daemon: Daemon, client: Client, backend: str, victims: dict[str, Path]
) -> None:
    sbx = Sandbox.create("planter", memory_mb=256, backend=backend, client=client)
    made: list[Sandbox] = []
    try:
        # The original attack: replace the agent by a link to a host file, then make the daemon boot it anew.
        attack = sbx.run(f"rm -f /opt/stasis/agent.py; ln -sf {victims['file']} /opt/stasis/agent.py")
        assert attack.exit_code != 0 and "Read-only" in attack.stderr, attack.stderr
        assert sbx.run(PLANT.format(**victims)).exit_code == 0
        fs = sbx.checkpoint("filesystem")  # sealing fsyncs every file: it must not open a link or a FIFO
        memory = sbx.checkpoint("memory")
        made.append(Sandbox.create(snapshot_id=fs.id, client=client))  # a cold boot on those files
        made.append(Sandbox.create(snapshot_id=memory.id, client=client))
        made += sbx.copy(times=1)
        sbx.suspend()
        sbx.resume()
        client.json("GET", "/v1/df")
        os.kill(host_pid(daemon, sbx, backend), signal.SIGKILL)  # then a cold boot of the failed sandbox
        wait_until(lambda: sbx.info().status == S.FAILED, timeout=10)
        sbx.resume()
        for box in [sbx, *made]:
            assert box.run("readlink /root/link-file").stdout.strip() == str(victims["file"])
            assert box.run("readlink /root/deep/er/link-dir").stdout.strip() == str(victims["dir"])
        assert_untouched(victims)
        for checkpoint in (fs, memory):
            Sandbox.delete_checkpoint(checkpoint.id, client=client)
    finally:
        for box in [sbx, *made]:
            box.terminate()
    assert_untouched(victims)


def test_a_sandbox_killed_on_the_host_fails_at_once_and_its_unread_request_never_runs(
    daemon: Daemon, client: Client, backend: str
) -> None:
    sbx = Sandbox.create("mortal", memory_mb=256, backend=backend, client=client)
    try:
        pid = host_pid(daemon, sbx, backend)
        os.kill(pid, signal.SIGSTOP)  # the agent stops reading: the next request waits, unread
        outcome: list[BaseException | str] = []

        def late_request() -> None:
            try:
                outcome.append(sbx.run("touch /root/late").stdout)
            except StasisError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=late_request)
        thread.start()
        time.sleep(1.0)
        os.kill(pid, signal.SIGKILL)
        thread.join(120)
        assert not thread.is_alive(), "the request hung on a dead sandbox"
        assert isinstance(outcome[0], StateError) and "failed" in str(outcome[0]), outcome
        info = sbx.info()
        assert info.status == S.FAILED and "resume" in (info.error or "")
        assert sbx.resume().status == S.RUNNING  # a cold boot with its files
        time.sleep(1.0)
        assert sbx.run("test -e /root/late").exit_code == 1, "a request answered with an error ran later"
    finally:
        sbx.terminate()


def test_a_sandbox_that_fills_its_memory_is_failed_with_the_oom_reason(client: Client) -> None:
    sbx = Sandbox.create("hungry", memory_mb=256, client=client)
    try:
        with pytest.raises(StasisError) as caught:
            sbx.run("python3 -c 'import time; x = b\"x\" * (600 << 20); time.sleep(5)'", timeout=120)
        info = sbx.info()
        assert info.status == S.FAILED
        assert "OOM" in (info.error or "") and "memory_mb" in (info.error or ""), info.error
        assert "OOM" in str(caught.value)
    finally:
        sbx.terminate()


def host_bytes(client: Client, sbx: Sandbox) -> int:
    return int(client.json("GET", "/v1/df")["sandboxes"][sbx.id])


def df_mb(sbx: Sandbox, column: str, path: str = "/") -> int:
    return int(sbx.run(f"df -m --output={column} {path} | tail -1").stdout)


def test_a_sandbox_has_a_disk_of_its_own_size_that_fills_up_inside_only(
    daemon: Daemon, client: Client, backend: str
) -> None:
    sbx = Sandbox.create("bounded", memory_mb=256, disk_mb=1536, backend=backend, client=client)
    try:
        size = df_mb(sbx, "size")
        assert 1536 * 0.9 < size <= 1536, f"df says / is {size} MiB"
        assert df_mb(sbx, "size", "/tmp") == size  # /tmp is on the disk, not in memory_mb
        assert sbx.run(f"fallocate -l {df_mb(sbx, 'avail') - 8}M /root/bulk").exit_code == 0
        full = sbx.run("head -c 64M /dev/zero > /tmp/more")
        assert full.exit_code != 0 and "No space left on device" in full.stderr, full.stderr
        assert sbx.info().status == S.RUNNING  # only its writes failed
        sbx.suspend()
        if backend == "gvisor":  # a suspended sandbox holds no loop device
            assert [dev for dev in loop_devices_under(daemon.paths.home) if sbx.id in dev] == []
        sbx.resume()
        assert sbx.run("rm /root/bulk /tmp/more && echo room > /root/ok && cat /root/ok").stdout == "room\n"
        assert df_mb(sbx, "size") == size
        if backend == "gvisor":  # what it deletes goes back to the host (`stasis df` counts allocated blocks)
            assert sbx.run("head -c 64M /dev/urandom > /root/big && sync").exit_code == 0
            grown = host_bytes(client, sbx)
            assert sbx.run("rm /root/big && sync").exit_code == 0
            wait_until(lambda: host_bytes(client, sbx) < grown - (48 << 20), timeout=20)
        files = sbx.checkpoint("filesystem")
        copy = Sandbox.create(snapshot_id=files.id, disk_mb=2048, client=client)
        try:  # a cold boot from its files, on a bigger disk
            assert df_mb(copy, "size") > size and copy.read_file("/root/ok") == b"room\n"
        finally:
            copy.terminate()
            Sandbox.delete_checkpoint(files.id, client=client)
    finally:
        sbx.terminate()


def test_a_fork_bomb_or_a_memory_hog_in_a_microvm_hits_a_limit_and_the_agent_survives(client: Client) -> None:
    sbx = Sandbox.create("bomber", memory_mb=512, backend="microvm", client=client)
    try:
        bomb = sbx.run("bomb() { bomb | bomb & }; bomb; sleep 600", timeout=20)
        assert bomb.timed_out and "process limit" in (bomb.limit or ""), bomb
        assert sbx.run("echo alive").stdout == "alive\n"
        assert int(sbx.run("ls /proc | grep -c '^[0-9]'").stdout) < 200, "the bomb's processes outlived its kill"
        hog = sbx.run("python3 -c 'x = [b\"x\" * (32 << 20) for _ in range(24)]'")  # 768 MiB, 32 at a time
        assert hog.exit_code in (137, -9) and "out-of-memory" in (hog.limit or ""), hog
        assert sbx.run("echo alive").stdout == "alive\n" and sbx.info().status == S.RUNNING
        assert sbx.run("true").limit is None
    finally:
        sbx.terminate()


def test_the_hostname_file_and_the_file_limit_are_the_sandboxs_own(client: Client, backend: str) -> None:
    sbx = Sandbox.create("named-box", memory_mb=256, backend=backend, client=client)
    try:
        wait_until(lambda: sbx.run("cat /etc/hostname").stdout.strip() == "named-box", timeout=10)
        if backend == "gvisor":
            assert sbx.run("ulimit -n").stdout.strip() == "8192"
    finally:
        sbx.terminate()


@pytest.fixture
def small_disk_daemon(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """A daemon whose home is a 320 MiB file system of its own, which the test fills."""
    from tests.conftest import new_home, terminate_all

    home = new_home("small-disk")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=320m,mode=700", "stasis-test-disk", str(home)], check=True)
    daemon = Daemon(home)
    try:
        yield daemon.start()
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            terminate_all(daemon)
            daemon.stop()
        subprocess.run(["umount", str(home)], check=True)


def test_a_full_disk_never_stops_a_sandbox_and_says_what_to_free(small_disk_daemon: Daemon) -> None:
    client = small_disk_daemon.client()
    home = small_disk_daemon.paths.home
    sbx = Sandbox.create("cramped", memory_mb=256, client=client)
    sbx.start_process(["sh", "-c", "while :; do date +%s%N > /root/tick; sleep 0.05; done"])
    # what a checkpoint must copy; synced, so that it is on the host before the host fills up
    assert sbx.run("head -c 48M /dev/urandom > /root/data && sync").exit_code == 0
    free = os.statvfs(home)
    fill_mb = (free.f_bavail * free.f_frsize >> 20) - 12  # leave a little: the store must still be writable
    filler = home / "filler"  # the host's disk fills up (something else on it, or other sandboxes)
    subprocess.run(["fallocate", "-l", f"{fill_mb}M", str(filler)], check=True)

    for attempt in (sbx.suspend, lambda: sbx.checkpoint("filesystem")):
        with pytest.raises(NoSpace, match="free disk space"):
            attempt()
        assert sbx.info().status == S.RUNNING
        assert_ticking(sbx)  # its processes never stopped
    assert Sandbox.list_checkpoints(client=client) == []
    assert not any((home / "checkpoints").glob("*"))

    # Room for the files but not the memory: the disk fills midway, which is the same 507 as the check before.
    filler.unlink()
    free = os.statvfs(home)
    subprocess.run(["fallocate", "-l", f"{(free.f_bavail * free.f_frsize >> 20) - 52}M", str(filler)], check=True)
    for attempt in (lambda: sbx.checkpoint("memory"), lambda: sbx.copy(times=1)):
        with pytest.raises(NoSpace, match="free disk space"):
            attempt()
        assert sbx.info().status == S.RUNNING
        assert_ticking(sbx)
    assert Sandbox.list_checkpoints(client=client) == [] and len(Sandbox.list(client=client)) == 1
    assert not any((home / "checkpoints").glob("*"))

    filler.unlink()
    sbx.suspend()
    assert sbx.resume().status == S.RUNNING
    assert_ticking(sbx)
    assert sbx.run("sha256sum /root/data").exit_code == 0


def assert_ticking(sbx: Sandbox) -> None:
    first = sbx.read_file("/root/tick")
    wait_until(lambda: sbx.read_file("/root/tick") != first)
