"""Checkpoint artifacts on disk: written under a temporary name, sealed with a manifest, immutable.

    checkpoints/<id>/manifest.json    every file with its size, mode and sha256
    checkpoints/<id>/files/           the sandbox's writable layer at that instant
    checkpoints/<id>/memory/          runsc's image of memory and processes (MEMORY only)
    checkpoints/.writing-<id>/        while being written; never visible as a checkpoint

The checkpoint's sha256 is the hash of its manifest; verifying re-hashes every
file and compares. Nothing is ever modified in place: restoring copies the files.

A file's digest covers its size and every 1 MiB block (at its offset) that is not all
zeros. A microVM's RAM file is mostly holes: hashing only its data extents makes that
cost what the guest touched, not its memory size, and the digest does not depend on
whether a copy kept the holes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

from ... import hostpath
from ...errors import CheckpointCorrupt
from ...fsutil import fsync_dir, fsync_tree, tree_bytes

CHUNK = 1 << 20
ZEROS = bytes(CHUNK)


def _data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """(start, end) of the parts of a file that hold data, holes left out."""
    extents, offset = [], 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError:  # ENXIO: only a hole remains
            break
        end = os.lseek(fd, start, os.SEEK_HOLE)
        extents.append((start, end))
        offset = end
    return extents


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        digest.update(size.to_bytes(8, "little"))
        block = 0  # the next block not hashed yet: two extents may share one
        for start, end in _data_extents(f.fileno(), size):
            block = max(block, start - start % CHUNK)
            while block < end:
                chunk = os.pread(f.fileno(), CHUNK, block)
                if chunk and chunk != ZEROS[: len(chunk)]:
                    digest.update(block.to_bytes(8, "little"))
                    digest.update(chunk)
                block += CHUNK
    return digest.hexdigest()


def manifest_of(root: Path, hashes: bool = True) -> list[dict]:
    entries = []
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            path = Path(directory, name)
            st = path.lstat()
            entry: dict = {"path": str(path.relative_to(root)), "mode": st.st_mode}
            if stat.S_ISREG(st.st_mode):
                entry["size"] = st.st_size
                if hashes:
                    entry["sha256"] = _file_sha256(path)
            elif stat.S_ISLNK(st.st_mode):
                entry["target"] = os.readlink(path)
            elif stat.S_ISCHR(st.st_mode):
                entry["rdev"] = st.st_rdev  # overlayfs whiteouts
            entries.append(entry)
    return entries


def manifest_digest(entries: list[dict]) -> str:
    return hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()


class CheckpointFiles:
    def __init__(self, root: Path) -> None:
        self.root = root

    def writing(self, checkpoint_id: str) -> Path:
        return self.root / f".writing-{self.path(checkpoint_id).name}"

    def path(self, checkpoint_id: str) -> Path:
        return hostpath.child(self.root, checkpoint_id, "checkpoint id", hostpath.CHECKPOINT_ID)

    def begin(self, checkpoint_id: str) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.writing(checkpoint_id)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        return partial

    def seal(self, checkpoint_id: str, durable: bool = True) -> tuple[str, int]:
        """Manifest, fsync, rename into place. Returns (sha256, bytes on disk).

        ``durable=False`` (a fork's checkpoint, used a moment later and deleted) skips the
        hashing and the fsync: a crash removes such a checkpoint anyway.
        """
        partial = self.writing(checkpoint_id)
        entries = manifest_of(partial, hashes=durable)
        (partial / "manifest.json").write_text(json.dumps(entries, sort_keys=True))
        if durable:
            fsync_tree(partial)
        os.rename(partial, self.path(checkpoint_id))
        if durable:
            fsync_dir(self.root)
        return manifest_digest(entries), tree_bytes(self.path(checkpoint_id))

    def verify(self, checkpoint_id: str, sha256: str | None) -> None:
        """Re-hash everything; raise CheckpointCorrupt naming the first thing that differs."""
        final = self.path(checkpoint_id)
        try:
            recorded = json.loads((final / "manifest.json").read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointCorrupt(f"checkpoint {checkpoint_id} has no readable manifest: {exc}") from exc
        if manifest_digest(recorded) != sha256:
            raise CheckpointCorrupt(f"checkpoint {checkpoint_id}: its manifest does not match the recorded sha256")
        actual = [e for e in manifest_of(final) if e["path"] != "manifest.json"]
        if actual != recorded:
            wanted = {e["path"]: e for e in recorded}
            found = {e["path"]: e for e in actual}
            changed = sorted(p for p in wanted.keys() | found.keys() if wanted.get(p) != found.get(p))
            raise CheckpointCorrupt(
                f"checkpoint {checkpoint_id} is corrupt: {len(changed)} file(s) differ from its manifest "
                f"(first: {changed[0]}); it cannot be restored: delete it with "
                f"`stasis checkpoints rm {checkpoint_id}`",
                changed=changed[:20],
            )

    def remove(self, checkpoint_id: str) -> None:
        shutil.rmtree(self.writing(checkpoint_id), ignore_errors=True)
        shutil.rmtree(self.path(checkpoint_id), ignore_errors=True)

    def sweep(self, keep: set[str]) -> list[str]:
        """Remove half-written artifacts and directories no checkpoint record owns."""
        removed = []
        if self.root.exists():
            for entry in self.root.iterdir():
                if entry.name.startswith(".writing-") or entry.name not in keep:
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry.name)
        return removed
