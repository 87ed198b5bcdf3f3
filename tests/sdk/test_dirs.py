"""upload_dir / download_dir: whole directories as tar streams, binary-safe, atomic on the far side."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from stasis import Sandbox, StasisError
from stasis.sdk._base import Call
from tests.conftest import wait_until


@pytest.fixture
def sandbox(shared_sandbox: Sandbox) -> Sandbox:
    """One sandbox per backend for the module: its subject is moving directories, not a sandbox's life (the two
    suspends below have their own)."""
    return shared_sandbox


def tree(root: Path) -> Path:
    (root / "src/pkg/empty").mkdir(parents=True)
    (root / "src/pkg/data.bin").write_bytes(bytes(range(256)) * 1000)
    (root / "src/run.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(root / "src/run.sh", 0o755)
    (root / "src/link").symlink_to("pkg/data.bin")
    return root / "src"


def snapshot(root: Path) -> dict[str, tuple[str, int, bytes]]:
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = ("link", 0, os.readlink(path).encode())
        elif path.is_dir():
            found[rel] = ("dir", 0, b"")
        else:
            found[rel] = ("file", path.stat().st_mode & 0o777, path.read_bytes())
    return found


def test_a_directory_goes_in_and_comes_back_the_same(sandbox: Sandbox, tmp_path: Path) -> None:
    local = tree(tmp_path / "local")
    entry = sandbox.upload_dir(local, "/root/project")
    assert entry.type == "directory"
    assert (
        sandbox.run("cd /root/project && ./run.sh && readlink link && ls pkg").stdout
        == "ran\npkg/data.bin\ndata.bin\nempty\n"
    )
    back = sandbox.download_dir("/root/project", tmp_path / "back")
    assert snapshot(back) == snapshot(local)
    assert sandbox.run("ls -A /var/lib/stasis/transfers | wc -l").stdout == "0\n"  # its archive gone on return
    with pytest.raises(StasisError, match="exists"):
        sandbox.upload_dir(local, "/root/project")  # not over a directory that is there, unless asked
    (local / "run.sh").unlink()
    sandbox.upload_dir(local, "/root/project", replace=True)
    assert sandbox.run("test -e /root/project/run.sh").exit_code == 1  # replaced, not merged
    with pytest.raises(StasisError, match="not a directory"):
        sandbox.download_dir("/root/project/pkg/data.bin", tmp_path / "nope")
    assert sandbox.run("ls -A /var/lib/stasis/transfers | wc -l").stdout == "0\n"  # a refusal leaves no archive


def test_a_tar_that_leaves_its_directory_is_refused_whole(sandbox: Sandbox) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in ("ok.txt", "../escaped.txt"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    call = Call("PUT", f"/v1/sandboxes/{sandbox.id}/dirs", params={"path": "/root/unpacked"}, content=buffer.getvalue())
    with pytest.raises(StasisError, match="leaves the directory"):
        sandbox._client.call(call)
    assert (
        sandbox.run("ls /root/escaped.txt /root/unpacked 2>&1; ls /var/lib/stasis/transfers | wc -l").stdout.split()[-1]
        == "0"
    )
    assert sandbox.run("test -e /root/escaped.txt || test -e /root/unpacked").exit_code == 1


def test_replacing_a_directory_a_process_works_in_leaves_the_sandbox_suspendable(
    own_sandbox: Sandbox, tmp_path: Path
) -> None:
    """upload_dir(replace=True) keeps the directory itself: a process whose cwd it is stays on a live directory,
    so the next suspend saves it (gVisor cannot save a process on a deleted one)."""
    local = tree(tmp_path / "local")
    own_sandbox.upload_dir(local, "/root/work")
    worker = own_sandbox.start_process("cd /root/work/pkg && while :; do pwd > /tmp/where; sleep 0.2; done")
    (local / "run.sh").write_text("#!/bin/sh\necho new\n")
    (local / "pkg/data.bin").unlink()
    (local / "added").mkdir()
    own_sandbox.upload_dir(local, "/root/work", replace=True)
    replaced = own_sandbox.run("cd /root/work && ./run.sh && ls pkg && test -d added -a ! -e pkg/data.bin")
    assert replaced.stdout == "new\nempty\n"
    own_sandbox.suspend()
    own_sandbox.resume()
    assert own_sandbox.info().status.value == "running"
    assert own_sandbox.get_process(worker.id).status == "running"


def test_a_process_on_a_deleted_directory_makes_suspend_an_error_and_leaves_the_sandbox_running(
    own_sandbox: Sandbox,
) -> None:
    own_sandbox.start_process("mkdir /root/gone && cd /root/gone && rmdir /root/gone && exec sleep 600")
    wait_until(lambda: own_sandbox.run("test ! -e /root/gone && pgrep -x sleep").exit_code == 0)
    if own_sandbox.info().spec.backend == "microvm":  # a VM's memory holds the directory: it just suspends
        own_sandbox.suspend()
        own_sandbox.resume()
    else:
        with pytest.raises(StasisError, match=r"deleted \('.*gone'\).*still running"):
            own_sandbox.suspend()
    assert own_sandbox.info().status.value == "running"
    assert own_sandbox.run("echo ok").stdout == "ok\n"


def test_a_link_may_point_anywhere_but_nothing_is_written_through_one(sandbox: Sandbox) -> None:
    """In the sandbox a workspace's `ln -s /etc` comes back as that link; a member under it, or of its name, would
    write outside the directory: the whole archive is refused, nothing written."""

    def archive(*members: tuple[str, str | None]) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name, link in members:
                info = tarfile.TarInfo(name)
                if link is None:
                    info.size = 2
                    tar.addfile(info, io.BytesIO(b"hi"))
                else:
                    info.type, info.linkname = tarfile.SYMTYPE, link
                    tar.addfile(info)
        return buffer.getvalue()

    sandbox.upload_tar(archive(("etc-link", "/etc"), ("notes.txt", None)), "/root/linked")
    assert sandbox.run("readlink /root/linked/etc-link; cat /root/linked/notes.txt").stdout == "/etc\nhi"
    for members in ([("etc-link", "/etc"), ("etc-link/evil.conf", None)], [("x", "/etc/passwd"), ("x", None)]):
        with pytest.raises(StasisError, match=r"written through the link|appears twice"):
            sandbox.upload_tar(archive(*members), "/root/through", replace=True)
    assert sandbox.run("test ! -e /etc/evil.conf && test ! -e /root/through && head -c 5 /etc/passwd").stdout == "root:"
