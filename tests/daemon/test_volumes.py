"""Volumes: files that outlive sandboxes, mounted by several at once, kept across suspend and forks, snapshotted and
forked; what a sandbox leaves in one never leads the host outside it."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from stasis import Client, Conflict, InvalidRequest, NotFound, Sandbox, Volume, volume_files
from stasis.models import CheckpointType
from stasis.volumes import Volumes
from tests.conftest import Daemon


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_a_volume_is_shared_kept_across_suspend_and_forks_and_outlives_its_sandboxes(client: Client) -> None:
    volume = Volume.create(unique("vol"), client=client)
    writer = Sandbox.create(backend="gvisor", volumes={"/data": volume.name}, client=client)
    reader = Sandbox.create(backend="gvisor", volumes={"/data": {"name": volume.name, "read_only": True}},
                            client=client)  # fmt: skip
    try:
        assert writer.run(["sh", "-c", "echo from-writer > /data/note.txt && mkdir -p /data/sub"]).exit_code == 0
        assert reader.run(["cat", "/data/note.txt"]).stdout == "from-writer\n"  # one writes, the other reads
        refused = reader.run(["sh", "-c", "echo no > /data/other.txt"])
        assert refused.exit_code != 0 and "Read-only" in refused.stderr
        assert set(volume.info().mounted_by) == {writer.id, reader.id}
        with pytest.raises(Conflict, match="mounted by"):
            volume.delete()

        writer.suspend()
        writer.resume()  # the volume is mounted again; what the sandbox had open and wrote is there
        assert writer.run(["sh", "-c", "cat /data/note.txt; echo after-resume >> /data/note.txt"]).stdout == (
            "from-writer\n"
        )
        assert reader.run(["cat", "/data/note.txt"]).stdout == "from-writer\nafter-resume\n"

        checkpoint = writer.checkpoint(CheckpointType.MEMORY)
        (child,) = Sandbox.fork(checkpoint.id, client=client)  # a fork mounts the same volume, not a copy of it
        try:
            child.run(["sh", "-c", "echo from-the-fork > /data/fork.txt"])
            assert writer.run(["cat", "/data/fork.txt"]).stdout == "from-the-fork\n"
        finally:
            child.terminate()
            Sandbox.delete_checkpoint(checkpoint.id, client=client)
    finally:
        writer.terminate()
        reader.terminate()
    names = {e["name"]: e["type"] for e in volume.files("/")}
    assert names == {"note.txt": "file", "sub": "directory", "fork.txt": "file"}  # after every sandbox is gone
    later = Sandbox.create(backend="gvisor", volumes={"/srv/data": volume.name}, client=client)
    try:
        assert later.run(["cat", "/srv/data/note.txt"]).stdout == "from-writer\nafter-resume\n"
    finally:
        later.terminate()
    volume.delete()
    assert volume.name not in {v.name for v in Volume.list(client=client)}


def test_a_snapshot_forks_into_a_volume_that_diverges(client: Client) -> None:
    volume = Volume.create(unique("orig"), client=client)
    sbx = Sandbox.create(backend="gvisor", volumes={"/data": volume.name}, client=client)
    try:
        sbx.run(["sh", "-c", "echo v1 > /data/state.txt && ln -s /etc/passwd /data/link"])
        snapshot = volume.snapshot(unique("snap"))
        fork = Volume.create(unique("fork"), from_snapshot=snapshot.name, client=client)
        sbx.run(["sh", "-c", "echo v2 > /data/state.txt"])
        forked = Sandbox.create(backend="gvisor", volumes={"/data": fork.name}, client=client)
        try:
            assert forked.run(["cat", "/data/state.txt"]).stdout == "v1\n"  # the snapshot's instant
            forked.run(["sh", "-c", "echo fork-only > /data/state.txt"])
            assert sbx.run(["cat", "/data/state.txt"]).stdout == "v2\n"  # each diverges
            assert forked.run(["readlink", "/data/link"]).stdout == "/etc/passwd\n"  # a link copied as a link
        finally:
            forked.terminate()
        assert Volume.create(unique("again"), from_snapshot=snapshot.id, client=client).files() != []
    finally:
        sbx.terminate()
    for v in Volume.list(client=client):
        if v.from_snapshot == snapshot.id or v.name == volume.name:
            Volume(v.name, client).delete()
    Volume.delete_snapshot(snapshot.id, client=client)


def test_volume_mistakes_are_clear_errors(client: Client) -> None:
    with pytest.raises(NotFound, match="no volume named"):
        Sandbox.create(backend="gvisor", volumes={"/data": "no-such-volume"}, client=client)
    assert not [s for s in Sandbox.list(client=client) if any(m.name == "no-such-volume" for m in s.spec.volumes)]
    with pytest.raises(InvalidRequest, match="gVisor sandboxes only"):
        Sandbox.create(backend="microvm", volumes={"/data": "whatever"}, client=client)
    with pytest.raises(InvalidRequest, match="sandbox's own files"):
        Sandbox.create(backend="gvisor", volumes={"/proc/x": "whatever"}, client=client)
    with pytest.raises(InvalidRequest, match="invalid volume name"):
        Volume.create("../escape", client=client)


@pytest.mark.fast
def test_the_host_never_follows_what_a_sandbox_left_in_a_volume(tmp_path: Path) -> None:
    store = Volumes(tmp_path / "volumes")
    store.create("v")
    data = store.data("v")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key").write_text("host only")
    os.symlink(tmp_path / "secret", data / "escape")  # what a sandbox could leave
    (data / "dir").mkdir()
    listed = {e["name"]: e["type"] for e in store.files("v", "/")}
    assert listed == {"escape": "symlink", "dir": "directory"}
    for path in ("/escape", "escape/", "dir/../escape"):
        with pytest.raises((NotFound, InvalidRequest)):
            store.files("v", path)
    for name in ("..", "../x", "/etc", ".snapshots", "a/b"):
        with pytest.raises(InvalidRequest):
            store.get(name)
    (data / "big").write_bytes(b"x" * 4096)
    for i in range(50):  # one file, many names: copied once, linked after (never 50 copies)
        os.link(data / "big", data / f"name-{i}")
    os.mkfifo(data / "fifo")  # nothing a snapshot opens: left out
    with open(data / "sparse", "wb") as f:
        f.truncate(1 << 40)  # a terabyte of holes: stays holes
    snap = store.take_snapshot("v")
    fork = store.create("w", from_snapshot=snap.id)
    copied = store.data("w")
    assert os.stat(copied / "big").st_nlink == 51 and (copied / "name-7").read_bytes() == b"x" * 4096
    assert not (copied / "fifo").exists() and os.stat(copied / "sparse").st_blocks == 0
    assert os.readlink(store.data("w") / "escape") == str(tmp_path / "secret") and fork.from_snapshot == snap.id
    assert not (store.data("w") / "escape").is_dir() or (store.data("w") / "escape").is_symlink()


@pytest.mark.fast
def test_the_content_operations_never_go_through_a_link_a_sandbox_left(tmp_path: Path) -> None:
    root, outside = tmp_path / "data", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "keep.txt").write_text("host's")
    os.symlink(outside, root / "linkdir")
    os.symlink(outside / "keep.txt", root / "linkfile")
    (root / "real").mkdir()
    os.symlink(outside, root / "real" / "inner")
    owner = (os.getuid(), os.getgid(), 0o644)
    with pytest.raises(InvalidRequest, match="not a file"):
        list(volume_files.read(root, "/linkfile"))
    with pytest.raises(NotFound):
        volume_files.write(root, "/linkdir/new.txt", iter([b"x"]), owner, parents=True)
    with pytest.raises(NotFound):
        volume_files.make_dir(root, "/linkdir/sub", owner, parents=True)
    written = volume_files.write(root, "/linkfile", iter([b"replaced"]), owner, parents=False)
    assert written["type"] == "file" and (root / "linkfile").read_text() == "replaced"  # the link replaced
    volume_files.remove(root, "/linkdir")  # the link goes, not what it points to
    volume_files.remove(root, "/real")  # a directory holding a link to outside: the link goes with it
    volume_files.change(root, "/", None, None, 0o755)
    assert (outside / "keep.txt").read_text() == "host's" and not (root / "linkdir").exists()
    for path in ("../outside", "a/../../outside", "x\0y"):
        with pytest.raises(InvalidRequest):
            volume_files.stat_path(root, path)
    made = volume_files.make_dir(root, "/a/b/c", owner, parents=True)
    volume_files.write(root, "/a/b/c/f.txt", iter([b"1", b"2"]), (owner[0], owner[1], 0o600), parents=False)
    assert made["type"] == "directory" and [e["path"] for e in volume_files.list_dir(root, "/a", depth=3)] == [
        "/a/b", "/a/b/c", "/a/b/c/f.txt"]  # fmt: skip
    assert b"".join(volume_files.read(root, "a/b/c/f.txt")) == b"12"
    assert volume_files.stat_path(root, "/a/b/c/f.txt")["mode"] == 0o600


def test_a_daemon_killed_under_a_sandbox_with_a_volume_brings_both_back(own_daemon: Daemon) -> None:
    own_daemon.start()
    with own_daemon.client() as client:
        volume = Volume.create("kept", client=client)
        running = Sandbox.create("running", backend="gvisor", volumes={"/data": "kept"}, client=client)
        parked = Sandbox.create("parked", backend="gvisor", volumes={"/data": "kept"}, client=client)
        running.run(["sh", "-c", "echo before > /data/state.txt"])
        parked.suspend()
    own_daemon.kill()
    own_daemon.start()
    with own_daemon.client() as client:
        running, parked = Sandbox.connect("running", client=client), Sandbox.connect("parked", client=client)
        running.run(["sh", "-c", "echo after-the-kill >> /data/state.txt"])  # still mounted: the sandbox lived on
        parked.resume()  # restored by the new daemon, from a bundle that names the volume again
        assert parked.run(["cat", "/data/state.txt"]).stdout == "before\nafter-the-kill\n"
        assert set(Volume.get("kept", client=client).info().mounted_by) == {running.id, parked.id}
        running.terminate()
        parked.terminate()
        volume = Volume.get("kept", client=client)
        volume.delete()


def test_a_volume_keeps_to_its_size_limit_and_its_forks_keep_the_limit(client: Client) -> None:
    volume = Volume.create(unique("limited"), max_size_mb=32, client=client)
    info = volume.info()
    assert (info.store, info.max_size_mb) == ("btrfs", 32)  # this machine has btrfs: snapshots copy nothing
    sbx = Sandbox.create(backend="gvisor", volumes={"/data": volume.name}, client=client)
    try:
        over = sbx.run(["sh", "-c", "echo kept > /data/small.txt; head -c 64M /dev/urandom > /data/big"])
        assert over.exit_code != 0 and "quota" in over.stderr.lower(), over.stderr  # EDQUOT, in the sandbox
        assert sbx.run(["cat", "/data/small.txt"]).stdout == "kept\n"
        volume.set_max_size(None)
        assert sbx.run(["sh", "-c", "head -c 64M /dev/urandom > /data/big"]).exit_code == 0  # no limit now
        assert volume.set_max_size(96).max_size_mb == 96
        snapshot = volume.snapshot()
        fork = Volume.create(unique("limited-fork"), from_snapshot=snapshot.id, client=client)
        assert fork.info().max_size_mb == 96 and {e["name"] for e in fork.files()} == {"small.txt", "big"}
        fork.delete()
        Volume.delete_snapshot(snapshot.id, client=client)
    finally:
        sbx.terminate()
    volume.delete()
    with pytest.raises(InvalidRequest, match="max_size_mb"):
        Volume.create(unique("zero"), max_size_mb=0, client=client)


def test_without_btrfs_volumes_are_directories_and_a_size_limit_is_refused(own_daemon: Daemon) -> None:
    own_daemon.start(STASIS_VOLUME_STORE="copy")
    with own_daemon.client() as client:
        with pytest.raises(InvalidRequest, match="needs the btrfs volume store"):
            Volume.create("limited", max_size_mb=64, client=client)
        volume = Volume.create("plain", client=client)
        assert volume.info().store == "copy"
        sbx = Sandbox.create(backend="gvisor", volumes={"/data": "plain"}, client=client)
        try:
            sbx.run(["sh", "-c", "echo one > /data/f.txt"])
            fork = Volume.create("plain-fork", from_snapshot=volume.snapshot().id, client=client)
            sbx.run(["sh", "-c", "echo the-second-one > /data/f.txt"])
        finally:
            sbx.terminate()
        assert fork.info().store == "copy" and [(e["name"], e["size"]) for e in fork.files()] == [("f.txt", 4)]
    assert not own_daemon.paths.volume_image.exists()


def test_a_checkpoint_that_includes_its_volumes_restores_and_forks_them_as_they_were(client: Client) -> None:
    volume = Volume.create(unique("kept"), client=client)
    sbx = Sandbox.create(backend="gvisor", volumes={"/data": volume.name}, client=client)
    made: list[Sandbox] = []
    try:
        sbx.run(["sh", "-c", "echo at-the-checkpoint > /data/state.txt"])
        included = sbx.checkpoint(CheckpointType.MEMORY, include_volumes=True)
        plain = sbx.checkpoint(CheckpointType.MEMORY)
        assert list(included.volume_snapshots) == [volume.name] and plain.volume_snapshots == {}
        sbx.run(["sh", "-c", "echo later > /data/state.txt"])

        made.append(Sandbox.create(snapshot_id=included.id, client=client))
        made += Sandbox.fork(included.id, 2, client=client)
        forks = [s.info().spec.volumes[0] for s in made]
        assert len({m.name for m in forks} | {volume.name}) == 4 and {m.path for m in forks} == {"/data"}
        made[1].run(["sh", "-c", "echo one-child > /data/state.txt"])  # each has its own fork: they diverge
        assert [s.run(["cat", "/data/state.txt"]).stdout for s in made] == [
            "at-the-checkpoint\n", "one-child\n", "at-the-checkpoint\n"]  # fmt: skip
        assert sbx.run(["cat", "/data/state.txt"]).stdout == "later\n"  # the volume itself is untouched

        made.append(Sandbox.create(snapshot_id=plain.id, client=client))  # without: the volume as it is now
        assert made[-1].run(["cat", "/data/state.txt"]).stdout == "later\n"
        Sandbox.delete_checkpoint(included.id, client=client)  # its snapshots go with it
        Sandbox.delete_checkpoint(plain.id, client=client)
        assert Volume.snapshots(volume.name, client=client) == []
    finally:
        for s in [*made, sbx]:
            s.terminate()
    for v in Volume.list(client=client):
        if v.name.startswith(volume.name):
            Volume(v.name, client).delete()
