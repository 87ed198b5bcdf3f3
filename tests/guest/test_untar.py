"""The one unpack routine (stasis.guest.untar) against archives a hostile sandbox would write.

Every archive stasis unpacks can be a sandbox's: a downloaded directory on a client, a fast-storage FILESYSTEM
checkpoint on the host, an upload inside a sandbox. Each archive here is refused whole before anything is written,
and a host directory beside the destination is never touched."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from stasis.guest import untar

pytestmark = pytest.mark.fast


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", data: bytes = b"x", **extra: int) -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    for key, value in extra.items():
        setattr(info, key, value)
    return info, (io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def archive(*members: tuple) -> tarfile.TarFile:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, data)
    buffer.seek(0)
    return tarfile.open(fileobj=buffer, mode="r:")


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host directory the sandbox would like to reach, with a file in it."""
    victim = tmp_path / "host"
    victim.mkdir()
    (victim / "FILE").write_text("the host's own")
    return victim


def untouched(host: Path) -> bool:
    return sorted(p.name for p in host.iterdir()) == ["FILE"] and (host / "FILE").read_text() == "the host's own"


SYM, LNK = tarfile.SYMTYPE, tarfile.LNKTYPE


def hostile(host: Path) -> dict[str, list[tuple]]:
    return {
        # issue 38's first repro: a hard link named through a symlink, then a file of the hard link's name
        "hard link through a symlink": [
            member("root", tarfile.DIRTYPE),
            member("root/s", SYM, str(host)),
            member("root/h", LNK, "root/s/FILE"),
        ],
        "file over its own hard link": [member("a"), member("b", LNK, "a"), member("b", data=b"owned")],
        # issue 38's second repro: d -> ., e -> d/d/.. (reads as "d" as text), then e/escaped.txt
        "link chain that climbs": [member("d", SYM, "."), member("e", SYM, "d/d/.."), member("e/escaped.txt")],
        "write through a symlink": [member("s", SYM, str(host)), member("s/FILE", data=b"owned")],
        "write through a later symlink's name": [member("s/x"), member("s", SYM, str(host))],
        "dot-dot": [member("../escaped.txt")],
        "dot-dot inside": [member("a/../../escaped.txt")],
        "absolute": [member(f"{host}/FILE", data=b"owned")],
        "hard link out": [member("h", LNK, "../host/FILE")],
        "hard link to an absolute path": [member("h", LNK, f"{host}/FILE")],
        "hard link to a later member": [member("h", LNK, "f"), member("f")],
        "hard link to a symlink": [member("s", SYM, str(host / "FILE")), member("h", LNK, "s")],
        "duplicate": [member("f"), member("f", data=b"again")],
        "block device": [member("disk", tarfile.BLKTYPE, devmajor=8)],
        "character device": [member("tty", tarfile.CHRTYPE, devmajor=4, devminor=1)],
        "under a file": [member("f"), member("f/g")],
    }


@pytest.mark.parametrize("links", ["inside", "any"])
def test_every_hostile_archive_is_refused_whole_and_the_host_untouched(tmp_path: Path, host: Path,
                                                                       links: untar.Links) -> None:  # fmt: skip
    for why, members in hostile(host).items():
        dest = tmp_path / f"dest-{links}-{why.replace(' ', '-')}"
        dest.mkdir()
        with archive(*members) as tar, pytest.raises(untar.UnsafeArchive):
            untar.extract(tar, dest, links=links)
        assert list(dest.iterdir()) == [], f"{why}: something was written before the refusal"
        assert untouched(host), why
        assert not (tmp_path / "escaped.txt").exists(), why


def test_outside_the_sandbox_a_symlink_must_point_inside_through_no_other_link(tmp_path: Path, host: Path) -> None:
    for members in (
        [member("s", SYM, str(host))],
        [member("s", SYM, "../host")],
        [member("d", tarfile.DIRTYPE), member("d/s", SYM, "../../host")],
        [member("d", SYM, "."), member("e", SYM, "d/x")],
    ):
        dest = tmp_path / f"dest-{len(list(tmp_path.iterdir()))}"
        dest.mkdir()
        with archive(*members) as tar, pytest.raises(untar.UnsafeArchive, match="link"):
            untar.extract(tar, dest, links="inside")
    dest = tmp_path / "inside-ok"
    dest.mkdir()
    with archive(member("a/b/f"), member("a/up", SYM, "../a/b/f"), member("a/b/loop", SYM, "..")) as tar:
        untar.extract(tar, dest, links="inside")
    assert (dest / "a/up").read_text() == "x" and os.readlink(dest / "a/b/loop") == ".."


def test_a_real_tree_comes_back_as_it_was(tmp_path: Path) -> None:
    """Files, modes, times, hard links, symlinks anywhere (a workspace's `ln -s /etc`), FIFOs and whiteouts."""
    members = [
        member(".", tarfile.DIRTYPE, mode=0o750),
        member("ro", tarfile.DIRTYPE, mode=0o555, mtime=1_000_000),
        member("ro/f", data=b"read only", mode=0o444, mtime=2_000_000),
        member("ro/twin", LNK, "ro/f"),
        member("etc", SYM, "/etc"),
        member("deep/er/file", data=b"\0binary\xff", mode=0o640),
        member("pipe", tarfile.FIFOTYPE, mode=0o600),
        member("gone", tarfile.CHRTYPE),
    ]
    dest = tmp_path / "layer"
    dest.mkdir()
    with archive(*members) as tar:
        untar.extract(tar, dest, links="any", whiteouts=True, owners=os.geteuid() == 0)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o750
    assert stat.S_IMODE((dest / "ro").stat().st_mode) == 0o555 and (dest / "ro").stat().st_mtime == 1_000_000
    assert (dest / "ro/f").read_bytes() == b"read only" and (dest / "ro/f").stat().st_mtime == 2_000_000
    assert (dest / "ro/twin").stat().st_ino == (dest / "ro/f").stat().st_ino
    assert os.readlink(dest / "etc") == "/etc"
    assert (dest / "deep/er/file").read_bytes() == b"\0binary\xff"
    assert stat.S_ISFIFO((dest / "pipe").lstat().st_mode)
    if os.geteuid() == 0:
        assert (dest / "gone").lstat().st_rdev == 0 and stat.S_ISCHR((dest / "gone").lstat().st_mode)


def test_whiteouts_only_where_asked_and_a_size_limit(tmp_path: Path) -> None:
    with archive(member("gone", tarfile.CHRTYPE)) as tar, pytest.raises(untar.UnsafeArchive, match="device"):
        untar.extract(tar, tmp_path, links="any")
    big = archive(member("a", data=b"x" * 600), member("b", data=b"x" * 600))
    with big as tar, pytest.raises(untar.UnsafeArchive, match="more than 1000 bytes"):
        untar.extract(tar, tmp_path, links="any", max_bytes=1000)
    assert list(tmp_path.iterdir()) == []


def test_a_download_on_the_client_keeps_its_files_inside_the_destination(tmp_path: Path, host: Path) -> None:
    """The SDK's download_dir (and `stasis cp SBX:DIR LOCAL`) unpacks what the sandbox sent."""
    from stasis.errors import InvalidRequest
    from stasis.sdk._dirs import unpack

    def raw(*members: tuple) -> bytes:
        with archive(*members) as tar:
            fileobj = tar.fileobj
            assert fileobj is not None
            fileobj.seek(0)
            return fileobj.read()

    attack = raw(member("d", SYM, "."), member("e", SYM, "d/d/.."), member("e/escaped.txt"))
    with pytest.raises(InvalidRequest, match="not unpacked"):
        unpack(attack, tmp_path / "out")
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["host"]
    made = unpack(raw(member("src/main.py", data=b"print(1)"), member("link", SYM, "src/main.py")), tmp_path / "ok")
    assert (made / "link").read_text() == "print(1)"


def test_the_host_reads_the_layer_from_its_own_descriptor(tmp_path: Path, host: Path) -> None:
    """A fast-storage FILESYSTEM checkpoint: the host made the archive's file and reads that descriptor only."""
    from stasis.backends.gvisor.changes import unpack
    from stasis.errors import BackendError

    def held(*members: tuple) -> int:
        fd = os.open(tmp_path, os.O_RDWR | os.O_TMPFILE, 0o600)
        with archive(*members) as tar:
            assert tar.fileobj is not None
            tar.fileobj.seek(0)
            os.write(fd, tar.fileobj.read())
        return fd

    fd = held(member("root", tarfile.DIRTYPE), member("root/s", SYM, str(host)), member("root/h", LNK, "root/s/FILE"),
              member("root/h", data=b"owned"))  # fmt: skip
    with pytest.raises(BackendError, match="refused"):
        unpack(fd, tmp_path / "refused", 1 << 30)
    os.close(fd)
    assert untouched(host)
    fd = held(member("etc", SYM, "/etc"), member("gone", tarfile.CHRTYPE), member("f"))
    unpack(fd, tmp_path / "layer", 1 << 30)
    os.close(fd)
    assert os.readlink(tmp_path / "layer/etc") == "/etc" and (tmp_path / "layer/f").read_bytes() == b"x"


def raw_tar(*members: tuple, pax: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT, pax_headers=pax) as tar:
        for info, data in members:
            tar.addfile(info, data)
    return buffer.getvalue()


def sparse_member() -> tuple:
    """A pax 1.0 sparse file: one byte of data, a terabyte of holes before it."""
    info, _ = member("big")
    realsize = 1 << 40
    sparse_map = f"1\n{realsize - 1}\n1\n".encode().ljust(512, b"\0")
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "big",
                        "GNU.sparse.realsize": str(realsize)}  # fmt: skip
    info.size = len(sparse_map) + 1
    return info, io.BytesIO(sparse_map + b"x")


def test_archives_that_cost_out_of_proportion_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    """The review's findings: a sparse member (a terabyte of zeros from a few KB), an extended header tarfile would
    read whole, paths nested past what a file system takes, times and owners that overflow."""
    huge_header, _ = member("f")
    huge_header.pax_headers = {"comment": "x" * (2 << 20)}
    bad_time, _ = member("t")
    bad_time.pax_headers = {"mtime": "nan"}
    cases = {
        "sparse": raw_tar(sparse_member()),
        "extended header": raw_tar((huge_header, io.BytesIO(b"x"))),
        "deep": raw_tar(member("/".join(["d"] * 2000) + "/f")),
        "long link": raw_tar(member("l", SYM, "/".join(["d"] * 2000))),
        "time": raw_tar((bad_time, io.BytesIO(b"x"))),
        "owner": raw_tar(member("o", uid=1 << 40)),
    }
    for why, data in cases.items():
        dest = tmp_path / why.replace(" ", "-")
        dest.mkdir()
        with pytest.raises(untar.UnsafeArchive), untar.open_archive(io.BytesIO(data)) as tar:
            untar.extract(tar, dest, links="inside", owners=True)
        assert list(dest.iterdir()) == [], why


def test_on_a_client_no_fifo_and_no_case_trick(tmp_path: Path) -> None:
    with archive(member("README.md", tarfile.FIFOTYPE)) as tar, pytest.raises(untar.UnsafeArchive, match="pipe"):
        untar.extract(tar, tmp_path, links="inside")
    climb = archive(member("d", SYM, "."), member("e", SYM, "D/D/D/../../../../etc"))  # D is d on a Mac
    with climb as tar, pytest.raises(untar.UnsafeArchive, match="through the link"):
        untar.extract(tar, tmp_path, links="inside", case_insensitive=True)
    assert list(tmp_path.iterdir()) == []


def test_a_merge_over_a_target_never_follows_a_link_already_there(tmp_path: Path, host: Path) -> None:
    """Harbor's download_dir puts a sandbox's files over a directory of the client's: links a previous download
    left there are replaced as links, never written through or descended into."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "e").symlink_to(host / "FILE")
    (target / "d").symlink_to(host)
    (target / "kept").write_text("the client's own")
    staging = tmp_path / "staging"
    staging.mkdir()
    with archive(member("e", data=b"from the sandbox"), member("d/FILE", data=b"from the sandbox")) as tar:
        untar.extract(tar, staging, links="inside")
    untar.merge(staging, target)
    assert untouched(host)
    assert (target / "e").read_bytes() == b"from the sandbox" and not (target / "e").is_symlink()
    assert (target / "d").is_dir() and not (target / "d").is_symlink()
    assert (target / "d/FILE").read_bytes() == b"from the sandbox" and (
        target / "kept"
    ).read_text() == "the client's own"
