"""Round three of attacks: an archive a sandbox can swap never leads the host, or a client, outside its tree.

Issue 38's repros, as a process inside the sandbox runs them: it waits for the archive the agent writes and renames
a hostile one over it, in a loop, while the host asks for a FILESYSTEM checkpoint (fast storage) or a client
downloads a directory."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from stasis import Client, Sandbox, StasisError


def tar_of(*members: tuple[str, bytes, str]) -> bytes:
    """Members as (name, kind, link target or file content)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, value in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.REGTYPE:
                info.size = len(value)
                tar.addfile(info, io.BytesIO(value.encode()))
            else:
                info.linkname = value
                tar.addfile(info)
    return buffer.getvalue()


def swapper(pattern: str) -> str:
    """A loop in the sandbox that renames /tmp/evil.tar's copy over every file matching ``pattern``."""
    return (
        f'while :; do for f in {pattern}; do [ -e "$f" ] || continue; '
        'cp /tmp/evil.tar /tmp/.evil-copy && mv -f /tmp/.evil-copy "$f"; done; done'
    )


@pytest.fixture
def host_dir(tmp_path: Path) -> Path:
    victim = tmp_path / "host"
    victim.mkdir()
    (victim / "FILE").write_text("the host's own")
    (victim / "FILE").chmod(0o600)
    return victim


def test_a_swapped_fast_storage_archive_never_writes_or_reads_a_host_file(client: Client, host_dir: Path) -> None:
    evil = tar_of(
        ("root/s", tarfile.SYMTYPE, str(host_dir)),
        ("root/h", tarfile.LNKTYPE, "root/s/FILE"),
        ("root/h", tarfile.REGTYPE, "overwritten by the sandbox"),
    )
    sbx = Sandbox.create("swap-fast", storage="fast", memory_mb=512, client=client)
    try:
        sbx.write_file("/tmp/evil.tar", evil)
        loop = sbx.start_process(["sh", "-c", swapper("/tmp/.stasis-changes-*.tar")])
        outcomes = []
        for attempt in range(3):
            try:
                checkpoint = sbx.checkpoint(checkpoint_type="filesystem", name=f"swapped-{attempt}")
                outcomes.append(checkpoint.id)
            except StasisError as exc:  # refused, or the sandbox spoiled its own archive: never the host's file
                outcomes.append(str(exc))
            assert (host_dir / "FILE").read_text() == "the host's own", outcomes
            assert (host_dir / "FILE").stat().st_mode & 0o777 == 0o600
        sbx.kill_process(loop.id)
        for outcome in outcomes:
            if outcome.startswith("ck-"):  # a checkpoint made before the swap won: its files are the sandbox's
                child = Sandbox.create(snapshot_id=outcome, memory_mb=512, client=client)
                try:
                    assert "the host's own" not in child.run("cat /root/h /root/s/FILE 2>&1").stdout
                finally:
                    child.terminate()
    finally:
        sbx.terminate()


def test_a_swapped_download_never_writes_beside_the_destination(sandbox: Sandbox, tmp_path: Path) -> None:
    evil = tar_of(
        ("d", tarfile.SYMTYPE, "."), ("e", tarfile.SYMTYPE, "d/d/.."), ("e/escaped.txt", tarfile.REGTYPE, "x")
    )
    sandbox.run("mkdir -p /root/proj && echo kept > /root/proj/file")
    sandbox.write_file("/tmp/evil.tar", evil)
    loop = sandbox.start_process(["sh", "-c", swapper("/var/lib/stasis/transfers/*.tar")])
    try:
        for attempt in range(3):
            dest = tmp_path / "downloads" / f"try-{attempt}"
            try:
                sandbox.download_dir("/root/proj", dest)
                assert (dest / "file").read_text() == "kept\n"
            except StasisError as exc:
                assert "not unpacked" in str(exc)
            assert not list(tmp_path.rglob("escaped.txt"))
            made = {p.name for p in (tmp_path / "downloads").iterdir()}
            assert made <= {f"try-{n}" for n in range(3)}, made  # no staging left, nothing beside
    finally:
        sandbox.kill_process(loop.id)
