"""What a microVM boots: a kernel, an initramfs, and an ext4 disk made from an image.

Everything here is built once and cached under ``<images>/microvm``, keyed by the hash
of its inputs, written under a temporary name and renamed into place when complete.

- ``vmlinux``: the PVH ELF kernel, decompressed from Debian's cloud kernel (QEMU boots
  it directly, a little faster than the bzImage, which stays the fallback).
- ``initramfs.cpio``: busybox, the virtio modules (built as modules in that kernel),
  the guest agent, and an /init that mounts the disk and hands over to the agent.
- ``<image>.ext4``: the image's root filesystem, read-only and shared by every VM;
  each sandbox writes to its own qcow2 overlay on top of it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ... import procs
from ...errors import BackendError
from ...fsutil import fsync_dir, fsync_file, tree_bytes
from ...guest import AGENT_DIR, AGENT_FILES, agent_digest
from ...images.runtime import MOUNT_POINT
from ...images.runtime import argv_prefix as bundled_python
from ...network.namespaces import GATEWAY_ADDRESS, INNER_ADDRESS

log = logging.getLogger(__name__)

AGENT_PORT_NAME = "stasis.agent"
# Load order matters: virtio_ring before virtio, both before the transports and devices.
MODULES = ("virtio_ring", "virtio", "virtio_mmio", "virtio_blk", "virtio_console", "failover", "net_failover",
           "virtio_net")  # fmt: skip
BUSYBOX = Path("/bin/busybox")
BASE_FORMAT = 2  # bump when how a base disk is made changes (templates made on it name it)
BASE_HEADROOM = 256 << 20  # free space on an image's base disk; each sandbox's disk grows it to its disk_mb
LZ4_LEGACY_MAGIC = b"\x02\x21\x4c\x18"
LZ4_LEGACY_BLOCK = 8 << 20

INIT_SCRIPT = r"""#!/bin/busybox sh
# stasis microVM init: mount the root disk, hand pid 1 to the guest agent on its virtio-serial port.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in __MODULES__; do insmod /modules/$m.ko || echo "stasis-init: cannot load $m" >/dev/console; done
if grep -qw stasis.probe /proc/cmdline; then echo stasis-probe-ok >/dev/console; poweroff -f; fi
for _ in $(seq 1 500); do [ -b /dev/vda ] && break; usleep 10000; done
mkdir -p /newroot
mount -t ext4 -o noatime /dev/vda /newroot || { echo "stasis-init: cannot mount /dev/vda" >/dev/console; poweroff -f; }
# The agent lives on its own read-only tmpfs, never on the sandbox's disk (a link planted there is removed).
[ -L /newroot/opt/stasis ] && rm -f /newroot/opt/stasis
mkdir -p /newroot/opt/stasis /newroot/proc /newroot/sys /newroot/dev /newroot/run /newroot/tmp
mount -t tmpfs -o size=4m,mode=755 stasis-agent /newroot/opt/stasis
cp /stasis/*.py /newroot/opt/stasis/
mount -o remount,ro /newroot/opt/stasis
port=""
for _ in $(seq 1 500); do
  for p in /sys/class/virtio-ports/*; do
    [ "$(cat "$p/name" 2>/dev/null)" = "__PORT__" ] && port=/dev/${p##*/}
  done
  [ -n "$port" ] && [ -c "$port" ] && break
  usleep 10000
done
[ -n "$port" ] || { echo "stasis-init: no agent port" >/dev/console; poweroff -f; }
python=/usr/bin/python3
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    stasis.hostname=*) hostname "${arg#stasis.hostname=}" ;;
    stasis.python=*) python="${arg#stasis.python=}" ;;
  esac
done
hostname > /newroot/etc/hostname
# A networked VM (stasis.net): eth0 is the tap in its gateway namespace. Every sandbox has the same
# addresses (see stasis.network.namespaces); the daemon's resolver answers at the gateway.
if grep -qw stasis.net /proc/cmdline; then
  for _ in $(seq 1 300); do [ -e /sys/class/net/eth0 ] && break; usleep 10000; done
  ip link set eth0 up && ip addr add __INNER__/30 dev eth0 && ip route add default via __GATEWAY__ \
    || echo "stasis-init: cannot configure eth0" >/dev/console
  printf 'nameserver __GATEWAY__\noptions timeout:2 attempts:2\n' > /newroot/etc/resolv.conf
fi
if [ "$python" = bundled ]; then  # stasis's own python, on the base disk: read-only to the sandbox (busybox's
  # remount reads /proc/mounts: before /proc moves)
  mount --bind /newroot/opt/stasis-python /newroot/opt/stasis-python
  mount -o remount,bind,ro /newroot/opt/stasis-python
  python="__BUNDLED__"
fi
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
mount -t tmpfs -o mode=755 tmpfs /newroot/run
ip link set lo up 2>/dev/null
# /dev now lives under /newroot: open the port there (a bare path would create a plain file).
exec switch_root /newroot $python -I -S -u /opt/stasis/boot.py 0<>"/newroot$port" 1>&0 2>/newroot/dev/console
"""


@dataclass(frozen=True)
class BootFiles:
    """A kernel and the initramfs that goes with its modules."""

    kernel: Path
    initramfs: Path
    key: str  # changes whenever the kernel, the modules, busybox or the agent change


def find_kernel_release(boot: Path = Path("/boot"), modules: Path = Path("/lib/modules")) -> str:
    """The newest installed Debian cloud kernel whose modules are present."""
    releases = sorted(
        (p.name.removeprefix("vmlinuz-") for p in boot.glob("vmlinuz-*-cloud-amd64")),
        key=_version_key,
        reverse=True,
    )
    for release in releases:
        if (modules / release / "modules.dep").exists():
            return release
    raise BackendError(
        "no Debian cloud kernel found for microVMs (/boot/vmlinuz-*-cloud-amd64 with its modules); "
        "install it with: apt-get install linux-image-cloud-amd64 (make setup does)"
    )


def _version_key(release: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", release)]


def boot_files(cache: Path, boot: Path = Path("/boot"), modules: Path = Path("/lib/modules")) -> BootFiles:
    """The kernel and initramfs for microVMs, built on first use (about a second)."""
    release = find_kernel_release(boot, modules)
    bzimage = boot / f"vmlinuz-{release}"
    module_files = _module_files(modules / release)
    if not BUSYBOX.exists():
        raise BackendError("busybox is missing; install it with: apt-get install busybox-static (make setup does)")
    digest = hashlib.sha256()
    for path in (bzimage, *module_files.values(), BUSYBOX):
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    digest.update(init_script().encode() + agent_digest().encode())
    key = f"{release}-{digest.hexdigest()[:12]}"
    directory = cache / f"boot-{key}"
    if not (directory / "initramfs.cpio").exists():
        _build_boot_files(directory, bzimage, module_files)
    kernel = directory / "vmlinux" if (directory / "vmlinux").exists() else bzimage
    return BootFiles(kernel=kernel, initramfs=directory / "initramfs.cpio", key=key)


def _module_files(release_dir: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for line in (release_dir / "modules.dep").read_text().splitlines():
        path = line.split(":", 1)[0]
        name = Path(path).name.split(".ko", 1)[0]
        if name in MODULES:
            found[name] = release_dir / path
    missing = [m for m in MODULES if m not in found]
    if missing:
        raise BackendError(f"the kernel in {release_dir} lacks the modules {missing} a microVM needs")
    for path in found.values():
        if path.suffix != ".ko":
            raise BackendError(f"module {path} is compressed; stasis expects plain .ko modules")
    return found


def _build_boot_files(directory: Path, bzimage: Path, module_files: dict[str, Path]) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        vmlinux = extract_vmlinux(bzimage.read_bytes())
        if vmlinux is None:
            log.warning("could not extract an ELF kernel from %s; booting the bzImage", bzimage)
        else:
            (staging / "vmlinux").write_bytes(vmlinux)
        write_initramfs(staging / "initramfs.cpio", module_files)
        for f in staging.iterdir():
            fsync_file(f)
        shutil.rmtree(directory, ignore_errors=True)
        os.rename(staging, directory)
        fsync_dir(directory.parent)
        log.info("built microVM boot files in %s", directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def extract_vmlinux(bzimage: bytes) -> bytes | None:
    """The ELF kernel inside a bzImage compressed with LZ4 (Debian's choice), or None."""
    import lz4.block  # a dependency of this backend only

    start = bzimage.find(LZ4_LEGACY_MAGIC)
    while start != -1:
        out = bytearray()
        pos = start + 4
        while pos + 4 <= len(bzimage):
            (size,) = struct.unpack_from("<I", bzimage, pos)
            if size.to_bytes(4, "little") == LZ4_LEGACY_MAGIC:  # a new stream starts: go on with it
                pos += 4
                continue
            if size == 0 or size > LZ4_LEGACY_BLOCK + (LZ4_LEGACY_BLOCK >> 8) + 64 or pos + 4 + size > len(bzimage):
                break  # the kernel appends the decompressed size: the end of the stream
            try:
                out += lz4.block.decompress(bzimage[pos + 4 : pos + 4 + size], uncompressed_size=LZ4_LEGACY_BLOCK)
            except lz4.block.LZ4BlockError:
                break
            pos += 4 + size
        if out[:4] == b"\x7fELF":
            return bytes(out)
        start = bzimage.find(LZ4_LEGACY_MAGIC, start + 1)
    return None


def init_script() -> str:
    script = INIT_SCRIPT.replace("__MODULES__", " ".join(MODULES)).replace("__PORT__", AGENT_PORT_NAME)
    script = script.replace("__BUNDLED__", " ".join(bundled_python()))
    return script.replace("__INNER__", INNER_ADDRESS).replace("__GATEWAY__", GATEWAY_ADDRESS)


def write_initramfs(dest: Path, module_files: dict[str, Path]) -> None:
    """A newc cpio archive (what the kernel unpacks) with init, busybox, modules and the agent."""
    entries: list[tuple[str, int, bytes]] = [
        ("bin", 0o040755, b""),
        ("dev", 0o040755, b""),
        ("proc", 0o040755, b""),
        ("sys", 0o040755, b""),
        ("modules", 0o040755, b""),
        ("stasis", 0o040755, b""),
        ("bin/busybox", 0o100755, BUSYBOX.read_bytes()),
        ("init", 0o100755, init_script().encode()),
    ]
    entries += [(f"stasis/{name}", 0o100644, (AGENT_DIR / name).read_bytes()) for name in AGENT_FILES]
    entries += [(f"modules/{name}.ko", 0o100644, path.read_bytes()) for name, path in module_files.items()]
    with open(dest, "wb") as out:
        for inode, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
            out.write(_newc_entry(inode, name, mode, data))


def _newc_entry(inode: int, name: str, mode: int, data: bytes) -> bytes:
    encoded = name.encode() + b"\0"
    fields = (inode, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
    header = b"070701" + b"".join(f"{v:08x}".encode() for v in fields)
    entry = header + encoded
    entry += b"\0" * (-len(entry) % 4)
    entry += data
    return entry + b"\0" * (-len(entry) % 4)


def base_size(rootfs: Path) -> int:
    """Bytes of the ext4 made from ``rootfs``: its files, ext4's overhead and some headroom, in whole MiB."""
    size = tree_bytes(rootfs) * 5 // 4 + BASE_HEADROOM
    return -(-size // (64 << 20)) * (64 << 20)


async def root_disk(cache: Path, image_key: str, rootfs: Path, python_runtime: Path | None = None) -> Path:
    """The image as a read-only ext4 file (built once per image build, seconds), just big enough; with
    ``python_runtime`` (an image without python3) that tree added at /opt/stasis-python on the disk, not in
    the image (the image's files are hard links in a staging tree).

    (``rootfs-KEY.ext4`` files, 8 GiB each, are the bases of sandboxes made before disks had sizes.)"""
    suffix = f"-{python_runtime.name}" if python_runtime else ""
    dest = cache / f"base{BASE_FORMAT}-{image_key}{suffix}.ext4"
    if dest.exists():
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    if shutil.which("mkfs.ext4") is None:
        raise BackendError("mkfs.ext4 is missing; install it with: apt-get install e2fsprogs (make setup does)")
    fd, staging = tempfile.mkstemp(prefix=f".{dest.name}.", dir=cache)
    os.close(fd)
    tree = None
    try:
        if python_runtime is not None:
            tree = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tree-", dir=cache))
            await asyncio.to_thread(_with_runtime, rootfs, python_runtime, tree / "rootfs")
            rootfs = tree / "rootfs"
        os.truncate(staging, await asyncio.to_thread(base_size, rootfs))
        # Inode tables and journal initialised now: otherwise every guest would zero them into its overlay.
        # -m 0: no blocks reserved for root (who runs everything in a sandbox): df's "available" is what fits.
        argv = ["mkfs.ext4", "-q", "-F", "-m", "0", "-L", "stasis-root", "-d", str(rootfs),
                "-E", "lazy_itable_init=0,lazy_journal_init=0", staging]  # fmt: skip
        result = await procs.run(argv, timeout=1800)
        if result.returncode != 0:
            raise BackendError(f"mkfs.ext4 could not make a disk from {rootfs}: {result.output}")
        fsync_file(Path(staging))
        os.chmod(staging, 0o444)
        os.rename(staging, dest)
        fsync_dir(cache)
        log.info("built root disk %s", dest)
        return dest
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
        if tree is not None:
            shutil.rmtree(tree, ignore_errors=True)


def _with_runtime(rootfs: Path, python_runtime: Path, dest: Path) -> None:
    from ...images.layers import link_tree

    link_tree(rootfs, dest)
    target = dest / MOUNT_POINT.lstrip("/")
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(python_runtime, target, symlinks=True)
