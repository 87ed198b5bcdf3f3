"""microVM benchmark: stasis's QEMU backend beside the raw QEMU primitive, measured in the same run.

    .venv/bin/python benchmarks/microvm.py [--rounds N] [--hold-mb M]

Rows (medians over N rounds; the raw side drives QEMU and QMP by hand, no daemon):
  create → first exec   stasis: create(backend="microvm") + run(["true"])
                        raw: copy the template's RAM and disk, QEMU -incoming, load, cont, first agent reply
  cold boot → first reply (reference: what a template saves)  raw QEMU boot of the kernel to the agent
  exec round trip       stasis: run(["true"]) over HTTP + daemon     raw: agent exec over the socket
  suspend               stasis: suspend()                            raw: stop, migrate, quit, fsync
  resume → first exec   stasis: resume() + run(["true"])             raw: QEMU -incoming, load, cont, first reply
  fork → first exec     stasis: copy(times=1) + run(["true"])        raw: stop, migrate, copy files, cont, restore
Host memory: RSS of an idle sandbox's QEMU, and of a suspended one (no process: zero).
Prints a table and writes benchmarks/results/microvm.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import time
from pathlib import Path
from typing import Any

from lifecycle import comparison_table, holder_cmd, rig, save_report, timed
from rich.console import Console

from stasis import AsyncSandbox, procs
from stasis.backends.microvm import qemu
from stasis.backends.microvm.files import copy_file
from stasis.backends.microvm.qemu import Machine, VmFiles
from stasis.fsutil import fsync_file
from stasis.guest import protocol as P

console = Console(width=140)


class RawVm:
    """One QEMU microVM driven by hand through QMP and its agent socket."""

    def __init__(self, root: Path, name: str, machine: Machine) -> None:
        self.files = VmFiles(root / name, root / "run" / name)
        self.files.directory.mkdir(parents=True)
        self.machine = machine
        self.name = name
        self.sock: socket.socket | None = None
        self.seq = 0

    def argv(self, incoming: bool) -> list[str]:
        return qemu.command_line(qemu.find_qemu(), self.machine, self.files, f"raw-{self.name}", incoming)

    def call(self, op: P.Operation[Any], timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while self.sock is None:
            try:
                self.sock = socket.socket(socket.AF_UNIX)
                self.sock.connect(str(self.files.agent))
            except OSError:
                self.sock = None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.005)
        self.seq += 1
        request = {"id": f"raw-{self.seq}", "op": op.op, "args": P.encode(op)}
        self.sock.settimeout(timeout)
        self.sock.sendall(json.dumps(request).encode() + b"\n")
        pending = b""
        while True:
            pending += self.sock.recv(1 << 20)
            for line in pending.split(b"\n")[:-1]:
                reply = json.loads(line)
                if reply["id"] == request["id"]:
                    return reply

    def disconnect(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    async def boot(self) -> None:
        await qemu.launch(self.argv(incoming=False), self.files)
        self.call(P.Health(), timeout=120)

    async def restore(self, vmstate: Path) -> None:
        await self.launch()
        await self.load(vmstate)

    async def launch(self) -> None:
        await qemu.launch(self.argv(incoming=True), self.files)

    async def load(self, vmstate: Path) -> None:
        async with qemu.qmp(self.files) as client:
            await qemu.load_state(client, vmstate)

    async def save(self, vmstate: Path, keep_running: bool = False) -> None:
        self.call(P.Sync())
        async with qemu.qmp(self.files) as client:
            await qemu.save_state(client, vmstate)
            if keep_running:
                return
            self.disconnect()
            await qemu.quit_vm(client, self.files)
        for path in (self.files.memory, self.files.disk, vmstate):
            fsync_file(path)

    async def cont(self) -> None:
        async with qemu.qmp(self.files) as client:
            await qemu.execute(client, "cont")

    async def destroy(self) -> None:
        self.disconnect()
        await qemu.kill(self.files)
        shutil.rmtree(self.files.directory, ignore_errors=True)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def qemu_pids_for(sandbox_id: str) -> list[int]:
    return [pid for pid, _ in procs.processes(lambda cmd: "qemu-system" in cmd and f"stasis-{sandbox_id}" in cmd)]


async def bench(rounds: int, hold_mb: int) -> dict:
    samples: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        samples.setdefault(key, []).append(value)

    memory: dict[str, list[float]] = {"idle_rss_kib": [], "suspended_processes": [], "idle_cpu_percent": []}
    async with rig("stasis-bench-microvm-") as r:
        warm = await AsyncSandbox.create(client=r.client, backend="microvm", memory_mb=1024)  # builds the template
        template = r.paths.images / "microvm" / "templates" / (await warm.info()).runtime["template"]
        machine = Machine(**json.loads((template / "vm.json").read_text())["machine"])
        await warm.terminate()
        describe = (await r.client.json("GET", "/v1/health"))["backends"]["microvm"]
        raw_root = r.root / "raw"

        cold = RawVm(raw_root, "cold", machine)
        shutil.copyfile(template / "disk.qcow2", cold.files.disk)
        add("raw_cold_boot", await timed(cold.boot))
        await cold.destroy()

        for n in range(rounds):
            console.print(f"round {n + 1}/{rounds}", style="dim")
            made: list[AsyncSandbox] = []

            async def create() -> None:
                sbx = await AsyncSandbox.create(client=r.client, backend="microvm", memory_mb=1024)
                await sbx.run(["true"])
                made.append(sbx)

            raw = RawVm(raw_root, f"vm-{n}", machine)

            async def raw_create() -> None:
                await copy_file(template / "disk.qcow2", raw.files.disk)
                await copy_file(template / "memory.ram", raw.files.memory)
                await raw.restore(template / "vmstate")
                raw.call(P.Exec(cmd=["true"]))  # the first request: it waits for the agent

            add("create", await timed(create))
            add("raw_create", await timed(raw_create))
            sbx = made[0]
            for _ in range(10):
                add("exec", await timed(lambda: sbx.run(["true"])))
                add("raw_exec", await timed(lambda: asyncio.to_thread(raw.call, "exec", {"cmd": ["true"]})))

            await sbx.start_process(holder_cmd(hold_mb))
            raw.call(P.StartProcess(cmd=holder_cmd(hold_mb)))
            for _ in range(1200):
                ours = (await sbx.run(["test", "-f", "/tmp/ready"])).exit_code
                theirs = raw.call(P.Exec(cmd=["test", "-f", "/tmp/ready"]))["result"]["exit_code"]
                if ours == theirs == 0:
                    break
                await asyncio.sleep(0.1)
            (pid,) = qemu_pids_for(sbx.id)
            memory["idle_rss_kib"].append(rss_kib(pid))
            used = cpu_seconds(pid)
            await asyncio.sleep(2)  # nothing runs in the guest but the holder, asleep
            memory["idle_cpu_percent"].append((cpu_seconds(pid) - used) / 2 * 100)

            add("suspend", await timed(sbx.suspend))
            vmstate = raw.files.directory / "vmstate"
            add("raw_suspend", await timed(lambda: raw.save(vmstate)))
            memory["suspended_processes"].append(len(qemu_pids_for(sbx.id)))

            async def resume() -> None:
                await sbx.resume()
                await sbx.run(["true"])

            async def raw_resume() -> None:
                await raw.restore(vmstate)
                raw.call(P.Exec(cmd=["true"]))

            add("resume", await timed(resume))
            add("raw_resume", await timed(raw_resume))

            # Where a resume's time goes, once more by hand, phase by phase: QEMU, then the guest.
            await raw.save(vmstate)
            add("phase_launch", await timed(raw.launch))
            add("phase_load_cont", await timed(lambda: raw.load(vmstate)))
            add("phase_first_reply", await timed(lambda: asyncio.to_thread(raw.call, "health")))
            add("phase_first_exec", await timed(lambda: asyncio.to_thread(raw.call, "exec", {"cmd": ["true"]})))
            add("phase_warm_reply", await timed(lambda: asyncio.to_thread(raw.call, "health")))
            add("phase_warm_exec", await timed(lambda: asyncio.to_thread(raw.call, "exec", {"cmd": ["true"]})))

            forks: list[AsyncSandbox] = []

            async def fork() -> None:
                (child,) = await sbx.copy(times=1)
                await child.run(["true"])
                forks.append(child)

            child = RawVm(raw_root, f"fork-{n}", machine)

            async def raw_fork() -> None:
                state = raw.files.directory / "fork.vmstate"
                await raw.save(state, keep_running=True)
                await copy_file(raw.files.disk, child.files.disk)
                await copy_file(raw.files.memory, child.files.memory)
                await raw.cont()
                await child.restore(state)
                child.call(P.Exec(cmd=["true"]))

            add("fork", await timed(fork))
            add("raw_fork", await timed(raw_fork))
            for box in (sbx, *forks):
                await box.terminate()
            for vm in (raw, child):
                await vm.destroy()

        # The daemon logs how a suspend splits into saving the VM and the fsync of its RAM file.
        log = (r.paths.home / "daemon.log").read_text(errors="replace")
        for save, fsync in re.findall(r"saved sb-\w+ in ([\d.]+)s, fsync ([\d.]+)s", log):
            add("suspend_save", float(save))
            add("suspend_fsync", float(fsync))

    med = {k: statistics.median(v) for k, v in samples.items()}
    rows = [
        ("create → first exec", "create", "raw_create", "template restore by hand + first reply", 0.300),
        ("exec round trip (true)", "exec", "raw_exec", "agent over the socket, no daemon", None),
        ("suspend", "suspend", "raw_suspend", "stop + migrate + quit + fsync", None),
        ("resume → first exec", "resume", "raw_resume", "QEMU -incoming + load + cont + reply", 0.100),
        ("fork (copy 1) → first exec", "fork", "raw_fork", "migrate + copy RAM/disk + restore", None),
        ("create → first exec", "create", "raw_cold_boot", "cold boot of the kernel (no template)", None),
    ]
    return {
        "rounds": rounds,
        "hold_mb": hold_mb,
        "qemu": describe.get("qemu_version"),
        "accelerator": describe.get("accelerator"),
        "accelerator_reason": describe.get("accelerator_reason"),
        "median_seconds": med,
        "resume_phases_median_seconds": {k.removeprefix("phase_"): v for k, v in med.items() if k.startswith("phase_")},
        "suspend_save_median_seconds": med.get("suspend_save"),
        "suspend_fsync_median_seconds": med.get("suspend_fsync"),
        "idle_rss_mib_median": statistics.median(memory["idle_rss_kib"]) / 1024,
        "idle_cpu_percent_median": statistics.median(memory["idle_cpu_percent"]),
        "suspended_qemu_processes": max(memory["suspended_processes"]),
        "rows": [
            {"operation": op, "stasis": med[a], "raw": med[b], "baseline": base, "ratio": med[a] / med[b], "goal": goal}
            for op, a, b, base, goal in rows
        ],
    }


def show(report: dict) -> None:
    title = (
        f"stasis microVM (median of {report['rounds']} rounds, QEMU {report['qemu']}, {report['accelerator']}, "
        f"{report['hold_mb']} MiB held in the guest; goals are for TCG)"
    )
    console.print(comparison_table(title, report["rows"]))
    phases = report["resume_phases_median_seconds"]
    console.print(
        "raw resume, phase by phase: "
        + ", ".join(f"{name.replace('_', ' ')} {seconds * 1000:.1f} ms" for name, seconds in phases.items())
    )
    if report["suspend_save_median_seconds"] is not None:
        console.print(
            f"suspend = saving the VM {report['suspend_save_median_seconds'] * 1000:.1f} ms "
            f"+ fsync of its RAM file {report['suspend_fsync_median_seconds'] * 1000:.1f} ms (goal ≤ 50 ms + fsync)"
        )
    console.print(
        f"host cost of an idle sandbox: QEMU RSS {report['idle_rss_mib_median']:.0f} MiB, "
        f"CPU {report['idle_cpu_percent_median']:.1f}% of a core; "
        f"suspended: {report['suspended_qemu_processes']} QEMU processes (0 MiB, 0% CPU)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hold-mb", type=int, default=64)
    args = parser.parse_args()
    report = asyncio.run(bench(args.rounds, args.hold_mb))
    show(report)
    save_report("microvm", report)


if __name__ == "__main__":
    main()
