"""Checkpoint artifacts on disk: written under a temporary name, sealed with a manifest, immutable.

    checkpoints/<id>/manifest.json    every file with its size, mode and sha256
    checkpoints/<id>/files/           the sandbox's writable layer at that instant
    checkpoints/<id>/memory/          runsc's image of memory and processes (MEMORY only)
    checkpoints/.writing-<id>/        while being written; never visible as a checkpoint

The checkpoint's sha256 is the hash of its manifest; verifying re-hashes every
file and compares. Nothing is ever modified in place: restoring copies the files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

from ..errors import CheckpointCorrupt
from ..fsutil import fsync_dir, fsync_tree

CHUNK = 1 << 20


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_of(root: Path) -> list[dict]:
    entries = []
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            path = Path(directory, name)
            st = path.lstat()
            entry: dict = {"path": str(path.relative_to(root)), "mode": st.st_mode}
            if stat.S_ISREG(st.st_mode):
                entry |= {"size": st.st_size, "sha256": _file_sha256(path)}
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
        return self.root / f".writing-{checkpoint_id}"

    def path(self, checkpoint_id: str) -> Path:
        return self.root / checkpoint_id

    def begin(self, checkpoint_id: str) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.writing(checkpoint_id)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        return partial

    def seal(self, checkpoint_id: str) -> tuple[str, int]:
        """Manifest, fsync, rename into place. Returns (sha256, bytes)."""
        partial = self.writing(checkpoint_id)
        entries = manifest_of(partial)
        (partial / "manifest.json").write_text(json.dumps(entries, sort_keys=True))
        fsync_tree(partial)
        os.rename(partial, self.path(checkpoint_id))
        fsync_dir(self.root)
        return manifest_digest(entries), sum(e.get("size", 0) for e in entries)

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
