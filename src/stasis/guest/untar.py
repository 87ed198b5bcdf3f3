"""The one routine that unpacks a tar somebody else made (standard library only: the agent uses it too).

Every archive stasis unpacks may come from a sandbox: a download of a sandbox's directory on a client, a
FILESYSTEM checkpoint of fast storage on the host, an upload inside a sandbox. So the whole member list is
checked before anything is written, and then nothing is written through a link:

- a member's name stays inside the tree (no absolute name, no ``..``) and appears once;
- no member lies under another member that is not a directory (a symlink, a hard link, a file);
- a hard link names a regular file that came earlier in the archive;
- with ``links="inside"`` a symlink's target is relative, stays inside the tree and passes through no other
  symlink of the archive (``d -> .`` then ``e -> d/d/..`` climbs out); with ``links="any"`` a symlink may
  point anywhere (``ln -s /etc`` in a workspace), since nothing here ever follows one;
- no device, but an overlay whiteout (a 0:0 character device) where ``whiteouts`` asks for them; no sparse
  member (its holes would be written out as zeros: a few KB of archive, terabytes on disk), and on a client
  no FIFO (a file named README that hangs whoever reads it);
- names, link targets, headers, member counts, sizes, times and owners are bounded, so a hostile archive
  costs neither memory nor time out of proportion to its own size.

Then each member is made relative to a descriptor of its parent directory, opened step by step with
``O_NOFOLLOW``, and created with ``O_EXCL``: a link planted by anyone while it runs is never followed.
``dest`` must be a directory nobody else writes to, such as a fresh staging directory.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import tarfile
import unicodedata
from typing import IO, Any, Literal

Links = Literal["inside", "any"]
COPY_CHUNK = 1 << 20
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_MEMBERS = 1 << 20  # a fast-storage FILESYSTEM checkpoint of more changed files is refused
MAX_NAME, MAX_COMPONENT, MAX_DEPTH = 4096, 255, 256  # bytes of a path, of one of its names; names in a path
MAX_HEADER = 1 << 20  # bytes of one pax or GNU long-name header (tarfile reads it whole)
LONG_HEADERS = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                tarfile.SOLARIS_XHDTYPE)  # fmt: skip


class UnsafeArchive(ValueError):
    """The archive is refused, before anything was written; the message says which member and why."""


class _BoundedInfo(tarfile.TarInfo):
    """A member whose extended header (read whole by tarfile) is refused past ``MAX_HEADER``."""

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in LONG_HEADERS and self.size > MAX_HEADER:
            raise UnsafeArchive(f"an extended header of {self.size} bytes (at most {MAX_HEADER})")
        return super()._proc_member(tar)  # type: ignore[misc]


def open_archive(fileobj: IO[bytes] | None = None, name: str | None = None, mode: str = "r:") -> tarfile.TarFile:
    """A tar to read with :func:`extract`: its headers bounded while they are read."""
    return tarfile.open(name=name, fileobj=fileobj, mode=mode, tarinfo=_BoundedInfo)  # type: ignore[call-overload]


def extract(
    tar: tarfile.TarFile, dest: str | os.PathLike[str], *, links: Links, whiteouts: bool = False,
    owners: bool = False, max_bytes: int | None = None, case_insensitive: bool = False,
) -> None:  # fmt: skip
    """Unpack ``tar`` (opened by :func:`open_archive`) into the directory ``dest``, or refuse it whole
    (:class:`UnsafeArchive`).

    ``owners``: keep the members' numeric owners (as root); else files belong to whoever unpacks them, and
    set-id bits are dropped. ``max_bytes``: the most the regular files may add up to. ``case_insensitive``:
    ``dest`` is on a file system where ``A`` and ``a`` are one name (a Mac's, Windows')."""
    members = []
    for member in tar:
        members.append(member)
        if len(members) > MAX_MEMBERS:
            raise UnsafeArchive(f"the archive has more than {MAX_MEMBERS} members")
    named = check(members, links=links, whiteouts=whiteouts, max_bytes=max_bytes, case_insensitive=case_insensitive)
    _Writer(tar, os.fspath(dest), owners).write(named)


def check(
    members: list[tarfile.TarInfo], *, links: Links, whiteouts: bool = False, max_bytes: int | None = None,
    case_insensitive: bool = False,
) -> list[tuple[tuple[str, ...], tarfile.TarInfo]]:  # fmt: skip
    """Each member with its path as parts, in archive order; :class:`UnsafeArchive` if any is refused."""
    key = _folded if case_insensitive else (lambda parts: parts)
    named: list[tuple[tuple[str, ...], tarfile.TarInfo]] = []
    index: dict[tuple[str, ...], int] = {}
    kinds: dict[tuple[str, ...], tarfile.TarInfo] = {}
    total = 0
    for position, member in enumerate(members):
        parts = _parts(member.name, member.name)
        if key(parts) in index:
            raise UnsafeArchive(f"archive member {member.name!r} appears twice")
        if not parts and not member.isdir():
            raise UnsafeArchive(f"archive member {member.name!r} is the archive's root but not a directory")
        _check_fields(member)
        index[key(parts)], kinds[key(parts)] = position, member
        named.append((parts, member))
        total += member.size if member.isreg() else 0
        if max_bytes is not None and total > max_bytes:
            raise UnsafeArchive(f"the archive's files add up to more than {max_bytes} bytes, its limit")
    sound: set[tuple[str, ...]] = set()  # directories (members or not) known to lie under no link or file
    for position, (parts, member) in enumerate(named):
        why = _refused(key(parts), member, position, kinds, index, sound, links, whiteouts, key)
        if why is not None:
            raise UnsafeArchive(why)
    return named


def _folded(parts: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(unicodedata.normalize("NFC", part).casefold() for part in parts)


def _check_fields(member: tarfile.TarInfo) -> None:
    if len(member.linkname.encode(errors="surrogateescape")) > MAX_NAME:
        raise UnsafeArchive(f"archive member {member.name!r} links to a path over {MAX_NAME} bytes")
    if member.sparse is not None:
        raise UnsafeArchive(f"archive member {member.name!r} is a sparse file (its holes would be written out)")
    mtime = member.mtime
    if not (isinstance(mtime, int | float) and math.isfinite(mtime) and abs(mtime) < 1 << 40):
        raise UnsafeArchive(f"archive member {member.name!r} has a time out of range")
    if not all(isinstance(n, int) and 0 <= n < 1 << 32 for n in (member.uid, member.gid, member.mode)):
        raise UnsafeArchive(f"archive member {member.name!r} has an owner or a mode out of range")


def _parts(path: str, member: str) -> tuple[str, ...]:
    if len(path.encode(errors="surrogateescape")) > MAX_NAME:
        raise UnsafeArchive(f"archive member {member[:80]!r}... has a path or link over {MAX_NAME} bytes")
    if path.startswith("/"):
        raise UnsafeArchive(f"archive member {member!r} has an absolute path")
    parts = tuple(p for p in path.split("/") if p not in ("", "."))
    if ".." in parts:
        raise UnsafeArchive(f"archive member {member!r} leaves the directory ('..' in its path)")
    if len(parts) > MAX_DEPTH or any(len(p.encode(errors="surrogateescape")) > MAX_COMPONENT for p in parts):
        raise UnsafeArchive(
            f"archive member {member[:80]!r} is nested deeper or named longer than a file system allows"
        )
    return parts


def _refused(
    parts: tuple[str, ...], member: tarfile.TarInfo, position: int, kinds: dict[tuple[str, ...], tarfile.TarInfo],
    index: dict[tuple[str, ...], int], sound: set[tuple[str, ...]], links: Links, whiteouts: bool, key: Any,
) -> str | None:  # fmt: skip
    for depth in range(len(parts) - 1, 0, -1):  # nearest parent first; what is known sound ends the walk
        above = parts[:depth]
        if above in sound:
            break
        if (kind := kinds.get(above)) is not None and not kind.isdir():
            what = f"the link {kind.name!r}" if kind.issym() else f"{kind.name!r}, which is no directory"
            return f"archive member {member.name!r} would be written through {what}"
        sound.add(above)
    if member.islnk():
        target = key(_parts(member.linkname, member.name))
        source = kinds.get(target)
        if source is None or not source.isreg() or index[target] >= position:
            return f"archive hard link {member.name!r} names {member.linkname!r}, no regular file before it"
    elif member.issym() and links == "inside":
        return _symlink_leaves(parts, member, kinds, key)
    elif member.ischr() or member.isblk():
        if not (whiteouts and member.ischr() and member.devmajor == 0 and member.devminor == 0):
            return f"archive member {member.name!r} is a device"
    elif member.isfifo() and links == "inside":
        return f"archive member {member.name!r} is a named pipe: no file to download"
    elif not (member.isreg() or member.isdir() or member.issym() or member.isfifo()):
        return f"archive member {member.name!r} is of a kind stasis does not unpack ({member.type!r})"
    return None


def _symlink_leaves(parts: tuple[str, ...], member: tarfile.TarInfo, kinds: dict, key: Any) -> str | None:
    """Why a symlink's target may lead out of the tree, followed the way the kernel would, or None."""
    if member.linkname.startswith("/"):
        return f"archive link {member.name!r} points to an absolute path ({member.linkname!r})"
    steps = member.linkname.split("/")
    if len(member.linkname.encode(errors="surrogateescape")) > MAX_NAME or len(steps) > MAX_DEPTH:
        return f"archive link {member.name!r} points through a path longer than a file system allows"
    where = list(parts[:-1])
    for part in steps:
        if part in ("", "."):
            continue
        if part == "..":
            if not where:
                return f"archive link {member.name!r} points outside the directory ({member.linkname!r})"
            where.pop()
            continue
        where.append(part)
        through = kinds.get(key(tuple(where)))
        if through is not None and through.issym():
            return f"archive link {member.name!r} points through the link {through.name!r}"
    return None


class _Writer:
    def __init__(self, tar: tarfile.TarFile, dest: str, owners: bool) -> None:
        self.tar, self.dest, self.owners = tar, dest, owners
        self.root = os.open(dest, DIR_FLAGS)
        self.cached: tuple[tuple[str, ...], int] | None = None  # the last parent opened: members come grouped

    def write(self, named: list[tuple[tuple[str, ...], tarfile.TarInfo]]) -> None:
        directories: list[tuple[tuple[str, ...], tarfile.TarInfo]] = []
        try:
            for parts, member in named:
                if member.isdir():
                    self._directory(parts)
                    directories.append((parts, member))
                else:
                    self._entry(parts, member)
            for parts, member in sorted(directories, key=lambda item: -len(item[0])):  # deepest first
                fd = self._open_dir(parts)
                try:
                    self._finish(member, fd=fd)
                finally:
                    if fd != self.root:
                        os.close(fd)
        finally:
            self._drop_cache()
            os.close(self.root)

    def _entry(self, parts: tuple[str, ...], member: tarfile.TarInfo) -> None:
        parent, name = self._parent(parts[:-1]), parts[-1]
        if member.isreg():
            self._file(member, name, parent)
        elif member.issym():
            os.symlink(member.linkname, name, dir_fd=parent)
            self._finish(member, name=name, parent=parent)
        elif member.islnk():
            target = _parts(member.linkname, member.name)
            source = self._open_dir(target[:-1])
            try:
                os.link(target[-1], name, src_dir_fd=source, dst_dir_fd=parent, follow_symlinks=False)
            finally:
                if source != self.root:
                    os.close(source)
        elif member.isfifo():
            os.mkfifo(name, 0o600, dir_fd=parent)
            self._finish(member, name=name, parent=parent)
        else:  # a whiteout, the one device check() lets through
            os.mknod(name, stat.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=parent)
            self._finish(member, name=name, parent=parent)

    def _file(self, member: tarfile.TarInfo, name: str, parent: int) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=parent)
        try:
            source = self.tar.extractfile(member)
            assert source is not None  # a regular file always has one
            with source:
                while chunk := source.read(COPY_CHUNK):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
            self._finish(member, fd=fd)
        finally:
            os.close(fd)

    def _directory(self, parts: tuple[str, ...]) -> None:
        if parts:
            parent = self._parent(parts[:-1])
            try:
                os.mkdir(parts[-1], 0o700, dir_fd=parent)
            except FileExistsError:  # made earlier as a parent of a member before it
                os.close(os.open(parts[-1], DIR_FLAGS, dir_fd=parent))

    def _finish(self, member: tarfile.TarInfo, *, fd: int | None = None, name: str = "", parent: int = -1) -> None:
        """Owner, mode and times, on the descriptor or on the name in ``parent`` without following it."""
        mode = member.mode & (0o7777 if self.owners else 0o777)
        target: int | str = fd if fd is not None else name
        where = {} if fd is not None else {"dir_fd": parent, "follow_symlinks": False}
        if self.owners:
            os.chown(target, member.uid, member.gid, **where)
        if not member.issym():  # Linux has no mode for a symlink
            if fd is not None:
                os.fchmod(fd, mode)
            else:
                os.chmod(name, mode, dir_fd=parent)
        os.utime(target, (member.mtime, member.mtime), **where)

    def _parent(self, parts: tuple[str, ...]) -> int:
        """A descriptor of directory ``parts``, made where missing (a member's parents need not be members)."""
        if self.cached is not None and self.cached[0] == parts:
            return self.cached[1]
        self._drop_cache()
        fd = self._open_dir(parts, make=True)
        self.cached = (parts, fd)
        return fd

    def _open_dir(self, parts: tuple[str, ...], make: bool = False) -> int:
        fd = self.root
        for part in parts:
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
            if fd != self.root:
                os.close(fd)
            fd = child
        return fd

    def _drop_cache(self) -> None:
        if self.cached is not None and self.cached[1] != self.root:
            os.close(self.cached[1])
        self.cached = None


def merge(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Move what ``source`` holds (a directory :func:`extract` made) over what ``target`` holds, without following
    a link in ``target``: a link there is replaced, never written through or descended into."""
    source_fd, target_fd = os.open(source, DIR_FLAGS), os.open(target, DIR_FLAGS)
    try:
        _merge(source_fd, target_fd)
    finally:
        os.close(source_fd)
        os.close(target_fd)


def _merge(source: int, target: int) -> None:
    for name in os.listdir(source):  # listed first: entries move out while this runs
        try:
            there = os.lstat(name, dir_fd=target)
        except FileNotFoundError:
            there = None
        here = os.lstat(name, dir_fd=source)
        if stat.S_ISDIR(here.st_mode) and there is not None and stat.S_ISDIR(there.st_mode):
            inner_source = os.open(name, DIR_FLAGS, dir_fd=source)
            try:
                inner_target = os.open(name, DIR_FLAGS, dir_fd=target)
                try:
                    _merge(inner_source, inner_target)
                finally:
                    os.close(inner_target)
            finally:
                os.close(inner_source)
            continue
        if there is not None and stat.S_ISDIR(there.st_mode):  # a file where a directory was: it goes
            import shutil

            shutil.rmtree(name, dir_fd=target)
        elif there is not None and stat.S_ISDIR(here.st_mode):  # a directory where a file or a link was
            os.unlink(name, dir_fd=target)
        os.replace(name, name, src_dir_fd=source, dst_dir_fd=target)  # replaces a file or a link as such
