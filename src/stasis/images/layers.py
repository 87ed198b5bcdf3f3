"""A new image's root filesystem: its parent's, with one build step's changes applied.

The parent's files are hard links (an image never changes once made, so sharing them is safe and a
step costs only what it changed); the step's changes are a sandbox's overlayfs upper layer, as a
FILESYSTEM checkpoint holds it: new and changed entries are whole copies (overlayfs copies a file up
before changing even its mode), a deleted entry is a *whiteout* (a character device 0/0), and a
directory replaced as a whole is *opaque* (xattr ``trusted.overlay.opaque=y``). A changed file is
always unlinked and written anew, never changed in place: the parent's link stays as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

OPAQUE = "trusted.overlay.opaque"


def link_tree(source: Path, dest: Path) -> None:
    """``dest`` as a copy of ``source`` whose files are hard links (directories are new, with the same
    owner, mode and times)."""
    dest.mkdir(parents=True, exist_ok=False)
    _copy_metadata(source, dest)
    for root, dirs, files in os.walk(source):
        rel = Path(root).relative_to(source)
        for name in dirs:
            src, dst = Path(root) / name, dest / rel / name
            if src.is_symlink():
                os.symlink(os.readlink(src), dst)
                os.lchown(dst, *_owner(src))
            else:
                dst.mkdir()
                _copy_metadata(src, dst)
        for name in files:
            os.link(Path(root) / name, dest / rel / name, follow_symlinks=False)
    for root, dirs, _ in os.walk(source, topdown=False):  # times last: adding entries changed them
        for name in dirs:
            src = Path(root) / name
            if not src.is_symlink():
                _copy_times(src, dest / src.relative_to(source))


def apply_upper(upper: Path, rootfs: Path) -> None:
    """Apply an overlayfs upper layer to ``rootfs`` (a tree of hard links made by :func:`link_tree`)."""
    for root, dirs, files in os.walk(upper):
        rel = Path(root).relative_to(upper)
        for name in sorted(files + dirs):
            src, dst = Path(root) / name, rootfs / rel / name
            info = os.lstat(src)
            if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:  # a whiteout: the entry was deleted
                _remove(dst)
                continue
            if stat.S_ISDIR(info.st_mode):
                opaque = _is_opaque(src)
                if opaque or not (dst.is_dir() and not dst.is_symlink()):
                    _remove(dst)
                    dst.mkdir()
                _copy_metadata(src, dst)
                continue
            _remove(dst)
            if stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(src), dst)
            elif stat.S_ISREG(info.st_mode):
                shutil.copyfile(src, dst)
            else:  # a FIFO or a device node made in the sandbox
                os.mknod(dst, info.st_mode, info.st_rdev)
            _copy_metadata(src, dst)
    for root, dirs, _ in os.walk(upper, topdown=False):
        for name in dirs:
            src = Path(root) / name
            if not src.is_symlink():
                _copy_times(src, rootfs / src.relative_to(upper))


def _is_opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _remove(path: Path) -> None:
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _owner(path: Path) -> tuple[int, int]:
    info = os.lstat(path)
    return info.st_uid, info.st_gid


def _copy_metadata(src: Path, dst: Path) -> None:
    info = os.lstat(src)
    os.lchown(dst, info.st_uid, info.st_gid)
    if not stat.S_ISLNK(info.st_mode):
        os.chmod(dst, stat.S_IMODE(info.st_mode))
    _copy_times(src, dst)


def _copy_times(src: Path, dst: Path) -> None:
    info = os.lstat(src)
    os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)


def make_dirs_inside(rootfs: Path, relative: str) -> bool:
    """Make the directory ``rootfs/relative`` (and its parents) without following any link: each step is
    opened with O_NOFOLLOW below the last, so an image whose ``/opt`` or ``/etc`` is a link to a host
    path never leads a write outside ``rootfs``. False if a step is a link or not a directory."""
    fd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in Path(relative).parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:  # ELOOP: a link; ENOTDIR: a file
                return False
            os.close(fd)
            fd = child
        return True
    finally:
        os.close(fd)


def touch_inside(rootfs: Path, directory: str, name: str) -> bool:
    """Create the empty file ``rootfs/directory/name`` unless something (even a link) is there; never
    through a link. False if ``directory`` is not a real directory inside ``rootfs``."""
    if not make_dirs_inside(rootfs, directory):
        return False
    fd = os.open(rootfs / directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd))
    except FileExistsError:
        pass
    except OSError:
        return False
    finally:
        os.close(fd)
    return True
