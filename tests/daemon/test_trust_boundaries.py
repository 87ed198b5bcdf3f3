"""Round two of attacks: what a sandbox writes is never the host's truth, and a request the daemon gave up
on never runs later."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from stasis import Client, GuestTimeout, InvalidRequest, Sandbox, mountns
from stasis.backends.gvisor import disk
from stasis.images.recipe import RECIPES
from tests.conftest import Daemon, loop_devices_under, wait_until
from tests.daemon.test_hardening import host_pid


def test_an_image_record_planted_in_a_sandbox_never_gives_another_the_hosts_root(
    daemon: Daemon, client: Client, backend: str
) -> None:
    """The attack of issue 23: an image.json in a sandbox's own files, its rootfs a link to /, named through a
    key that climbs out of the image directory. Creating a sandbox from that key is refused."""
    src = Sandbox.create("planter-images", memory_mb=256, backend=backend, client=client)
    try:
        recipe_key = RECIPES["default"].key
        evil = src.info().id
        record = {"name": "default", "key": "x", "digest": "d", "packages": [], "suite": "s", "size_bytes": 0,
                  "built_at": 0, "build_seconds": 0, "path": "/"}  # fmt: skip
        assert src.run("mkdir -p /root/evil && ln -s / /root/evil/rootfs").exit_code == 0
        src.write_file("/root/evil/image.json", json.dumps(record).encode())
        upper = daemon.paths.home / "sandboxes" / evil / "disk" / "upper" / "root" / "evil"
        climb = os.path.relpath(upper, daemon.paths.images / recipe_key)
        before = {s.id for s in Sandbox.list(client=client)}
        for key in (f"{recipe_key}/{climb}", f"{recipe_key}/../{recipe_key}", "../images", "/etc"):
            with pytest.raises(InvalidRequest):
                Sandbox.create(image=key, memory_mb=256, backend=backend, client=client)
        assert {s.id for s in Sandbox.list(client=client)} == before  # nothing half-made
    finally:
        src.terminate()


# Both guards are needed: under gVisor the agent's clock is the host's and expiry alone refuses the request;
# a TCG microVM's clock can fall behind while QEMU is stopped (a fresh-clone run once saw the request run on
# expiry alone), and there the daemon's cancel line, read in the same batch as the request, drops it.
@pytest.mark.parametrize("backend", ["gvisor", "microvm"])
def test_a_request_that_reaches_the_agent_after_the_daemon_gave_up_never_runs(
    daemon: Daemon, client: Client, backend: str
) -> None:
    """The sandbox is stopped on the host (as a starved or SIGSTOPped sentry would be): the request times out
    with an error, and when the sandbox goes on, the request still in its channel is refused, not run."""
    sbx = Sandbox.create("late-requests", memory_mb=256, backend=backend, client=client)
    try:
        pid = host_pid(daemon, sbx, backend)
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(GuestTimeout):
                sbx.run("touch /root/late-1", timeout=1)  # given up 1 s + EXEC_REPLY_GRACE later
        finally:
            os.kill(pid, signal.SIGCONT)
        sbx.run("sync")  # the agent answers again, and has read what waited in its channel by now
        time.sleep(1)
        assert sbx.run("ls /root").stdout.split().count("late-1") == 0
        assert sbx.run("echo alive").stdout == "alive\n"
    finally:
        sbx.terminate()


PINNERS = {
    "ip netns exec": lambda netns: ["ip", "netns", "exec", netns, "sleep", "600"],  # its copies are slaves
    "unshare -m": lambda netns: ["unshare", "-m", "sleep", "600"],  # util-linux's default: private copies
}


@pytest.mark.parametrize("pinner", PINNERS)
def test_a_mount_namespace_made_later_never_keeps_a_suspended_sandboxs_disk(daemon: Daemon, client: Client,
                                                                           pinner: str) -> None:  # fmt: skip
    """Any tool that makes a mount namespace on the host copies the host's mounts. A sandbox's disk is mounted in
    the daemon's own namespace (gVisor; a microVM's disk is a file QEMU holds), so the copy never has it: a
    suspend releases the disk at once, and its resume mounts it again."""
    sbx = Sandbox.create("pinned", memory_mb=256, backend="gvisor", client=client)
    netns = f"stasis-pin-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    held_open = subprocess.Popen(PINNERS[pinner](netns), start_new_session=True)
    try:
        sbx.write_file("/root/kept", b"kept")
        namespace = f"/proc/{held_open.pid}/ns/mnt"
        wait_until(lambda: Path(f"/proc/{held_open.pid}/comm").read_text().strip() == "sleep", timeout=30)
        assert os.readlink(namespace) != os.readlink("/proc/self/ns/mnt")  # it made a mount namespace of its own
        directory = str(daemon.paths.home / "sandboxes" / sbx.id)
        assert [
            line for line in Path(f"/proc/{held_open.pid}/mounts").read_text().splitlines() if directory in line
        ] == []
        sbx.suspend()
        held_by = disk.holders(daemon.paths.home / "sandboxes")
        assert [m for m in loop_devices_under(daemon.paths.home) if sbx.id in m] == [], held_by
        sbx.resume()
        assert sbx.read_file("/root/kept") == b"kept"
    finally:
        os.killpg(held_open.pid, signal.SIGKILL)  # ip may run the command as a child of its own
        held_open.wait()
        subprocess.run(["ip", "netns", "del", netns], check=False)
        sbx.terminate()


def test_a_clean_stop_unpins_the_mount_namespace_unless_a_disk_is_mounted_in_it(own_daemon: Daemon) -> None:
    """The daemon's mount namespace is pinned for the next daemon while a sandbox's disk is mounted in it (a
    sandbox left running); a SIGTERM stop with none mounted lets it go, leaving nothing on the host."""
    pin = own_daemon.paths.mount_pin
    own_daemon.start()
    Sandbox.create("stays", memory_mb=256, backend="gvisor", client=own_daemon.client())
    own_daemon.stop()
    assert mountns.pinned(pin)  # its disk is mounted there: the next daemon finds it
    own_daemon.start()
    Sandbox.connect("stays", client=own_daemon.client()).terminate()
    own_daemon.stop()
    assert not mountns.pinned(pin)
