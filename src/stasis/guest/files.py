"""The agent's file operations: binary-safe, chunked, and atomic on the sandbox's side.

Runs inside the sandbox (standard library only). A write goes to a temp file beside its
target and is renamed over it by the last chunk; each temp file in progress is recorded
under ``UPLOADS``, so one left by an interrupted upload is removed when the agent starts.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import stat
import threading
import time

from . import protocol as P
from .commands import READ_CHUNK_LIMIT, b64, unb64
from .processes import RequestError

UPLOADS = os.path.join(os.environ.get("STASIS_AGENT_STATE", "/var/lib/stasis"), "uploads")
STALE_UPLOAD_SECONDS = 3600.0


def absolute(path: str) -> str:
    if not isinstance(path, str) or not path or "\0" in path:
        raise RequestError(P.ErrorKind.INVALID, "path must be a non-empty string without NUL bytes")
    return os.path.normpath(os.path.join("/root", path))


def fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    temp = f"{path}.stasis-tmp-{threading.get_ident()}"  # a temp of each thread's: two writers never share one
    with open(temp, "wb") as f:
        f.write(data)
        os.fchmod(f.fileno(), mode)
        os.fsync(f.fileno())
    os.replace(temp, path)
    fsync_dir(os.path.dirname(path))  # in a VM, a rename not yet in the journal dies with the guest


LABEL_PREFIX = "user.e2b."  # E2B's file metadata: extended attributes in this namespace, the prefix stripped
NO_LABELS = (
    "this sandbox's file system keeps no extended attributes (gVisor's does not): file metadata needs a "
    "microVM sandbox (backend microvm)"
)


def labels_of(path: str) -> dict[str, str]:
    """Its user.e2b.* extended attributes (none where the file system keeps none; a link's are not followed)."""
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    found = {}
    for name in names:
        if name.startswith(LABEL_PREFIX) and name.isascii() and name.isprintable():
            with contextlib.suppress(OSError):
                found[name[len(LABEL_PREFIX) :]] = os.getxattr(path, name, follow_symlinks=False).decode("latin-1")
    return found


def set_labels(fd: int, labels: dict[str, str]) -> None:
    for key, value in labels.items():
        try:
            os.setxattr(fd, LABEL_PREFIX + key.lower(), value.encode("latin-1"))
        except OSError as exc:
            if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                raise RequestError(P.ErrorKind.INVALID, NO_LABELS) from None
            raise


def file_stat(path: str, name: str, labels: bool = False) -> P.FileStat:
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        kind = "directory"
    elif stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
    else:
        kind = "other"
    target = os.readlink(path) if kind == "symlink" else None
    return P.FileStat(
        name=name, path=path, type=kind, size=st.st_size, mode=stat.S_IMODE(st.st_mode), mtime=st.st_mtime,
        owner=user_name(st.st_uid), group=group_name(st.st_gid), target=target,
        labels=labels_of(path) if labels else None,
    )  # fmt: skip


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def owner_ids(owner: str | None) -> tuple[int, int] | None:
    if owner is None:
        return None
    try:
        entry = pwd.getpwnam(str(owner))
    except KeyError:
        raise RequestError(P.ErrorKind.INVALID, f"no user {owner!r} in the sandbox") from None
    return entry.pw_uid, entry.pw_gid


def make_dirs(path: str, ids: tuple[int, int] | None, exist_ok: bool = True) -> None:
    """``os.makedirs``; the directories it made belong to ``ids`` (uid, gid) if given."""
    missing = []
    probe = path
    while probe not in ("/", "") and not os.path.lexists(probe):
        missing.append(probe)
        probe = os.path.dirname(probe)
    os.makedirs(path, exist_ok=exist_ok)
    if ids is not None:
        for made in missing:
            os.lchown(made, *ids)


def remove_interrupted_uploads(older_than: float = 0.0) -> int:
    """Delete temp files of uploads that never finished (recorded older than ``older_than`` seconds)."""
    removed = 0
    try:
        records = os.listdir(UPLOADS)
    except OSError:
        return 0
    for record in records:
        path = os.path.join(UPLOADS, record)
        try:
            if time.time() - os.lstat(path).st_mtime < older_than:
                continue
            with open(path) as f:
                temp = f.read()
            if os.path.basename(temp).endswith(f".stasis-{record}") and os.path.lexists(temp):
                os.unlink(temp)
                removed += 1
            os.unlink(path)
        except OSError:
            continue
    return removed


class Files:
    def read(self, req: P.ReadFile) -> P.FileData:
        path = absolute(req.path)
        length = min(int(req.length), READ_CHUNK_LIMIT)
        if os.path.isdir(path):
            raise RequestError(P.ErrorKind.IS_A_DIRECTORY, f"{path} is a directory, not a file")
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(int(req.offset))
            data = f.read(length)
        return P.FileData(data=b64(data), size=size, eof=int(req.offset) + len(data) >= size)

    def write(self, req: P.WriteFile) -> P.PathResult:
        path = absolute(req.path)
        if os.path.isdir(path):
            raise RequestError(P.ErrorKind.IS_A_DIRECTORY, f"{path} is a directory, not a file")
        parent = os.path.dirname(path)
        ids = owner_ids(req.owner)
        if req.make_parents:
            make_dirs(parent, ids)
        upload = str(req.upload_id)
        if not upload.isalnum():
            raise RequestError(P.ErrorKind.INVALID, "upload_id must be alphanumeric")
        temp = os.path.join(parent, f".{os.path.basename(path)}.stasis-{upload}")
        if req.abort:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            self._forget(upload)
            return P.PathResult(path=path)
        offset = int(req.offset)
        if offset == 0 and not req.final:
            self._record(upload, temp)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if offset == 0 else 0), 0o600)
        try:
            if offset == 0 and req.labels:
                try:
                    set_labels(fd, dict(req.labels))
                except BaseException:
                    os.unlink(temp)  # refused before any of it was written: nothing is left behind
                    self._forget(upload)
                    raise
            os.pwrite(fd, unb64(req.data), offset)
            if req.final:
                os.fchmod(fd, int(req.mode))
                if ids is not None:
                    os.fchown(fd, *ids)
                os.fsync(fd)
        finally:
            os.close(fd)
        if not req.final:
            return P.PathResult(path=path)
        os.replace(temp, path)
        fsync_dir(parent)  # in a VM, a rename not yet in the journal dies with the guest
        if offset:
            self._forget(upload)
        return P.PathResult(path=path, size=os.stat(path).st_size)

    @staticmethod
    def _record(upload: str, temp: str) -> None:
        try:
            os.makedirs(UPLOADS, exist_ok=True)
            remove_interrupted_uploads(older_than=STALE_UPLOAD_SECONDS)
            with open(os.path.join(UPLOADS, upload), "w") as f:
                f.write(temp)
        except OSError:
            pass  # a read-only /var: the temp file is still renamed or overwritten by a retry

    @staticmethod
    def _forget(upload: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(UPLOADS, upload))

    def fifos(self, req: P.ListFifos) -> P.FifoList:
        """One walk of the names only (getdents gives each entry's type): only a FIFO is stat'ed."""
        skip, found, stack = set(req.skip), [], ["/"]
        while stack:
            try:
                entries = os.scandir(stack.pop())
            except OSError:
                continue
            with entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.path not in skip:
                            stack.append(entry.path)
                    elif not entry.is_file(follow_symlinks=False) and not entry.is_symlink():
                        st = entry.stat(follow_symlinks=False)
                        if stat.S_ISFIFO(st.st_mode):
                            found.append(P.Fifo(entry.path, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid))
        return P.FifoList(sorted(found, key=lambda fifo: fifo.path))

    def list(self, req: P.ListDir) -> P.DirListing:
        path = absolute(req.path)
        if not os.path.isdir(path):
            if os.path.exists(path):
                raise RequestError(P.ErrorKind.NOT_A_DIRECTORY, f"{path} is not a directory")
            raise RequestError(P.ErrorKind.FILE_NOT_FOUND, f"no such directory: {path}")
        entries = []
        with os.scandir(path) as it:
            for entry in it:
                try:
                    entries.append(file_stat(entry.path, entry.name, bool(req.labels)))
                except FileNotFoundError:
                    continue
        entries.sort(key=lambda e: e.name)
        return P.DirListing(path=path, entries=entries)

    def stat(self, req: P.StatFile) -> P.FileStat:
        path = absolute(req.path)
        return file_stat(path, os.path.basename(path) or "/", bool(req.labels))

    def delete(self, req: P.DeleteFile) -> P.Empty:
        path = absolute(req.path)
        if os.path.isdir(path) and not os.path.islink(path):
            if req.recursive:
                import shutil

                shutil.rmtree(path)
            else:
                os.rmdir(path)
        else:
            os.unlink(path)
        return P.Empty()

    def extract(self, req: P.ExtractTar) -> P.PathResult:
        """Members are checked before anything is written (:mod:`.untar`): no absolute paths, no ``..``, nothing
        written through a link, no devices. Extracted beside ``path``, then renamed into place; an existing
        directory is replaced in place (see ``merge_into``)."""
        import tarfile

        from . import untar

        archive, path = absolute(req.archive), absolute(req.path)
        parent = os.path.dirname(path)
        staging = os.path.join(parent, f".{os.path.basename(path)}.stasis-dir-{os.getpid()}-{time.monotonic_ns()}")
        try:  # every way out removes the archive, a refusal too
            if os.path.exists(path) and not req.replace:
                raise RequestError(P.ErrorKind.FILE_EXISTS, f"{path} exists; pass replace to put the directory there")
            os.makedirs(parent, exist_ok=True)
            with untar.open_archive(name=archive, mode="r:*") as tar:
                os.mkdir(staging, 0o755)
                untar.extract(tar, staging, links="any", owners=True)
            if os.path.isdir(path) and not os.path.islink(path):
                merge_into(staging, path)
            else:
                if os.path.lexists(path):
                    os.unlink(path)
                os.rename(staging, path)
            fsync_dir(parent)
        except untar.UnsafeArchive as exc:
            raise RequestError(P.ErrorKind.INVALID, str(exc)) from exc
        except tarfile.TarError as exc:
            raise RequestError(P.ErrorKind.INVALID, f"not a tar archive: {exc}") from exc
        finally:
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.unlink(archive)
        return P.PathResult(path=path)

    def pack(self, req: P.PackTar) -> P.PathResult:
        import tarfile

        path, archive = absolute(req.path), absolute(req.archive)
        if not os.path.isdir(path):
            raise RequestError(P.ErrorKind.NOT_A_DIRECTORY, f"{path} is not a directory")
        os.makedirs(os.path.dirname(archive), exist_ok=True)
        # a new file of its own: never one somebody planted under that name (a link, a FIFO)
        fd = os.open(archive, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w") as tar:
                tar.add(path, arcname=".")
        except BaseException:  # a full disk, a file that vanished: no half archive stays behind
            with contextlib.suppress(OSError):
                os.unlink(archive)
            raise
        return P.PathResult(path=archive, size=os.stat(archive).st_size)

    def mkdir(self, req: P.MakeDir) -> P.PathResult:
        path = absolute(req.path)
        make_dirs(path, owner_ids(req.owner), exist_ok=bool(req.exist_ok))
        return P.PathResult(path=path)


def merge_into(source: str, target: str) -> None:
    """Make the directory ``target`` hold exactly what ``source`` holds, moving entries across.

    A directory present in both is kept (its inode, and so any process whose cwd it is, or that holds it
    open) and merged recursively; everything else is renamed over or removed. Replacing ``target`` whole
    would leave such a process on a deleted directory, which gVisor cannot checkpoint: the sandbox could
    no longer be suspended. ``source`` is left empty."""
    wanted = set(os.listdir(source))
    for name in os.listdir(target):
        if name not in wanted:
            remove_tree(os.path.join(target, name))
    for name in wanted:
        new, old = os.path.join(source, name), os.path.join(target, name)
        new_is_dir = os.path.isdir(new) and not os.path.islink(new)
        if new_is_dir and os.path.isdir(old) and not os.path.islink(old):
            merge_into(new, old)
            continue
        if os.path.lexists(old) and (new_is_dir or (os.path.isdir(old) and not os.path.islink(old))):
            remove_tree(old)  # a file and a directory swap kinds: rename cannot replace across them
        os.rename(new, old)
    info = os.stat(source)
    os.chmod(target, stat.S_IMODE(info.st_mode))
    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))


def remove_tree(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        import shutil

        shutil.rmtree(path)
    else:
        os.unlink(path)
