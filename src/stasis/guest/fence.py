"""What the agent does as a microVM's init: grow the root file system to its disk, and fence in the
user's processes so that running out of processes or memory hits them, never the agent.

Under gVisor the host enforces both (the sandbox's cgroup, its disk file); in a microVM the
guest kernel is ours, and pid 1 dying panics it. So every command starts in a cgroup of its
own below ``user``, which has a process and a memory limit and an equal share of the CPU
with the agent, which stays outside it. Killing a command kills its cgroup: every process
it started, however it detached, in one step (a fork bomb cannot outrun it). The kernel
command line asks for this (``stasis.fence``); nothing here runs elsewhere. Stdlib only.
"""

from __future__ import annotations

import fcntl
import os
import struct
import sys

EXT4_IOC_RESIZE_FS = 0x40086610  # _IOW('f', 16, __u64): grow a mounted ext4 to this many blocks
CGROUP_ROOT = "/sys/fs/cgroup"
USER_CGROUP = f"{CGROUP_ROOT}/user"
AGENT_RESERVE_MB = 96  # memory the kernel and the agent keep when the user's processes use all theirs
MIN_PIDS = 1024


def wanted() -> bool:
    try:
        with open("/proc/cmdline") as f:
            return "stasis.fence" in f.read().split()
    except OSError:
        return False


def grow_root(device: str = "vda") -> None:
    """Grow / (ext4, mounted) to the size of its disk; nothing to do if it is that size already."""
    with open(f"/sys/class/block/{device}/size") as f:
        blocks = int(f.read()) * 512 // os.statvfs("/").f_frsize
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, EXT4_IOC_RESIZE_FS, struct.pack("Q", blocks))
    finally:
        os.close(fd)


class Fence:
    """The cgroup every command starts in; its event counters say which limit a command ran into."""

    def __init__(self, path: str = USER_CGROUP) -> None:
        self.path = path
        self.counter = 0
        self.leftovers: set[str] = set()  # groups of finished commands whose background processes live on
        self.pids_max = _read(os.path.join(path, "pids.max")).strip()
        self.memory_max = _read(os.path.join(path, "memory.max")).strip()

    @classmethod
    def create(cls) -> Fence:
        if not os.path.ismount(CGROUP_ROOT):
            _mount(b"cgroup2", CGROUP_ROOT.encode(), b"cgroup2")
        with open(f"{CGROUP_ROOT}/cgroup.subtree_control", "w") as f:
            f.write("+pids +memory +cpu")
        os.makedirs(USER_CGROUP, exist_ok=True)
        total_mb = _meminfo_mb("MemTotal")
        memory_mb = max(total_mb // 2, total_mb - AGENT_RESERVE_MB)
        with open(f"{USER_CGROUP}/memory.max", "w") as f:
            f.write(str(memory_mb << 20))
        with open(f"{USER_CGROUP}/pids.max", "w") as f:
            f.write(str(max(MIN_PIDS, total_mb)))
        return cls()

    def new_group(self) -> str:
        """A cgroup for one command (call with the process table's lock held)."""
        self.counter += 1
        group = f"{self.path}/c{self.counter}"
        try:
            os.mkdir(group)
        except OSError:
            return self.path  # still fenced in, only not killable in one step
        return group

    @staticmethod
    def join(group: str) -> None:
        """Move the calling process into ``group`` (in a forked child before exec: nothing that takes locks)."""
        fd = os.open(f"{group}/cgroup.procs", os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)

    def kill(self, group: str) -> None:
        """SIGKILL every process in ``group`` at once."""
        if group != self.path:
            try:
                with open(f"{group}/cgroup.kill", "w") as f:
                    f.write("1")
            except OSError:
                pass

    def release(self, group: str) -> None:
        """Remove a finished command's group once it is empty (and any earlier ones that emptied since)."""
        if group != self.path:
            self.leftovers.add(group)
        for left in list(self.leftovers):
            try:
                os.rmdir(left)
            except FileNotFoundError:
                pass
            except OSError:
                continue  # processes still in it
            self.leftovers.discard(left)

    def counters(self) -> tuple[int, int]:
        """(times a fork failed at pids.max, processes the OOM killer killed) so far."""
        pids = _events(os.path.join(self.path, "pids.events")).get("max", 0)
        oom = _events(os.path.join(self.path, "memory.events")).get("oom_kill", 0)
        return pids, oom

    def exceeded_since(self, before: tuple[int, int]) -> str | None:
        """Which limit was hit after ``before`` (a snapshot of :meth:`counters`), said for a user."""
        pids, oom = self.counters()
        reasons = []
        if pids > before[0]:
            reasons.append(f"the sandbox's process limit ({self.pids_max}) was reached: forks failed with EAGAIN")
        if oom > before[1]:
            mib = int(self.memory_max) >> 20 if self.memory_max.isdigit() else self.memory_max
            reasons.append(f"the out-of-memory killer killed processes (commands may use {mib} MiB)")
        return "; ".join(reasons) or None


def setup() -> Fence | None:
    """Grow the disk and build the fence, if the kernel command line asks; None when not (gVisor)."""
    if not wanted():
        return None
    try:
        grow_root()
    except OSError as exc:
        print(f"stasis agent: cannot grow the root file system: {exc}", file=sys.stderr)
    try:
        return Fence.create()
    except OSError as exc:
        print(f"stasis agent: commands run unfenced: {exc}", file=sys.stderr)
        return None


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _events(path: str) -> dict[str, int]:
    counters = {}
    for line in _read(path).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            counters[key] = int(value)
    return counters


def _meminfo_mb(key: str) -> int:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) // 1024
    return 0


def _mount(source: bytes, target: bytes, fstype: bytes) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source, target, fstype, 0, None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {fstype.decode()} on {target.decode()}: {os.strerror(errno)}")
