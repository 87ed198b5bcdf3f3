"""Fast storage (gVisor): the writable layer lives in the sandbox's kernel, not in the host's overlay.

What a user relies on: its files survive a suspend, a fork and both kinds of checkpoint (a
FILESYSTEM one is read through the sandbox, deletions and named pipes included); the host never sees them; a
sandbox killed on the host boots again from its image and its last FILESYSTEM checkpoint still holds them."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from stasis import Client, InvalidRequest, Sandbox, SandboxStatus
from tests.conftest import Daemon, wait_until
from tests.daemon.test_hardening import host_pid

S = SandboxStatus

WRITE = """
set -e
mkdir -p /root/proj/sub && cd /root/proj
for i in $(seq 300); do echo "file $i" > sub/f$i; done
printf 'binary\\0bytes' > data.bin && chmod 640 data.bin && chown 1000:1000 data.bin
ln -s sub/f1 link && ln sub/f2 hard && mkfifo pipe
rm /etc/issue && rm -r /usr/share/doc
chmod 0711 /root
"""

CHECK = """
cd /root/proj
ls sub | wc -l; cat sub/f300; od -c data.bin | head -1; stat -c '%a %u:%g' data.bin
readlink link; stat -c '%h' hard; stat -c '%F' pipe
test -e /etc/issue && echo issue-back || echo issue-gone
test -e /usr/share/doc && echo doc-back || echo doc-gone
stat -c '%a' /root
"""


def expected(out: str) -> None:
    lines = out.splitlines()
    assert lines[0].strip() == "300", out
    assert lines[1] == "file 300"
    assert "b   i   n   a   r   y  \\0   b   y   t   e   s" in lines[2]
    assert lines[3:] == ["640 1000:1000", "sub/f1", "2", "fifo", "issue-gone", "doc-gone", "711"], out


@pytest.fixture
def fast(client: Client) -> Iterator[Sandbox]:
    sbx = Sandbox.create("fast", storage="fast", memory_mb=512, client=client)
    yield sbx
    sbx.terminate()


def test_files_live_in_the_kernel_and_survive_suspend_fork_and_checkpoints(
    daemon: Daemon, client: Client, fast: Sandbox
) -> None:
    assert fast.info().spec.storage == "fast"
    assert fast.run(WRITE).exit_code == 0
    layer = daemon.paths.sandboxes / fast.id / "disk" / "upper"
    assert not (layer / "root").exists(), "fast storage writes into the host's overlay"
    expected(fast.run(CHECK).stdout)

    fast.suspend()
    fast.resume()
    expected(fast.run(CHECK).stdout)

    made: list[Sandbox] = []
    checkpoints = [fast.checkpoint("filesystem"), fast.checkpoint("memory")]
    try:
        files = daemon.paths.home / "checkpoints" / checkpoints[0].id / "files"
        assert (files / "root/proj/sub/f300").read_text() == "file 300\n"
        assert not any(files.glob(".gvisor.filestore.*")) and not (files / "opt/stasis-image").exists()
        made.append(Sandbox.create(snapshot_id=checkpoints[0].id, storage="durable", client=client))  # the files
        made.append(Sandbox.create(snapshot_id=checkpoints[0].id, client=client))  # the storage it was made with
        made.append(Sandbox.create(snapshot_id=checkpoints[1].id, client=client))  # its kernel, and so its files
        made += fast.copy(times=1)
        assert [box.info().spec.storage for box in made] == ["durable", "fast", "fast", "fast"]
        for box in made:
            expected(box.run(CHECK).stdout)
        memory_layer = daemon.paths.home / "checkpoints" / checkpoints[1].id / "files"
        assert not any(memory_layer.glob(".gvisor.filestore.*")), "runsc's backing file copied into a checkpoint"
        with pytest.raises(InvalidRequest, match="MEMORY restore keeps it"):
            Sandbox.create(snapshot_id=checkpoints[1].id, storage="durable", client=client)
    finally:
        for box in made:
            box.terminate()
        for checkpoint in checkpoints:
            Sandbox.delete_checkpoint(checkpoint.id, client=client)


def test_a_sandbox_killed_on_the_host_boots_from_its_image_and_its_checkpoint_keeps_the_files(
    daemon: Daemon, client: Client, fast: Sandbox
) -> None:
    """The trade named in the README: files written since create (or the last restore) die with the sentry."""
    assert fast.run(WRITE).exit_code == 0
    saved = fast.checkpoint("filesystem")
    try:
        assert fast.run("echo after > /root/after").exit_code == 0
        os.kill(host_pid(daemon, fast, "gvisor"), signal.SIGKILL)
        wait_until(lambda: fast.info().status == S.FAILED, timeout=30)
        fast.resume()  # a cold boot
        assert fast.run("test -e /root/proj || test -e /root/after || echo gone").stdout == "gone\n"
        assert fast.run("test -e /etc/issue && echo back").stdout == "back\n"  # the image's
        again = Sandbox.create(snapshot_id=saved.id, storage="fast", client=client)
        try:
            expected(again.run(CHECK).stdout)
        finally:
            again.terminate()
    finally:
        Sandbox.delete_checkpoint(saved.id, client=client)


def test_its_disk_is_still_its_disk_mb(client: Client) -> None:
    """The layer's backing file lives on the sandbox's own disk: past ``disk_mb`` a write fails inside, with
    ENOSPC, and the sandbox lives on (`df /` shows no size: the layer is gVisor's, not the disk's)."""
    sbx = Sandbox.create("fast-full", storage="fast", memory_mb=256, disk_mb=512, client=client)
    try:
        full = sbx.run("dd if=/dev/zero of=/root/big bs=1M count=700", timeout=600)
        assert full.exit_code != 0 and "No space left on device" in full.stderr, full.stderr
        assert sbx.run("rm /root/big && echo fine > /root/small && cat /root/small").stdout == "fine\n"
        sbx.suspend()
        assert sbx.run("cat /root/small").stdout == "fine\n"
    finally:
        sbx.terminate()


def test_fast_storage_is_refused_on_a_microvm(client: Client) -> None:
    with pytest.raises(InvalidRequest, match="storage 'fast' keeps the writable layer in gVisor's kernel"):
        Sandbox.create("no-fast-vm", storage="fast", backend="microvm", client=client)
