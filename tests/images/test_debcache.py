"""The Debian package cache shared by image builds: used only while it is this user's own, trimmed newest-kept,
and never a reason for a build to fail. No mmdebstrap here: the cache's own rules (the builds that use it are
tests/images/test_build.py's and every `make setup`'s)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stasis.images import debcache

pytestmark = pytest.mark.fast


def debs(directory: Path, *names: str, size: int = 10) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / f"{name}.deb").write_bytes(b"x" * size)


def test_a_new_cache_is_made_private_and_its_hooks_read_and_write_it(tmp_path: Path) -> None:
    cache = tmp_path / ".deb-cache"
    hooks = debcache.hooks(cache, tmp_path / "out")
    assert os.stat(cache).st_mode & 0o777 == 0o700
    assert any(str(cache) in hook and "sync-in" in hook for hook in hooks)


def test_a_cache_of_another_user_or_a_link_is_not_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    open_one = tmp_path / "open"
    open_one.mkdir()
    os.chmod(open_one, 0o777)
    assert debcache.hooks(open_one, tmp_path / "out") != []  # this user's own, left open: closed, then used
    assert os.stat(open_one).st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 65534, 65534)  # the suite runs as root (runsc, QEMU): another user's directory
    assert debcache.hooks(shared, tmp_path / "out") == []  # every package downloaded, none taken from it
    linked = tmp_path / "linked"
    linked.symlink_to(open_one)
    assert debcache.hooks(linked, tmp_path / "out") == []
    assert "mode 0700" in caplog.text
    debs(tmp_path / "out", "planted")
    debcache.keep(linked, tmp_path / "out")
    assert not (open_one / "planted.deb").exists() and not (tmp_path / "out").exists()


def test_kept_packages_are_trimmed_oldest_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    assert debcache.private(cache)
    debs(cache, "old", "older")
    os.utime(cache / "older.deb", (1, 1))
    os.utime(cache / "old.deb", (2, 2))
    debs(out, "new")
    monkeypatch.setattr(debcache, "LIMIT", 20)  # room for two of the three
    debcache.keep(cache, out)
    assert sorted(p.name for p in cache.iterdir()) == ["new.deb", "old.deb"]
    assert not out.exists()
