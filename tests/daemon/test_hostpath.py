"""Every place a string from a client, an image's metadata, a manifest or a sandbox becomes a host path goes
through ``stasis.hostpath.child``; this lists those places and tries each with traversal strings."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from stasis import hostpath
from stasis.daemon.core.checkpoints import CheckpointFiles
from stasis.daemon.faces.e2b.records import Records
from stasis.daemon.faces.e2b.templates import Templates
from stasis.daemon.rooms.ssh import HostKeys
from stasis.errors import ImageNotFound, InvalidRequest, NotFound
from stasis.images.store import ImageStore
from stasis.remote.cache import ChunkCache

pytestmark = pytest.mark.fast

SRC = Path(__file__).parents[2] / "src" / "stasis"
# Each module that turns an untrusted string into a host path, with what it validates there.
CALLERS = {
    "images/store.py": "image keys (a client's image name, image.json, a remote manifest's image)",
    "daemon/core/checkpoints.py": "checkpoint ids (a client's ref resolved by the store, a remote manifest's)",
    "daemon/core/boxes.py": "a sandbox's directory (its id: from the store, or a remote manifest)",
    "daemon/rooms/remote.py": "a pulled sandbox's directory, a base disk's UUID from a manifest",
    "daemon/rooms/ssh.py": "a sandbox's host key folder",
    "remote/cache.py": "piece hashes from a manifest",
    "backends/microvm/boot_snapshots.py": "a boot snapshot's key",
    "daemon/faces/e2b/records.py": "an E2B record (a sandbox id)",
    "daemon/faces/e2b/templates.py": "an E2B template's record (its id) and a build's log (its id)",
    "volumes.py": "a volume's name and a volume snapshot's id",
}
TRAVERSALS = ["..", "../x", "a/../../b", "/etc", "x/y", ".hidden", "", "a\0b", "default-0123/../../home", "é" * 3]


def test_the_callers_are_the_ones_listed() -> None:
    found = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if "hostpath.child(" in p.read_text()}
    assert found == set(CALLERS)


@pytest.mark.parametrize("name", TRAVERSALS)
def test_child_takes_one_plain_component_only(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidRequest, match="invalid thing"):
        hostpath.child(tmp_path, name, "thing")
    assert hostpath.child(tmp_path, "default-0123abcd", "thing") == tmp_path / "default-0123abcd"


@pytest.mark.parametrize("name", TRAVERSALS)
def test_every_caller_refuses_a_traversal(tmp_path: Path, name: str) -> None:
    images = ImageStore(tmp_path / "images")
    for lookup in (images.by_key, images.rootfs_by_key):
        with pytest.raises(InvalidRequest):
            lookup(name)
    with pytest.raises(InvalidRequest):
        CheckpointFiles(tmp_path / "checkpoints").path(name)
    with pytest.raises(InvalidRequest):
        ChunkCache(tmp_path / "cache", 1 << 20).get(name)
    with pytest.raises(InvalidRequest):
        asyncio.run(HostKeys(tmp_path / "keys").get(name))
    with pytest.raises(InvalidRequest):
        Records(tmp_path / "e2b").get(name)
    templates = Templates(tmp_path)
    with pytest.raises(NotFound):  # an id is 20 lower-case letters or digits, checked before any path is made
        templates.get(name)
    for by_build_id in (templates.entries, templates._log_path, templates.file):
        with pytest.raises(InvalidRequest):
            by_build_id(name)
    assert not (tmp_path / "keys").exists() or list((tmp_path / "keys").iterdir()) == []


def plant(images: Path, key: str, record: dict, rootfs_to: Path | None = None) -> None:
    folder = images / key
    folder.mkdir(parents=True)
    (folder / "image.json").write_text(json.dumps(record))
    if rootfs_to is None:
        (folder / "rootfs").mkdir()
    else:
        (folder / "rootfs").symlink_to(rootfs_to)


def record(key: str, path: str) -> dict:
    return {"name": key.rsplit("-", 1)[0], "key": key, "digest": "d", "packages": [], "suite": "s",
            "size_bytes": 0, "built_at": 0, "build_seconds": 0, "path": path}  # fmt: skip


def test_an_image_record_is_untrusted_input(tmp_path: Path) -> None:
    """What a sandbox could plant (the attack of issue 23): a record naming another key, a path of its
    choosing, a rootfs that is a link to /. None of it becomes a sandbox's root."""
    images = tmp_path / "images"
    store = ImageStore(images)
    plant(images, "honest-0123456789ab", record("honest-0123456789ab", "/"))
    assert store.rootfs_by_key("honest-0123456789ab") == images / "honest-0123456789ab" / "rootfs"
    assert store.by_key("honest-0123456789ab").path == str(images / "honest-0123456789ab")  # ours, not "/"
    plant(images, "liar-0123456789ab", record("default-0123456789ab/../../etc", "/"))
    with pytest.raises(InvalidRequest, match="names itself"):
        store.rootfs_by_key("liar-0123456789ab")
    plant(images, "linked-0123456789ab", record("linked-0123456789ab", "/"), rootfs_to=Path("/"))
    with pytest.raises(InvalidRequest, match="damaged"):
        store.rootfs_by_key("linked-0123456789ab")
    (images / "alias-0123456789ab").symlink_to(images / "honest-0123456789ab")
    with pytest.raises(InvalidRequest, match="damaged"):
        store.by_key("alias-0123456789ab")
    assert [i.key for i in store.list()] == ["honest-0123456789ab"]  # the others are skipped, with a warning
    with pytest.raises((InvalidRequest, ImageNotFound)):
        store.get("honest-0123456789ab/../liar-0123456789ab")


def test_the_pattern_of_each_kind_of_id() -> None:
    assert re.fullmatch(hostpath.SANDBOX_ID, "sb-0123456789ab")
    assert re.fullmatch(hostpath.CHECKPOINT_ID, "ck-0123456789ab")
    assert not re.fullmatch(hostpath.SHA256, "../" + "0" * 61)
