"""A directory as content-addressed chunks, and back.

Big regular files (disk images, memory images) are cut at fixed offsets into ``CHUNK`` pieces, so a
second artifact of the same sandbox, or one of another sandbox from the same image, shares every piece
that did not change; holes and zero pieces are not stored at all. Everything else (directories, small
files, symlinks, overlayfs whiteouts and their xattrs) travels as one GNU tar stream, cut the same way.
Every piece is named by the sha256 of its bytes and stored lz4-compressed; a download checks each
piece's hash before it writes a byte, and builds the tree under a temporary name, fsyncs it and only
then renames it into place.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lz4.frame

from ..errors import BackendError, CheckpointCorrupt, InvalidRequest
from ..fsutil import fsync_dir, fsync_tree
from .cache import ChunkCache
from .directory import DirectoryStore

if TYPE_CHECKING:
    from .objects import ObjectStore  # boto3 (0.13 s): imported where an S3 store is made

log = logging.getLogger(__name__)

CHUNK = 4 << 20
BLOB_MIN = 1 << 20  # regular files at least this big are chunked by offset
MAX_BLOB = 1 << 40  # a file's length, holes included: its manifest lists a piece (or a hole) per CHUNK
WORKERS = 8
ZERO = bytes(CHUNK)
TAR_FLAGS = ["--xattrs", "--xattrs-include=*", "--numeric-owner", "--sparse"]
# The same files make the same stream: no process id in header names, no access or change times.
REPEATABLE = "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime"


def chunk_key(sha: str) -> str:
    return f"chunks/{sha[:2]}/{sha}"


@dataclass
class Transfer:
    """What one push or pull moved."""

    chunks: int = 0  # distinct non-zero pieces the artifact is made of
    bytes: int = 0  # their bytes, uncompressed
    moved_chunks: int = 0  # pieces actually sent (push) or fetched from the store (pull)
    moved_bytes: int = 0  # bytes on the wire (compressed)
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, size: int, moved: int | None) -> None:
        with self._lock:
            self.chunks += 1
            self.bytes += size
            if moved is not None:
                self.moved_chunks += 1
                self.moved_bytes += moved

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


class Chunks:
    def __init__(self, objects: ObjectStore | DirectoryStore, cache: ChunkCache, workers: int = WORKERS) -> None:
        self.objects = objects
        self.cache = cache
        self.workers = workers

    # ------------------------------------------------------------ upload

    def upload_tree(self, root: Path) -> tuple[dict[str, Any], Transfer]:
        """Send what the store lacks; the section of a manifest that rebuilds ``root``. Running it
        again after an interruption sends only the pieces that did not arrive."""
        started = time.monotonic()
        transfer = Transfer()
        small, blobs = _walk(root)
        with ThreadPoolExecutor(self.workers) as pool:
            window = threading.BoundedSemaphore(self.workers * 2)  # pieces in memory at once
            seen: set[str] = set()  # pieces this push has seen: a repeated one is sent once
            lock = threading.Lock()

            def send(data: bytes) -> Future[str]:
                window.acquire()
                future = pool.submit(self._send, data, transfer, seen, lock)
                future.add_done_callback(lambda _: window.release())
                return future

            tar_chunks, tar_size = self._tar_pieces(root, small, send)
            blob_entries = [self._blob_pieces(root, blob, send) for blob in blobs]
            section = {
                "chunk_size": CHUNK,
                "tar": {"size": tar_size, "chunks": [f.result() for f in tar_chunks]},
                "blobs": [{**entry, "chunks": [f.result() if f else None for f in futures]}
                          for entry, futures in blob_entries],
            }  # fmt: skip
        transfer.seconds = time.monotonic() - started
        return section, transfer

    def _send(self, data: bytes, transfer: Transfer, seen: set[str], lock: threading.Lock) -> str:
        sha = hashlib.sha256(data).hexdigest()
        with lock:
            if sha in seen:
                return sha
            seen.add(sha)
        packed = lz4.frame.compress(data)
        # A piece the store has is trusted only if its bytes are ours (its ETag, the MD5 of a single PUT):
        # a damaged or tampered one is sent again, so a push repairs what a pull refused.
        if self.objects.etag(chunk_key(sha)) == hashlib.md5(packed, usedforsecurity=False).hexdigest():
            transfer.add(len(data), None)
        else:
            self.objects.put(chunk_key(sha), packed)
            transfer.add(len(data), len(packed))
        return sha

    def _tar_pieces(
        self, root: Path, entries: list[str], send: Callable[[bytes], Future[str]]
    ) -> tuple[list[Future[str]], int]:
        with tempfile.NamedTemporaryFile("wb") as listing:
            listing.write(b"\0".join(os.fsencode(e) for e in entries))
            listing.flush()
            argv = ["tar", "--create", "--file=-", f"--directory={root}", *TAR_FLAGS, REPEATABLE, "--null",
                    "--no-recursion", "--verbatim-files-from", f"--files-from={listing.name}"]  # fmt: skip
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert proc.stdout is not None
            futures, size = [], 0
            try:
                while piece := _read_full(proc.stdout, CHUNK):
                    size += len(piece)
                    futures.append(send(piece))
            finally:
                proc.stdout.close()
                stderr = proc.stderr.read() if proc.stderr else b""
                code = proc.wait()
            if code != 0:
                raise BackendError(f"tar could not read {root}: {stderr.decode(errors='replace').strip()}")
        return futures, size

    def _blob_pieces(
        self, root: Path, rel: str, send: Callable[[bytes], Future[str]]
    ) -> tuple[dict[str, Any], list[Future[str] | None]]:
        path = root / rel
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            stat = os.fstat(fd)
            if stat.st_size > MAX_BLOB:
                raise InvalidRequest(
                    f"{rel} is {stat.st_size} bytes long (holes or not); the remote store takes files up to "
                    f"{MAX_BLOB >> 30} GiB: shrink or remove it, then push again"
                )
            futures: list[Future[str] | None] = []
            for offset in range(0, stat.st_size, CHUNK):
                if not _has_data(fd, offset, CHUNK):
                    futures.append(None)
                    continue
                data = os.pread(fd, CHUNK, offset)
                futures.append(None if data == ZERO[: len(data)] else send(data))
        finally:
            os.close(fd)
        entry = {"path": rel, "size": stat.st_size, "mode": stat.st_mode & 0o7777, "uid": stat.st_uid,
                 "gid": stat.st_gid, "mtime_ns": stat.st_mtime_ns}  # fmt: skip
        return entry, futures

    # ------------------------------------------------------------ download

    def download_tree(self, section: dict[str, Any], dest: Path) -> Transfer:
        """Rebuild the tree at ``dest`` (which must not exist); nothing appears there unless all of it
        arrived and matched its hashes."""
        started = time.monotonic()
        transfer = Transfer()
        staging = dest.with_name(f".{dest.name}.pulling")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            with ThreadPoolExecutor(self.workers) as pool:
                self._untar(section["tar"]["chunks"], staging, pool, transfer)
                for blob in section["blobs"]:
                    self._write_blob(blob, staging, pool, transfer)
            fsync_tree(staging)
            staging.rename(dest)
            fsync_dir(dest.parent)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        transfer.seconds = time.monotonic() - started
        return transfer

    def fetch(self, sha: str, transfer: Transfer) -> bytes:
        packed = self.cache.get(sha)
        moved = None
        if packed is None:
            packed = self.objects.get(chunk_key(sha))
            moved = len(packed)
        data = _unpack(packed)
        if hashlib.sha256(data).hexdigest() != sha:
            raise CheckpointCorrupt(
                f"piece {sha[:16]} from {self.objects.url(chunk_key(sha))} does not match its sha256: the object was "
                "changed or damaged in the store; nothing was restored (push it again from a node that has it)"
            )
        if moved is not None:
            self.cache.put(sha, packed)
        transfer.add(len(data), moved)
        return data

    def _in_order(self, shas: list[str], pool: ThreadPoolExecutor, transfer: Transfer) -> Iterator[bytes]:
        """The pieces in order, fetched ahead in parallel."""
        ahead = self.workers * 2
        futures = [pool.submit(self.fetch, sha, transfer) for sha in shas[:ahead]]
        for index in range(len(shas)):
            if index + ahead < len(shas):
                futures.append(pool.submit(self.fetch, shas[index + ahead], transfer))
            yield futures[index].result()
            futures[index] = None  # type: ignore[call-overload]

    def _untar(self, shas: list[str], staging: Path, pool: ThreadPoolExecutor, transfer: Transfer) -> None:
        argv = ["tar", "--extract", "--file=-", "--same-permissions", "--same-owner", *TAR_FLAGS,
                f"--directory={staging}"]  # fmt: skip
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdin is not None
        try:
            for data in self._in_order(shas, pool, transfer):
                proc.stdin.write(data)
        except BrokenPipeError:
            pass
        finally:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
            stderr = proc.stderr.read() if proc.stderr else b""
            code = proc.wait()
        if code != 0:
            raise BackendError(f"tar could not unpack the artifact: {stderr.decode(errors='replace').strip()}")

    def _write_blob(self, blob: dict[str, Any], staging: Path, pool: ThreadPoolExecutor, transfer: Transfer) -> None:
        path = staging / blob["path"]
        if not path.resolve().is_relative_to(staging.resolve()):
            raise CheckpointCorrupt(f"the artifact names a file outside its tree: {blob['path']!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, blob["size"])
            present = [(i, sha) for i, sha in enumerate(blob["chunks"]) if sha]
            for (index, _), data in zip(present, self._in_order([s for _, s in present], pool, transfer), strict=True):
                os.pwrite(fd, data, index * CHUNK)
            os.fchown(fd, blob["uid"], blob["gid"])
            os.fchmod(fd, blob["mode"])
        finally:
            os.close(fd)
        os.utime(path, ns=(blob["mtime_ns"], blob["mtime_ns"]))


def _walk(root: Path) -> tuple[list[str], list[str]]:
    """(entries for the tar stream, big regular files), relative to ``root``, on its file system only."""
    device = root.stat().st_dev
    small, blobs = ["."], []
    for top, dirs, files in os.walk(root):
        for name in list(dirs):
            full = os.path.join(top, name)
            rel = os.path.relpath(full, root)
            small.append(rel)
            if os.lstat(full).st_dev != device:  # a mount point: its own entry, not what is mounted there
                dirs.remove(name)
        for name in files:
            full = os.path.join(top, name)
            stat = os.lstat(full)
            rel = os.path.relpath(full, root)
            if os.path.isfile(full) and not os.path.islink(full) and stat.st_size >= BLOB_MIN and stat.st_nlink == 1:
                blobs.append(rel)
            else:
                small.append(rel)
    return small, sorted(blobs)


def _unpack(packed: bytes) -> bytes:
    """A piece's bytes, never more than CHUNK (a piece from the store that would expand past it is refused, not
    inflated: its hash is checked after); b"" for one that is not lz4."""
    decompressor = lz4.frame.LZ4FrameDecompressor()
    try:
        data = decompressor.decompress(packed, max_length=CHUNK)
    except RuntimeError:
        return b""
    return data if decompressor.eof else b""


def _has_data(fd: int, offset: int, length: int) -> bool:
    """Whether any byte in [offset, offset+length) is data rather than a hole."""
    try:
        return os.lseek(fd, offset, os.SEEK_DATA) < offset + length
    except OSError as exc:
        return exc.errno != errno.ENXIO  # ENXIO: only holes from here to the end


def _read_full(stream: Any, size: int) -> bytes:
    parts, got = [], 0
    while got < size:
        part = stream.read(size - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)
