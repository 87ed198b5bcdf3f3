"""Built images, cached by recipe hash under the image directory.

An image is a directory ``<name>-<hash>/`` holding ``rootfs/`` (never modified
after the build: sandboxes stack a writable layer on top) and ``image.json``.
A build happens under a temporary name and is renamed into place when complete,
so a crashed build never looks like an image.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel

from .. import faults, hostpath, procs
from ..errors import BackendError, ImageNotFound, InvalidRequest
from ..fsutil import atomic_write, fsync_dir, tree_bytes
from ..hostpath import IMAGE_KEY, is_plain_dir
from ..validation import NAME_PATTERN
from . import debcache, layers, oci
from .oci import ImageConfig
from .recipe import IMAGE_PYTHON, RECIPES, Recipe

log = logging.getLogger(__name__)

ProgressCallback = Callable[[str], None]
LOCK_WAIT = 120.0
DEB_CACHE = ".deb-cache"  # Debian's packages across builds (hidden: no image; no pid suffix: never swept)


class ImageInfo(BaseModel):
    name: str
    key: str
    digest: str
    packages: list[str]
    suite: str
    size_bytes: int
    built_at: float
    build_seconds: float
    path: str
    source: str = "recipe"  # "recipe" (mmdebstrap) or the reference it was imported from
    config: ImageConfig | None = None  # an imported image's Env, WorkingDir, User, ...
    python: str = "/usr/bin/python3"  # the image's interpreter the agent runs on; "": stasis's own (runtime.py)


class ImageStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def recipe(self, name: str) -> Recipe:
        recipe = RECIPES.get(name)
        if recipe is None:
            raise InvalidRequest(f"unknown image {name!r}; known images: {', '.join(sorted(RECIPES))}")
        return recipe

    def get(self, name: str) -> ImageInfo:
        if name not in RECIPES:
            if IMAGE_KEY.fullmatch(name) and ".." not in name and (self._dir(name) / "image.json").exists():
                return self.by_key(name)  # an exact build, by its key
            imported = [i for i in self.list() if i.name == name and i.source != "recipe"]
            if imported:
                return max(imported, key=lambda i: i.built_at)  # the latest import under that name
            known = sorted({*RECIPES, *(i.name for i in self.list() if i.name != "build-cache")})
            raise InvalidRequest(
                f"unknown image {name[:80]!r}; known images: {', '.join(known)} (`stasis image import` brings your own)"
            )
        recipe = self.recipe(name)
        if not (self._dir(recipe.key) / "image.json").exists():
            raise ImageNotFound(  # buildable: the SDK builds a recipe's image on its first use, then creates
                f"image {name!r} is not built yet; run `stasis image build {name}` (make setup builds 'default')",
                image=name,
                buildable=True,
            )
        return self.by_key(recipe.key)

    def rootfs(self, name: str) -> Path:
        return self.rootfs_by_key(self.get(name).key)

    def rootfs_by_key(self, key: str) -> Path:
        """The exact build a sandbox was made from: a rebuilt recipe must not change a sandbox's files."""
        self.by_key(key)
        return self._dir(key) / "rootfs"

    def by_key(self, key: str) -> ImageInfo:
        """The build ``key``: its record is read as untrusted input (a sandbox may have planted one
        somewhere): its key must be its directory's name, its path is ours, never a link."""
        directory = self._dir(key)
        meta = directory / "image.json"
        if not meta.exists():
            log.debug("image build %s: no %s", key, meta)  # the host's path for its owner, never in the message
            raise ImageNotFound(f"image build {key} is gone from this host's images; build or import it again")
        if meta.is_symlink() or not is_plain_dir(directory / "rootfs") or directory.is_symlink():
            raise InvalidRequest(f"image build {key} is damaged (a link where its files should be); remove it")
        try:
            info = ImageInfo.model_validate_json(meta.read_bytes())
        except ValueError as exc:
            raise InvalidRequest(f"image build {key} has an unreadable image.json: {str(exc)[:200]}") from None
        if info.key != key:
            raise InvalidRequest(f"image build {key} names itself {info.key[:80]!r}; remove it")
        return info.model_copy(update={"path": str(directory)})

    def _dir(self, key: str) -> Path:
        return hostpath.child(self.directory, key, "image key", IMAGE_KEY)

    def list(self) -> list[ImageInfo]:
        """Complete images only: a build or import under way (or cut off) lives under a hidden name."""
        images = []
        if self.directory.exists():
            for meta in sorted(self.directory.glob("*/image.json")):
                if meta.parent.name.startswith("."):
                    continue
                try:
                    images.append(self.by_key(meta.parent.name))
                except (InvalidRequest, ImageNotFound) as exc:
                    log.warning("skipping %s: %s", meta.parent, exc)
        return images

    # ------------------------------------------------------------ imported images

    def import_image(self, ref: str, name: str, progress: ProgressCallback | None = None) -> ImageInfo:
        """An OCI or Docker image as an image named ``name`` (see :mod:`.oci`); the same content twice is
        one image."""
        if name in RECIPES:
            raise InvalidRequest(f"{name!r} is a built-in recipe's name; import under another name")
        if not NAME_PATTERN.fullmatch(name) or ".." in name:
            raise InvalidRequest(f"invalid image name {name[:80]!r}: use 1-63 letters, digits, '.', '_' or '-'")
        oci.check_reference(ref)
        with self._layout_lock():
            return self._import(ref, name, progress)

    @contextlib.contextmanager
    def _layout_lock(self) -> Iterator[None]:
        """One import or removal at a time in this image directory (they share the OCI layout); waits at
        most LOCK_WAIT seconds, then says who holds it instead of hanging."""
        (self.directory / "oci").mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / "oci" / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            deadline = time.monotonic() + LOCK_WAIT
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise BackendError(
                            f"another import or removal holds {self.directory / 'oci' / '.lock'} for over "
                            f"{LOCK_WAIT:.0f}s; try again when it is done"
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)

    def _import(self, ref: str, name: str, progress: ProgressCallback | None) -> ImageInfo:
        """Under the layout lock (see import_image)."""
        self._sweep_staging()
        layout = oci.OciLayout(self.directory / "oci" / "layout")
        orphans = [t for t in layout.tags() if t.startswith("importing-") and not procs.pid_alive(int(t.split("-")[1]))]
        for orphan in orphans:  # the tag of an import cut off: its blobs go unless another image has them
            layout.untag(orphan)
        if orphans:
            layout.collect_garbage()
        tag = f"importing-{os.getpid()}-{secrets.token_hex(4)}"
        started = time.monotonic()
        staging: Path | None = None
        try:
            if progress:
                progress(f"copying {ref}")
            layout.copy_in(ref, tag)
            digest, manifest = layout.manifest(tag)
            blob = layout.config(manifest)
            config = oci.ImageConfig.from_blob(blob, ref, digest)
            if config.architecture != oci.HOST_ARCHITECTURE or blob.get("os", "linux") != "linux":
                raise InvalidRequest(
                    f"{ref} is an image for {blob.get('os', 'linux')}/{config.architecture}; this host runs "
                    f"linux/{oci.HOST_ARCHITECTURE} images (pick that platform's image, e.g. --platform linux/amd64)"
                )
            key = f"{name}-{digest.split(':', 1)[1][:12]}"
            final = self._dir(key)
            if (final / "image.json").exists():
                layout.untag(tag)
                return self.by_key(key)
            staging = self.directory / f".import-{key}-{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            if progress:
                progress(f"unpacking {digest[:19]}")
            rootfs = layout.unpack(tag, staging / "bundle")
            rootfs.rename(staging / "rootfs")
            shutil.rmtree(staging / "bundle")
            python = oci.find_python(staging / "rootfs") or ""  # none: the agent runs on stasis's own
            self._add_mount_points(staging / "rootfs")
            info = ImageInfo(
                name=name, key=key, digest=digest, packages=[], suite="oci",
                size_bytes=tree_bytes(staging / "rootfs"), built_at=time.time(),
                build_seconds=time.monotonic() - started, path=str(final), source=ref, config=config, python=python,
            )  # fmt: skip
            atomic_write(staging / "image.json", info.model_dump_json(indent=2).encode())
            os.rename(staging, final)
            fsync_dir(self.directory)
            layout.retag(tag, key)
        except BaseException:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            layout.untag(tag)
            with contextlib.suppress(Exception):
                layout.collect_garbage()
            raise
        log.info("imported %s as %s in %.1fs", ref, key, info.build_seconds)
        return info

    def commit(self, parent_key: str, upper: Path | None, name: str, key: str, config: ImageConfig,
               step: str) -> ImageInfo:  # fmt: skip
        """A build step's image: ``parent_key``'s files as hard links, with ``upper`` (a sandbox's overlay
        layer, from a FILESYSTEM checkpoint; None: the step changed only the config) applied."""
        final = self._dir(key)
        if (final / "image.json").exists():
            return self.by_key(key)
        parent = self.by_key(parent_key)
        started = time.monotonic()
        self._sweep_staging()
        staging = self.directory / f".commit-{key}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            layers.link_tree(Path(parent.path) / "rootfs", staging / "rootfs")
            if upper is not None:
                layers.apply_upper(upper, staging / "rootfs")
            python = oci.find_python(staging / "rootfs") or parent.python
            info = ImageInfo(
                name=name, key=key, digest=key, packages=parent.packages, suite=parent.suite,
                size_bytes=tree_bytes(staging / "rootfs"), built_at=time.time(),
                build_seconds=time.monotonic() - started, path=str(final), source=f"build: {step}"[:500],
                config=config, python=python,
            )  # fmt: skip
            atomic_write(staging / "image.json", info.model_dump_json(indent=2).encode())
            faults.point("image.commit.before_rename")
            try:
                os.rename(staging, final)
            except OSError as exc:  # another daemon on this store built the same step first: the same key, kept
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not (final / "image.json").exists():
                    raise
                shutil.rmtree(staging, ignore_errors=True)
                return self.by_key(key)
            fsync_dir(self.directory)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return info

    @staticmethod
    def _add_mount_points(rootfs: Path) -> None:
        """Mount points and the agent's directory, so runsc never has to create them in the image. An image
        is untrusted: these are made without following its links, and one that has a link (or a file)
        where stasis mounts something is refused."""
        for sub in ("proc", "sys", "dev", "tmp", "root", "opt/stasis", "opt/stasis-python", "etc"):
            if not layers.make_dirs_inside(rootfs, sub):
                raise InvalidRequest(
                    f"the image has a link or a file where stasis needs the directory /{sub} (it mounts its agent "
                    "and the sandbox's own files there); make it a directory in the image"
                )
        # a networked gVisor sandbox mounts its resolver's file here
        if not layers.touch_inside(rootfs, "etc", "resolv.conf"):
            raise InvalidRequest("the image's /etc/resolv.conf cannot be made; make /etc a directory in the image")

    def _sweep_staging(self) -> None:
        """Builds, imports, commits and uploads cut off (their process is gone) leave hidden entries: remove them."""
        for stale in self.directory.glob(".*-*") if self.directory.exists() else []:
            pid = stale.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not procs.pid_alive(int(pid)):
                if stale.is_dir() and not stale.is_symlink():
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    stale.unlink(missing_ok=True)

    def remove(self, key: str) -> None:
        """Remove one image build (the caller checked nothing uses it) and the layers only it used."""
        info = self.by_key(key)
        shutil.rmtree(self._dir(key))
        fsync_dir(self.directory)
        if info.source != "recipe":
            with self._layout_lock():
                layout = oci.OciLayout(self.directory / "oci" / "layout")
                layout.untag(key)
                layout.collect_garbage()
        log.info("removed image %s", key)

    def build(self, name: str, progress: ProgressCallback | None = None, force: bool = False) -> ImageInfo:
        """Build the image for recipe ``name`` unless a build of the same recipe exists."""
        recipe = self.recipe(name)
        final = self.directory / recipe.key
        if (final / "image.json").exists() and not force:
            return self.get(name)
        if shutil.which("mmdebstrap") is None:
            raise BackendError(
                "mmdebstrap not found on PATH; install it (`apt-get install mmdebstrap`) or run `make setup`"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._build_lock(recipe.key):  # a second build of the same recipe waits, then finds it built
            if (final / "image.json").exists() and not force:
                return self.get(name)
            return self._build(recipe, final, progress)

    @contextlib.contextmanager
    def _build_lock(self, key: str) -> Iterator[None]:
        """One build of a recipe at a time on this image directory, in any process (daemons, `make setup`)."""
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(self.directory / f".build-{key}.lock", flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _build(self, recipe: Recipe, final: Path, progress: ProgressCallback | None) -> ImageInfo:
        """Under the recipe's build lock (see build)."""
        staging = self.directory / f".build-{recipe.key}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        started = time.monotonic()
        argv = ["mmdebstrap", f"--variant={recipe.variant}", f"--include={','.join(recipe.packages)}"]
        argv += debcache.hooks(self.directory / DEB_CACHE, staging / "debs")
        argv += [recipe.suite, str(staging / "rootfs")]
        if mirror := os.environ.get("STASIS_APT_MIRROR"):
            argv.append(mirror)
        log.info("building image %s: %s", recipe.key, " ".join(argv))
        try:
            self._run_build(argv, progress)
            debcache.keep(self.directory / DEB_CACHE, staging / "debs")
            self._add_wheels(recipe, staging, progress)
            self._add_mount_points(staging / "rootfs")
            # Host keys made by openssh-server's install would be shared by every sandbox: each makes its own.
            for key in (staging / "rootfs" / "etc" / "ssh").glob("ssh_host_*"):
                key.unlink()
            info = ImageInfo(
                name=recipe.name,
                key=recipe.key,
                digest=recipe.digest,
                packages=sorted(recipe.packages),
                suite=recipe.suite,
                size_bytes=tree_bytes(staging / "rootfs"),
                built_at=time.time(),
                build_seconds=time.monotonic() - started,
                path=str(final),
            )
            atomic_write(staging / "image.json", info.model_dump_json(indent=2).encode())
            if final.exists():
                shutil.rmtree(final)
            os.rename(staging, final)
            fsync_dir(self.directory)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        log.info("built image %s in %.1fs (%d MB)", recipe.key, info.build_seconds, info.size_bytes >> 20)
        return info

    def _add_wheels(self, recipe: Recipe, staging: Path, progress: ProgressCallback | None) -> None:
        """The recipe's pinned wheels, downloaded on the host (no network in the tree), installed into it, then
        its ``after`` commands, in the tree."""
        rootfs, wheels = staging / "rootfs", staging / "rootfs" / "tmp" / "stasis-wheels"
        download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                    "--python-version", IMAGE_PYTHON, "-d", str(wheels), *recipe.wheels]  # fmt: skip
        install = ["chroot", str(rootfs), "sh", "-c", "PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q "
                   "--no-index --no-deps --no-cache-dir /tmp/stasis-wheels/*.whl"]  # fmt: skip
        for argv in (
            *([download, install] if recipe.wheels else []),
            *(["chroot", str(rootfs), "sh", "-c", command] for command in recipe.after),
        ):
            if progress is not None:
                progress(" ".join(argv[:6]))
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                raise BackendError(f"building {recipe.name}: {' '.join(argv[:6])} failed: {done.stderr[-2000:]}")
        shutil.rmtree(wheels, ignore_errors=True)

    def _run_build(self, argv: list[str], progress: ProgressCallback | None) -> None:
        tail: list[str] = []
        started = procs.start_blocking(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert started.proc.stdout is not None
        with started.proc.stdout:
            for line in started.proc.stdout:
                line = line.rstrip()
                tail = [*tail[-19:], line]
                log.debug("mmdebstrap: %s", line)
                if progress is not None and line:
                    progress(line)
        if (code := started.wait()) != 0:
            raise BackendError(f"mmdebstrap failed with exit code {code}; last output:\n" + "\n".join(tail))
