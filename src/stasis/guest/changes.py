"""How a sandbox's root differs from its image, packed as an overlay upper layer (standard library only).

A gVisor sandbox with fast storage keeps its writable layer in its kernel's memory: the host sees neither its
files nor their deletions. For a FILESYSTEM checkpoint the agent walks the root beside the image (a read-only
mount of the same files) and packs what differs, so the host gets the layer it would have copied. Files are
read one by one while the sandbox runs: each file is whole, the tree is not one instant.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from . import protocol as P
from .processes import RequestError

if TYPE_CHECKING:
    import tarfile


def pack_changes(req: P.PackChanges) -> P.PathResult:
    if not os.path.isdir(req.image):
        raise RequestError(P.ErrorKind.FILE_NOT_FOUND, f"no image mounted at {req.image}")
    import tarfile  # here, not at the top: its import costs every boot ~40 ms in gVisor (shutil: bz2, lzma)

    skip = {os.path.normpath(path) for path in (*req.skip, req.image, req.archive)}
    with tarfile.open(req.archive, "w", format=tarfile.PAX_FORMAT) as tar:
        _Packer(tar, req.image.rstrip("/"), skip).walk("/")
    return P.PathResult(path=req.archive, size=os.stat(req.archive).st_size)


class _Packer:
    def __init__(self, tar: tarfile.TarFile, image: str, skip: set[str]) -> None:
        self.tar, self.image, self.skip = tar, image, skip
        self.packed_dirs: set[str] = {"/"}

    def walk(self, directory: str) -> None:
        try:
            entries = {entry.name: entry for entry in os.scandir(directory)}
        except OSError:
            return  # removed while we walk, or unreadable: as if it were not there
        in_image = self._image_names(directory)
        for name in sorted(in_image - entries.keys()):
            path = os.path.join(directory, name)
            if path not in self.skip:
                self._whiteout(path)
        for name in sorted(entries):
            path = os.path.join(directory, name)
            if path in self.skip:
                continue
            try:
                st = entries[name].stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                continue  # devices and sockets are no files to keep (and a device could pass for a whiteout)
            if self._differs(path, st):
                self._add(path)
            if stat.S_ISDIR(st.st_mode):
                self.walk(path)

    def _image_names(self, directory: str) -> set[str]:
        path = self.image + directory
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return set()
            return set(os.listdir(path))
        except OSError:
            return set()

    def _differs(self, path: str, st: os.stat_result) -> bool:
        try:
            was = os.lstat(self.image + path)
        except OSError:
            return True
        if (st.st_mode, st.st_uid, st.st_gid) != (was.st_mode, was.st_uid, was.st_gid):
            return True
        if stat.S_ISDIR(st.st_mode):
            return st.st_mtime_ns != was.st_mtime_ns
        if stat.S_ISLNK(st.st_mode):
            return os.readlink(path) != os.readlink(self.image + path)
        return (st.st_size, st.st_mtime_ns) != (was.st_size, was.st_mtime_ns)

    def _parents(self, path: str) -> None:
        """Each directory above ``path`` goes in with its own mode and owner (an overlay shows the upper's)."""
        parent = os.path.dirname(path)
        if parent in self.packed_dirs:
            return
        self._parents(parent)
        self.tar.add(parent, arcname=parent.lstrip("/"), recursive=False)
        self.packed_dirs.add(parent)

    def _add(self, path: str) -> None:
        self._parents(path)
        if path in self.packed_dirs:
            return
        try:
            self.tar.add(path, arcname=path.lstrip("/"), recursive=False)
        except OSError:
            return  # removed while we walk
        if os.path.isdir(path) and not os.path.islink(path):
            self.packed_dirs.add(path)

    def _whiteout(self, path: str) -> None:
        import tarfile

        self._parents(path)
        info = tarfile.TarInfo(path.lstrip("/"))
        info.type, info.devmajor, info.devminor, info.mode = tarfile.CHRTYPE, 0, 0, 0
        self.tar.addfile(info)
