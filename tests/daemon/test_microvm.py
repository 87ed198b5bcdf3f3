"""What only the microVM backend has: templates with per-sandbox identity, and its accelerator choice."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from stasis import Client, Sandbox
from stasis.backends.microvm.accel import HostView, choose_accelerator, kvm_blocker
from stasis.backends.microvm.artifacts import boot_files
from stasis.backends.microvm.qemu import find_qemu
from tests.conftest import IMAGE_DIR, Daemon

IDENTITY = "hostname; cat /etc/machine-id; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo"


def test_sandboxes_from_one_template_have_their_own_identity(client: Client) -> None:
    boxes = [Sandbox.create(f"twin-{i}", backend="microvm", memory_mb=512, client=client) for i in range(2)]
    try:
        templates = {box.info().runtime["template"] for box in boxes}
        assert len(templates) == 1, "both must come from the same saved VM"
        seen = [box.run(IDENTITY).stdout.split("\n") for box in boxes]
        (host_a, machine_a, random_a, _), (host_b, machine_b, random_b, _) = seen
        assert (host_a, host_b) == ("twin-0", "twin-1")
        assert machine_a != machine_b and len(machine_a) == 32
        assert random_a != random_b and len(random_a) == 64
        python = "import os, random; print(os.urandom(8).hex(), random.random())"
        assert boxes[0].run(["python3", "-c", python]).stdout != boxes[1].run(["python3", "-c", python]).stdout
        # The guest clock was set on restore, not left where the template was saved.
        guest_time = float(boxes[0].run("date +%s.%N").stdout)
        assert abs(guest_time - boxes[0].info().updated_at) < 60
    finally:
        for box in boxes:
            box.terminate()


def test_fabricated_hosts_without_working_kvm_get_tcg_with_the_reason(tmp_path: Path) -> None:
    dev_kvm = tmp_path / "kvm"
    modules = tmp_path / "module"
    cpuinfo = tmp_path / "cpuinfo"
    modules.mkdir()
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 vmx\n")
    assert "does not exist" in str(kvm_blocker(HostView(dev_kvm, modules, cpuinfo)))
    dev_kvm.write_bytes(b"")
    assert kvm_blocker(HostView(dev_kvm, modules, cpuinfo)) is None
    (modules / "kvm_pvm").mkdir()
    assert "PVM" in str(kvm_blocker(HostView(dev_kvm, modules, cpuinfo)))
    (modules / "kvm_pvm").rmdir()
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2\n")
    assert "no vmx or svm" in str(kvm_blocker(HostView(dev_kvm, modules, cpuinfo)))


def test_a_kvm_that_fails_a_real_boot_falls_back_to_tcg(tmp_path: Path) -> None:
    """Past the static checks, the real /dev/kvm must boot the real kernel, or TCG is used."""
    boot = boot_files(IMAGE_DIR / "microvm")
    modules = tmp_path / "module"
    modules.mkdir()
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu vmx\n")  # pretend the CPU offers VMX so that only the probe decides
    host = HostView(Path("/dev/kvm"), modules, cpuinfo)
    cache = tmp_path / "accelerator.json"
    chosen = asyncio.run(
        choose_accelerator(find_qemu(), "test", boot.kernel, boot.initramfs, cache, host, probe_timeout=8)
    )
    if not Path("/dev/kvm").exists():  # nothing to probe: the static check decides
        assert chosen.name == "tcg" and "does not exist" in chosen.reason
        return
    if Path("/sys/module/kvm_pvm").exists():  # this kind of host: /dev/kvm opens, guests do not run
        assert chosen.name == "tcg"
        assert "probe boot under KVM" in chosen.reason
    assert json.loads(cache.read_text())["name"] == chosen.name  # probed once, then cached


def test_doctor_and_info_report_the_accelerator_and_why(daemon: Daemon, client: Client) -> None:
    argv = [sys.executable, "-m", "stasis", "doctor", "--json"]
    doctor = subprocess.run(argv, env=daemon.env, capture_output=True, text=True, timeout=120)
    assert doctor.returncode == 0, doctor.stderr
    report = json.loads(doctor.stdout)["backends"]
    assert report["gvisor"]["works"] and report["microvm"]["works"]
    blocker = kvm_blocker()
    if blocker is not None:
        assert report["microvm"]["accelerator"] == "tcg"
        assert blocker in report["microvm"]["accelerator_reason"]
    box = Sandbox.create(backend="microvm", memory_mb=512, client=client)
    try:
        state = box.info().runtime
        assert state["accelerator"] == report["microvm"]["accelerator"]
        assert state["accelerator_reason"] == report["microvm"]["accelerator_reason"]
        shown = subprocess.run(
            [sys.executable, "-m", "stasis", "info", box.id], env=daemon.env, capture_output=True, text=True
        )
        assert "accelerator" in shown.stdout and state["accelerator"] in shown.stdout
    finally:
        box.terminate()
