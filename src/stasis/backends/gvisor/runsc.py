"""The runsc command line, and choosing a platform that really works on this host."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import procs
from ...errors import BackendError, StateError
from ...fsutil import atomic_write

log = logging.getLogger(__name__)

DELETE_TIMEOUT = 20.0  # `runsc delete` takes ~0.1 s; longer means the sandbox is wedged
GONE_TIMEOUT = 10.0  # for its killed processes to exit, before they are killed again by pid
PLATFORM_PREFERENCE = ("systrap", "ptrace")  # never kvm: on these hosts /dev/kvm is PVM and runsc hangs


def find_runsc() -> str:
    path = os.environ.get("STASIS_RUNSC") or shutil.which("runsc")
    if not path:
        raise BackendError(
            "runsc not found on PATH; install gVisor (`make setup`, or `apt-get install runsc`) "
            "or set STASIS_RUNSC to its path"
        )
    return path


async def runsc_version(binary: str) -> str:
    out = (await procs.run([binary, "--version"], timeout=30)).stdout.decode(errors="replace")
    first = out.splitlines()[0] if out else ""
    return first.removeprefix("runsc version ").strip() or "unknown"


async def supported_flags(binary: str, command: str, wanted: tuple[str, ...]) -> tuple[str, ...]:
    """The subset of ``wanted`` flags that this runsc build's ``command`` knows (older builds lack some)."""
    result = await procs.run([binary, command, "--help"], timeout=30)
    text = (result.stdout + result.stderr).decode(errors="replace")
    return tuple(flag for flag in wanted if "-" + flag.lstrip("-").split("=")[0] in text)


async def probe_platform(binary: str, platform: str, timeout: float = 20.0) -> tuple[bool, str]:
    """Run `true` in a throwaway sandbox on ``platform``. Returns (works, reason)."""
    with tempfile.TemporaryDirectory(prefix="stasis-probe-") as root:
        argv = [binary, "--root", root, f"--platform={platform}", "--network=none", "do", "true"]
        try:
            result = await procs.run(argv, timeout=timeout)
        except TimeoutError:
            return False, f"`runsc --platform={platform} do true` did not finish within {timeout:.0f}s"
    if result.returncode == 0:
        return True, f"`runsc --platform={platform} do true` succeeded"
    lines = result.output.splitlines()
    return False, lines[-1] if lines else f"exit code {result.returncode}"


async def choose_platform(binary: str, version: str, cache_dir: Path) -> tuple[str, str]:
    """The fastest platform that passes a real probe, cached in ``cache_dir`` per runsc binary and version: a
    probe costs ~1 s, so it runs once per runsc build and boot (the cache lives on /run, beside every home's
    runtime: a reboot, perhaps into another kernel, probes again)."""
    forced = os.environ.get("STASIS_RUNSC_PLATFORM")
    if forced:
        return forced, "set by STASIS_RUNSC_PLATFORM"
    cache = cache_dir / "runsc-platform.json"
    cached = _read_own(cache) if _own_directory(cache_dir) else {}
    if (
        cached.get("version") == version
        and cached.get("binary") == binary
        and cached.get("platform") in PLATFORM_PREFERENCE
    ):
        return cached["platform"], str(cached.get("reason", ""))[:500]
    reasons = []
    for platform in PLATFORM_PREFERENCE:
        works, reason = await probe_platform(binary, platform)
        if works:
            chosen = (platform, (reason + (f"; skipped: {'; '.join(reasons)}" if reasons else ""))[:500])
            cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            if _own_directory(cache_dir):  # never written where another user could swap files under it
                record = {"version": version, "binary": binary, "platform": chosen[0], "reason": chosen[1]}
                atomic_write(cache, json.dumps(record).encode())  # daemons of other homes read it meanwhile
            log.info("runsc platform: %s (%s)", *chosen)
            return chosen
        reasons.append(f"{platform}: {reason}")
    raise BackendError("no runsc platform works on this host: " + "; ".join(reasons))


def _own_directory(directory: Path) -> bool:
    try:
        found = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == os.geteuid() and not found.st_mode & 0o022


def _read_own(cache: Path) -> dict[str, Any]:
    """The cached probe if this user wrote it (the directory may be /tmp's, where others write), else nothing."""
    try:
        fd = os.open(cache, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return {}
        with os.fdopen(fd, closefd=False) as file:
            found = json.loads(file.read(4096))
        return found if isinstance(found, dict) else {}
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)


# runsc 20240729 refuses `--network=sandbox` in any namespace on kernels where every namespace has
# /proc/sys/net/core/rmem_default (its test for "the root namespace"): run it where a tmpfs hides that
# directory, in a mount namespace of its own (mounts made before stay visible, nothing leaks out; as a
# slave, the host's unmounts of other sandboxes' disks reach it: it never keeps one busy).
HIDE_ROOT_NS_TEST = 'mount --make-rslave / && mount -t tmpfs stasis-net /proc/sys/net && exec "$@"'


@dataclass(frozen=True)
class Runsc:
    binary: str
    root: Path
    platform: str
    network: bool = False  # the sandbox's netstack on the device in its namespace (--network=sandbox)
    fast_storage: bool = False  # the writable layer in the sentry, its file store on the sandbox's disk

    def with_storage(self, storage: str) -> Runsc:
        return dataclasses.replace(self, fast_storage=storage == "fast")

    def argv(self, *args: str) -> list[str]:
        network = ["--network=sandbox", "--net-disconnect-ok"] if self.network else ["--network=none"]
        argv = [
            self.binary,
            "--root", str(self.root),
            f"--platform={self.platform}",
            *network,
            # durable: the writable layer is our host overlayfs (files stay out of the image); fast: an overlay
            # in the sentry's memory, backed by a file in the root mount (our overlay, on the sandbox's disk)
            "--overlay2=root:self" if self.fast_storage else "--overlay2=none",
            *args,
        ]  # fmt: skip
        if self.network and args and args[0] in ("run", "restore"):
            return ["unshare", "--mount", "--", "/bin/sh", "-c", HIDE_ROOT_NS_TEST, "sh", *argv]
        return argv

    async def _run(self, *args: str, timeout: float, **kwargs: Any) -> procs.Completed:
        """Every runsc call is bounded: one that hangs (a sandbox out of file descriptors) is an error."""
        try:
            return await procs.run(self.argv(*args), timeout=timeout, **kwargs)
        except TimeoutError:
            raise BackendError(f"`runsc {args[0]}` did not finish within {timeout:.0f}s; it was killed") from None

    async def call(self, *args: str, timeout: float = 120.0, **kwargs: Any) -> procs.Completed:
        result = await self._run(*args, timeout=timeout, **kwargs)
        if result.returncode != 0:
            raise BackendError(f"`runsc {args[0]}` failed (exit {result.returncode}): {result.output}")
        return result

    async def state(self, sandbox_id: str) -> dict[str, Any] | None:
        """The container's state, or None if runsc does not know it."""
        if not self.has_record(sandbox_id):
            return None
        result = await self._run("state", sandbox_id, timeout=30)
        if result.returncode != 0:
            return None
        try:
            return json.loads(result.stdout)
        except ValueError:
            return None

    async def list_ids(self) -> list[str]:
        result = await self._run("list", "--format=json", timeout=30)
        if result.returncode != 0:
            return []
        try:
            return [entry["id"] for entry in json.loads(result.stdout or b"[]") or []]
        except (ValueError, KeyError, TypeError):
            return []

    def recorded_pid(self, sandbox_id: str) -> int | None:
        """The sandbox process's pid from runsc's own record (a file read, not a 25 ms `runsc state` call), or
        None if the record is missing or not as expected; the caller checks that it is alive."""
        for record in self.root.glob(f"{sandbox_id}_sandbox:*.state"):
            try:
                pid = json.loads(record.read_bytes())["sandbox"]["pid"]
            except (OSError, ValueError, KeyError, TypeError):
                return None
            return pid if isinstance(pid, int) and pid > 0 else None
        return None

    def has_record(self, sandbox_id: str) -> bool:
        """Whether runsc keeps state for this container (a file check: no 10 ms runsc call)."""
        return any(self.root.glob(f"{sandbox_id}_sandbox:*.state"))

    async def delete(self, sandbox_id: str) -> None:
        """Kill and remove the container; fine if it is already gone. A wedged sandbox (its sentry out of
        host descriptors) can hang `runsc delete`: then its processes are killed by pid and it is retried."""
        if not self.has_record(sandbox_id):
            self.kill(sandbox_id)  # a start cut short before runsc wrote its record may have left processes
            return
        try:
            # Its processes are SIGKILLed first, as `delete -force` would: runsc then finds them gone instead of
            # waiting for them in its own polling loop (125 ms of every suspend and terminate here, now 25 ms).
            self.kill(sandbox_id)
            result = await self._run("delete", "-force", sandbox_id, timeout=DELETE_TIMEOUT)
            if result.returncode == 0 or not self.has_record(sandbox_id):
                await self._gone(sandbox_id)
                return
            why = result.output
        except BackendError as exc:
            why = str(exc)
        killed = self.kill(sandbox_id)
        log.warning("`runsc delete` of %s failed (%s); killed its processes %s", sandbox_id, why, killed)
        result = await self._run("delete", "-force", sandbox_id, timeout=DELETE_TIMEOUT)
        if result.returncode != 0 and self.has_record(sandbox_id):
            raise BackendError(f"`runsc delete` failed for {sandbox_id}: {result.output}")
        await self._gone(sandbox_id)

    async def _gone(self, sandbox_id: str) -> None:
        """Wait until the container's processes have exited: `runsc delete` signals them, and a gofer still
        exiting holds files of the sandbox's root open (its disk stays busy until it is gone)."""
        for attempt in range(2):
            deadline = time.monotonic() + GONE_TIMEOUT
            while self._processes(sandbox_id):
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            else:
                return
            if attempt == 0:
                log.warning("processes of %s outlived `runsc delete`; killing %s", sandbox_id, self.kill(sandbox_id))
        left = self._processes(sandbox_id)
        raise BackendError(f"processes of sandbox {sandbox_id} are still running after SIGKILL: {left}")

    def _processes(self, sandbox_id: str) -> list[tuple[int, str]]:
        root = f"--root={self.root}"
        return procs.processes(lambda cmd: cmd.startswith("runsc") and root in cmd and sandbox_id in cmd)

    def kill(self, sandbox_id: str) -> list[int]:
        """SIGKILL every process of this container (its sandbox and gofer name our root and its id)."""
        found = self._processes(sandbox_id)
        for pid, _ in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return [pid for pid, _ in found]


DELETED_DENTRY = re.compile(r'dentry\("([^"]*)"\)\.beforeSave: deleted and invalidated dentries')


def unsaveable(exc: BackendError, box_id: str, verb: str) -> BackendError | StateError:
    """runsc's refusal to save a process that uses a deleted directory, said as what to do about it."""
    found = DELETED_DENTRY.search(exc.message)
    if found is None:
        return exc
    return StateError(
        f"cannot {verb} sandbox {box_id}: a process in it holds open (or works in) a file or directory that was "
        f"deleted ({found[1]!r}), and gVisor cannot save that on the sandbox's disk. The sandbox is still running: "
        "end that process, or have it leave the directory, then try again"
    )
