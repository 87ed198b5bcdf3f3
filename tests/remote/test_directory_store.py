"""The remote store in a shared directory (``STASIS_REMOTE=file:///path``): the object store's contract, with
S3's conditional writes, over files; a key from a manifest never names a path outside the directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from stasis.errors import Conflict, InvalidRequest, NotFound, StoreUnreachable
from stasis.remote.config import RemoteConfig
from stasis.remote.directory import DirectoryStore

pytestmark = pytest.mark.fast


def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DirectoryStore:
    monkeypatch.setenv("STASIS_REMOTE", f"file://{tmp_path / 'store'}")
    config = RemoteConfig.from_env()
    assert config is not None and config.directory == tmp_path / "store"
    return DirectoryStore(config)


def test_objects_and_documents_with_one_winner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = store(tmp_path, monkeypatch)
    objects.put("chunks/ab/abcdef", b"piece")
    assert objects.get("chunks/ab/abcdef") == b"piece" and objects.exists("chunks/ab/abcdef")
    assert objects.list("chunks/") == ["chunks/ab/abcdef"] and objects.list("nothing/") == []
    with pytest.raises(NotFound):
        objects.get("chunks/ab/missing")
    first = objects.write_document("sandboxes/sb-1.json", {"owner": None}, replacing=None)
    with pytest.raises(Conflict):  # a second create of the same key loses
        objects.write_document("sandboxes/sb-1.json", {"owner": "b"}, replacing=None)
    taken = objects.write_document("sandboxes/sb-1.json", {"owner": "a"}, replacing=first)
    with pytest.raises(Conflict):  # a node that read the first version loses to the one that took it
        objects.write_document("sandboxes/sb-1.json", {"owner": "b"}, replacing=first)
    assert objects.read_document("sandboxes/sb-1.json") == ({"owner": "a"}, taken)


def test_a_key_never_leaves_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = store(tmp_path, monkeypatch)
    for key in ("../outside", "chunks/../../etc/passwd", "/etc/passwd", "chunks//x", "names/.hidden"):
        with pytest.raises(InvalidRequest, match="a key of the remote store may hold only"):
            objects.put(key, b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]
    monkeypatch.setenv("STASIS_REMOTE", "file://relative/path")
    with pytest.raises(InvalidRequest, match="file:///absolute/path"):
        RemoteConfig.from_env()


def test_a_link_planted_in_the_store_is_never_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer of the directory (a host of an NFS export) plants links: the store writes nowhere through
    them and reads no host file through them."""
    objects = store(tmp_path, monkeypatch)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host file")
    (tmp_path / "store" / "names").symlink_to(outside)
    with pytest.raises(StoreUnreachable, match="not a directory of the store"):
        objects.put("names/sandboxes", b"x")
    objects.put("checkpoints/ck-1.json", b"{}")
    (tmp_path / "store" / "checkpoints" / "ck-2.json").symlink_to(outside / "secret")
    with pytest.raises(StoreUnreachable):
        objects.get("checkpoints/ck-2.json")
    assert objects.list("checkpoints/") == ["checkpoints/ck-1.json"]  # the link is no object
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
