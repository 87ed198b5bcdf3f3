"""Importing OCI and Docker images without a Docker daemon: skopeo copies, umoci unpacks.

Why those two tools (Debian's ``skopeo`` and ``umoci``) rather than Python: they implement the image
specs (media types, compression, whiteouts, opaque directories, hard links across layers) and are
maintained by the people who write them; reading the small JSON documents (index, manifest, config)
is done here.

Every import goes through one OCI layout shared by all imports (``<images>/oci/layout``): a layer
two images share is stored once. The image's tag there is its key, so a removal frees exactly the
blobs nothing else uses. The small edits of the layout's index (tags, removing unnamed blobs) are
made here, in Python: the daemon makes them without starting a process. The unpacked root
filesystem is an image directory like any other (see :mod:`.store`), named
``<name>-<manifest digest>``: content-addressed.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from .. import procs
from ..errors import BackendError, InvalidRequest
from ..fsutil import atomic_write

log = logging.getLogger(__name__)

TRANSPORTS = ("docker-archive:", "oci-archive:", "oci:", "docker://")
HOST_ARCHITECTURE = "amd64"
PR_SET_PDEATHSIG = 1
PYTHONS = ("usr/bin/python3", "usr/local/bin/python3", "bin/python3")


class ImageConfig(BaseModel):
    """What an OCI image says about how to run it (``config`` of its config blob)."""

    env: dict[str, str] = Field(default_factory=dict)
    working_dir: str | None = None
    user: str | None = None
    entrypoint: list[str] = Field(default_factory=list)
    cmd: list[str] = Field(default_factory=list)
    exposed_ports: list[str] = Field(default_factory=list)
    architecture: str = HOST_ARCHITECTURE
    source: str = ""
    manifest_digest: str = ""

    @classmethod
    def from_blob(cls, blob: dict[str, Any], source: str, manifest_digest: str) -> ImageConfig:
        config = blob.get("config") or {}
        env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
        return cls(
            env=env,
            working_dir=config.get("WorkingDir") or None,
            user=config.get("User") or None,
            entrypoint=config.get("Entrypoint") or [],
            cmd=config.get("Cmd") or [],
            exposed_ports=sorted(config.get("ExposedPorts") or {}),
            architecture=blob.get("architecture", HOST_ARCHITECTURE),
            source=source,
            manifest_digest=manifest_digest,
        )


def check_reference(ref: str) -> str:
    """A reference skopeo can read, or an InvalidRequest saying what one looks like."""
    if not ref.startswith(TRANSPORTS):
        raise InvalidRequest(
            f"cannot import {ref[:120]!r}: name its transport, one of docker-archive:PATH (what `docker save` "
            "writes), oci-archive:PATH, oci:DIR[:TAG] or docker://REGISTRY/REPO:TAG"
        )
    if not ref.startswith("docker://"):
        path = ref.split(":", 1)[1]
        if ref.startswith(("oci:", "oci-archive:")) and ":" in path and not Path(path).exists():
            path = path.rsplit(":", 1)[0]  # oci:DIR:TAG, oci-archive:FILE:TAG
        if not Path(path).exists():
            raise InvalidRequest(f"cannot import {ref[:120]!r}: {path} does not exist")
    return ref


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BackendError(f"{name} is missing; install it with: apt-get install skopeo umoci (make setup does)")
    return path


def _die_with_parent() -> None:
    """In the child: SIGKILL when the importing process dies (an import cut off stops writing at once)."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


FREE_RESERVE = 1 << 30  # bytes an unpack leaves free on its file system
# Without STASIS_IMAGE_MAX_MB, an image may unpack to UNPACK_RATIO times its compressed layers (real images are
# 2-5 times; zeros, a bomb's filling, a thousand), at least UNPACK_FLOOR and at most UNPACK_CEILING.
UNPACK_RATIO = 20
UNPACK_FLOOR = 256 << 20
UNPACK_CEILING = 16 << 30


def image_size_limit(packed_bytes: int) -> int:
    """Bytes an image whose layers weigh ``packed_bytes`` may unpack to: ``STASIS_IMAGE_MAX_MB`` if set, else
    ``UNPACK_RATIO`` times its layers (at least ``UNPACK_FLOOR``, at most ``UNPACK_CEILING``)."""
    if configured := os.environ.get("STASIS_IMAGE_MAX_MB"):
        return int(configured) << 20
    return min(UNPACK_CEILING, max(UNPACK_FLOOR, UNPACK_RATIO * packed_bytes))


def _too_large(taken: int, packed: int, limit: int) -> str:
    if os.environ.get("STASIS_IMAGE_MAX_MB"):
        allowed = f"images may take {limit >> 20} MB here (STASIS_IMAGE_MAX_MB)"
    else:
        allowed = (
            f"an image may take {UNPACK_RATIO} times its layers, at least {UNPACK_FLOOR >> 20} and at most "
            f"{UNPACK_CEILING >> 20} MB: {limit >> 20} MB for this one"
        )
    return (
        f"the image unpacked to over {taken >> 20} MB from {packed / 1e6:.1f} MB of layers and was stopped (a layer "
        f"may be a decompression bomb): {allowed}, leaving {FREE_RESERVE >> 20} MB free; if the image is that "
        "large, set STASIS_IMAGE_MAX_MB (in MB) for the daemon, or free disk space"
    )


def _free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def _run(argv: list[str], what: str, timeout: float = 1800) -> str:
    try:
        result = procs.run_blocking(argv, timeout=timeout, preexec_fn=_die_with_parent)
    except TimeoutError:
        raise BackendError(f"{what} did not finish within {timeout:.0f}s") from None
    if result.returncode != 0:
        raise InvalidRequest(f"{what} failed: {result.output[-800:]}")
    return result.stdout.decode(errors="replace")


class OciLayout:
    """The layout all imports share."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def copy_in(self, ref: str, tag: str) -> None:
        """``ref`` into the layout under ``tag`` (blobs already there are not copied again)."""
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        argv = [_tool("skopeo"), "--insecure-policy", "copy", "--quiet", ref, f"oci:{self.directory}:{tag}"]
        _run(argv, f"reading {ref}")

    def manifest(self, tag: str) -> tuple[str, dict[str, Any]]:
        index = json.loads((self.directory / "index.json").read_text())
        for entry in index.get("manifests", []):
            if _tag_of(entry) == tag:
                return entry["digest"], self._blob(entry["digest"])
        raise BackendError(f"tag {tag} is missing from {self.directory}/index.json")

    def config(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self._blob(manifest["config"]["digest"])

    def _blob_path(self, digest: str) -> Path:
        algorithm, _, value = digest.partition(":")
        return self.directory / "blobs" / algorithm / value

    def _blob(self, digest: str) -> dict[str, Any]:
        return json.loads(self._blob_path(digest).read_text())

    def layer_bytes(self, tag: str) -> int:
        """What the layers of ``tag`` weigh compressed, as stored (not as its manifest says)."""
        _, manifest = self.manifest(tag)
        return sum(self._blob_path(layer["digest"]).stat().st_size for layer in manifest.get("layers") or [])

    def unpack(self, tag: str, bundle: Path) -> Path:
        """The image's root filesystem, layers applied (whiteouts honoured), at ``bundle/rootfs``.

        Layers are untrusted: a few MB can unpack to many GB. The unpack is stopped as soon as it has
        taken more than :func:`image_size_limit` (in proportion to its layers) of its file system, or would
        leave less than ``FREE_RESERVE`` free there."""
        packed = self.layer_bytes(tag)
        limit = image_size_limit(packed)
        bundle.parent.mkdir(parents=True, exist_ok=True)
        argv = [_tool("umoci"), "unpack", "--image", f"{self.directory}:{tag}", str(bundle)]
        started = procs.start_blocking(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       preexec_fn=_die_with_parent)  # fmt: skip
        output: list[bytes] = []
        reader = threading.Thread(target=lambda: output.append(started.proc.stdout.read()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        free_at_start = _free_bytes(bundle.parent)
        try:
            code = None
            while code is None:
                with contextlib.suppress(TimeoutError):
                    code = started.wait(0.2)
                free = _free_bytes(bundle.parent)
                if free_at_start - free > limit or free < FREE_RESERVE:
                    started.kill()
                    started.wait()
                    raise InvalidRequest(_too_large(free_at_start - free, packed, limit))
        except BaseException:
            started.kill()
            raise
        reader.join(5)
        if code != 0:
            raise InvalidRequest(f"unpacking {tag} failed: {b''.join(output).decode(errors='replace')[-800:]}")
        return bundle / "rootfs"

    def _index(self) -> dict[str, Any]:
        path = self.directory / "index.json"
        return json.loads(path.read_text()) if path.exists() else {"schemaVersion": 2, "manifests": []}

    def _write_index(self, index: dict[str, Any]) -> None:
        atomic_write(self.directory / "index.json", json.dumps(index).encode())

    def tags(self) -> list[str]:
        return [name for entry in self._index()["manifests"] if (name := _tag_of(entry))]

    def retag(self, old: str, new: str) -> None:
        """The manifest tagged ``old`` tagged ``new`` instead (the index is small JSON: no tool needed)."""
        index = self._index()
        for entry in index["manifests"]:
            if _tag_of(entry) == old:
                entry["annotations"][REF_NAME] = new
        self._write_index(index)

    def untag(self, tag: str) -> None:
        index = self._index()
        kept = [entry for entry in index["manifests"] if _tag_of(entry) != tag]
        if len(kept) != len(index["manifests"]):
            self._write_index({**index, "manifests": kept})

    def collect_garbage(self) -> None:
        """Remove blobs that no tag (no imported image) uses any more: what its manifests name is kept."""
        blobs = self.directory / "blobs"
        if not blobs.exists():
            return
        keep: set[str] = set()
        for entry in self._index()["manifests"]:
            keep.add(entry["digest"])
            with contextlib.suppress(OSError, ValueError, KeyError):
                manifest = self._blob(entry["digest"])
                keep.add(manifest["config"]["digest"])
                keep.update(layer["digest"] for layer in manifest.get("layers", []))
        for blob in blobs.glob("*/*"):
            if f"{blob.parent.name}:{blob.name}" not in keep:
                blob.unlink()


REF_NAME = "org.opencontainers.image.ref.name"


def _tag_of(entry: dict[str, Any]) -> str | None:
    return (entry.get("annotations") or {}).get(REF_NAME)


def find_python(rootfs: Path) -> str | None:
    """Where the image's python3 is (the agent runs on it), as a path inside the image."""
    for candidate in PYTHONS:
        path = rootfs / candidate
        if os.path.lexists(path):
            return "/" + candidate
    return None
