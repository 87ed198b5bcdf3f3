"""Which accelerator runs microVMs on this host: KVM where it really works, TCG otherwise.

`/dev/kvm` existing proves little: on hosts with nested paravirtual KVM (PVM) it opens
fine but an unmodified guest kernel dies on its first instructions. So KVM is chosen
only after the real kernel has booted under it (a probe boot of a few seconds, cached
per host kernel and QEMU version); every other case falls back to TCG with its reason.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from ... import procs
from ...fsutil import atomic_write

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 10.0  # a working KVM boots this kernel to its init in well under a second
PROBE_MARKER = "stasis-probe-ok"


@dataclass(frozen=True)
class Accelerator:
    name: str  # "kvm" or "tcg"
    reason: str


@dataclass(frozen=True)
class HostView:
    """The files the decision looks at; tests point it at a fabricated host."""

    dev_kvm: Path = Path("/dev/kvm")
    sys_module: Path = Path("/sys/module")
    cpuinfo: Path = Path("/proc/cpuinfo")


def kvm_blocker(host: HostView = HostView()) -> str | None:
    """Why KVM cannot work here, from what the host shows; None if it might."""
    if not host.dev_kvm.exists():
        return f"{host.dev_kvm} does not exist"
    if not os.access(host.dev_kvm, os.R_OK | os.W_OK):
        return f"{host.dev_kvm} is not readable and writable by this user"
    if (host.sys_module / "kvm_pvm").exists():
        return (
            f"{host.dev_kvm} is PVM (nested paravirtual KVM, kvm_pvm is loaded): it runs only guest kernels "
            "built with CONFIG_PVM_GUEST, and Debian's kernel is not"
        )
    try:
        flags = re.search(r"^flags\s*:(.*)$", host.cpuinfo.read_text(), re.M)
    except OSError:
        flags = None
    if flags is None or not {"vmx", "svm"} & set(flags.group(1).split()):
        return "the CPU exposes no hardware virtualisation (no vmx or svm flag in /proc/cpuinfo)"
    return None


async def probe_kvm(qemu: str, kernel: Path, initramfs: Path, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Boot the real kernel under KVM until its init answers; None if it did, else what went wrong."""
    argv = [
        qemu, "-M", "microvm", "-accel", "kvm", "-cpu", "host", "-m", "256", "-smp", "1",
        "-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-serial", "stdio",
        "-kernel", str(kernel), "-initrd", str(initramfs),
        "-append", "console=ttyS0 quiet panic=-1 stasis.probe",
    ]  # fmt: skip
    try:
        result = await procs.run(argv, timeout=timeout)
    except TimeoutError:
        return f"a probe boot under KVM did not finish within {timeout:.0f}s"
    if PROBE_MARKER in result.output:
        return None
    lines = [line for line in result.output.splitlines() if line.strip()]
    detail = "; ".join(lines[-2:]) or f"exit code {result.returncode}"
    return f"a probe boot under KVM failed: {detail[:300]}"


async def choose_accelerator(
    qemu: str,
    qemu_version: str,
    kernel: Path,
    initramfs: Path,
    cache: Path,
    host: HostView = HostView(),
    probe_timeout: float = PROBE_TIMEOUT,
) -> Accelerator:
    blocker = kvm_blocker(host)
    if blocker is not None:
        chosen = Accelerator("tcg", f"KVM unusable: {blocker}; using TCG (software emulation, slower)")
        log.info("microVM accelerator: %s (%s)", chosen.name, chosen.reason)
        return chosen
    key = f"{platform.release()} {qemu_version} {kernel.name}"
    try:
        cached = json.loads(cache.read_text())
        if cached.get("key") == key:
            return Accelerator(cached["name"], cached["reason"])
    except (OSError, ValueError, KeyError):
        pass
    failure = await probe_kvm(qemu, kernel, initramfs, probe_timeout)
    if failure is None:
        chosen = Accelerator("kvm", "a probe boot of the guest kernel under KVM succeeded")
    else:
        chosen = Accelerator("tcg", f"KVM unusable: {failure}; using TCG (software emulation, slower)")
    cache.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(cache, json.dumps({"key": key, "name": chosen.name, "reason": chosen.reason}).encode())
    log.info("microVM accelerator: %s (%s)", chosen.name, chosen.reason)
    return chosen


def tsc_khz() -> int:
    """The host TSC frequency; a TCG guest hangs calibrating its TSC unless told (tsc_early_khz)."""
    try:
        return int(Path("/sys/devices/system/cpu/cpu0/tsc_freq_khz").read_text())
    except (OSError, ValueError):
        pass
    match = re.search(r"^cpu MHz\s*:\s*([\d.]+)", Path("/proc/cpuinfo").read_text(), re.M)
    return int(float(match.group(1)) * 1000) if match else 2_000_000
