"""Lifecycle benchmark: stasis beside the raw primitive it is built on, measured in the same run.

    .venv/bin/python benchmarks/lifecycle.py [--rounds N] [--hold-mb M]

Rows (medians over N rounds):
  create → first exec   stasis: Sandbox.create + run(["true"])      raw: `runsc run -detach` + first agent reply
  exec round trip       stasis: run(["true"]) over HTTP + daemon     raw: subprocess.run(["true"]) on the host
  suspend               stasis: suspend()                            raw: `runsc checkpoint` + `runsc delete`
  resume → first exec   stasis: resume() + run(["true"])             raw: `runsc restore --detach` + first reply
  run when suspended    stasis: run(["true"]), resumed on demand     baseline: explicit resume() + run(["true"])

Both sides run the same workload (the guest agent, plus a process holding --hold-mb of
random bytes for suspend/resume), the same runsc flags and the same child reaping.
Prints a table and writes benchmarks/results/lifecycle.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from stasis import AsyncClient, AsyncSandbox, procs
from stasis.backends.gvisor import mounts
from stasis.backends.gvisor.agentdir import agent_dir
from stasis.backends.gvisor.backend import PREFERRED_CHECKPOINT_FLAGS
from stasis.backends.gvisor.bundle import oci_config
from stasis.backends.gvisor.runsc import Runsc, choose_platform, find_runsc, runsc_version, supported_flags
from stasis.guest import protocol as P
from stasis.models import SandboxSpec
from stasis.paths import Paths, default_home

console = Console(width=130)
RESULTS = Path(__file__).parent / "results"


def holder_cmd(megabytes: int) -> list[str]:
    code = f"import os, time\nb = os.urandom({megabytes} << 20)\nopen('/tmp/ready', 'w').close()\ntime.sleep(1e9)"
    return ["python3", "-c", code]


# ------------------------------------------------------------------ the raw primitive


class RawBox:
    """A runsc container driven by hand: what stasis would cost if it were only runsc."""

    def __init__(
        self,
        root: Path,
        runsc: Runsc,
        image: Path,
        checkpoint_flags: tuple[str, ...],
        n: int,
        files_from: Path | None = None,
    ) -> None:
        self.dir = root / f"raw-{n}"
        self.id = f"raw-{os.getpid()}-{n}"
        self.runsc = runsc
        self.checkpoint_flags = checkpoint_flags
        self.bundle, self.rootfs = self.dir / "bundle", self.dir / "bundle" / "rootfs"
        (self.dir / "upper").mkdir(parents=True)
        if files_from is not None:  # a restore: the checkpoint's files first
            subprocess.run(["cp", "-a", f"{files_from}/.", str(self.dir / "upper")], check=False)
        self.bundle.mkdir()
        agent = agent_dir(root / "agent")  # mounted read-only, as stasis does
        config = oci_config(self.id, self.id, SandboxSpec(memory_mb=1024), str(self.rootfs), agent, None)
        (self.bundle / "config.json").write_text(json.dumps(config))
        mounts.mount_overlay(image, self.dir / "upper", self.dir / "work", self.rootfs)
        for name in ("in", "out"):
            os.mkfifo(self.dir / name)
        self.to_guest = os.open(self.dir / "in", os.O_RDWR)
        self.from_guest = os.open(self.dir / "out", os.O_RDWR)
        self.seq = 0

    async def _launch(self, *args: str) -> None:
        await self.runsc.call(*args, stdin=self.to_guest, stdout=self.from_guest, stderr=subprocess.DEVNULL)

    def call(self, op: P.Operation[Any]) -> dict:
        self.seq += 1
        request = {"id": f"raw-{self.seq}", "op": op.op, "args": P.encode(op)}
        os.write(self.to_guest, json.dumps(request).encode() + b"\n")
        pending = b""
        while True:
            select.select([self.from_guest], [], [], 30)
            pending += os.read(self.from_guest, 1 << 20)
            for line in pending.split(b"\n")[:-1]:
                reply = json.loads(line)
                if reply["id"] == request["id"]:
                    return reply

    async def start(self) -> None:
        await self._launch("run", "-detach", "--bundle", str(self.bundle), self.id)
        self.call(P.Health())

    async def suspend(self) -> None:
        self.call(P.Sync())
        shutil.rmtree(self.dir / "image", ignore_errors=True)
        await self.runsc.call("checkpoint", *self.checkpoint_flags, "--image-path", str(self.dir / "image"), self.id)
        await self.runsc.delete(self.id)

    async def resume(self) -> None:
        image = str(self.dir / "image")
        await self._launch("restore", "--detach", "--bundle", str(self.bundle), "--image-path", image, self.id)
        self.call(P.Health())

    async def destroy(self) -> None:
        await self.runsc.delete(self.id)
        mounts.unmount(self.rootfs)
        os.close(self.to_guest)
        os.close(self.from_guest)
        shutil.rmtree(self.dir, ignore_errors=True)


# ------------------------------------------------------------------ measuring


async def timed(action: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await action()
    return time.perf_counter() - started


async def until_ready(sbx: AsyncSandbox, raw: RawBox) -> None:
    """Wait until both holder processes have their memory filled."""
    for _ in range(600):
        ours = (await sbx.run(["test", "-f", "/tmp/ready"])).exit_code
        theirs = raw.call(P.Exec(cmd=["test", "-f", "/tmp/ready"]))["result"]["exit_code"]
        if ours == theirs == 0:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("holder processes did not start")


async def host_true() -> None:
    subprocess.run(["true"], check=False)


async def start_daemon(paths: Paths) -> tuple[int, asyncio.Future[int]]:
    env = {**os.environ, "STASIS_HOME": str(paths.home), "STASIS_IMAGE_DIR": str(paths.images)}
    log = open(paths.home / "daemon.log", "ab")  # noqa: SIM115
    proc, exited = procs.spawn([sys.executable, "-m", "stasis", "serve"], env=env, stdout=log, stderr=log)
    log.close()
    client = AsyncClient(paths)
    client.autostart = False
    for _ in range(600):
        try:
            await client.json("GET", "/v1/health")
            break
        except Exception:
            await asyncio.sleep(0.05)
    await client.aclose()
    return proc.pid, exited


async def one_round(client: AsyncClient, raw: RawBox, hold_mb: int, samples: dict[str, list[float]]) -> None:
    created: list[AsyncSandbox] = []

    async def create() -> None:
        sbx = await AsyncSandbox.create(client=client, memory_mb=1024)
        await sbx.run(["true"])
        created.append(sbx)

    async def raw_create() -> None:
        await raw.start()
        raw.call(P.Exec(cmd=["true"]))

    samples["create_first_exec"].append(await timed(create))
    samples["raw_create_first_exec"].append(await timed(raw_create))
    sbx = created[0]

    async def agent_true() -> None:
        raw.call(P.Exec(cmd=["true"]))

    for _ in range(20):
        samples["exec"].append(await timed(lambda: sbx.run(["true"])))
        samples["raw_exec"].append(await timed(host_true))
        samples["agent_exec"].append(await timed(agent_true))

    # the same memory-holding workload on both sides
    await sbx.start_process(holder_cmd(hold_mb))
    raw.call(P.StartProcess(cmd=holder_cmd(hold_mb)))
    await until_ready(sbx, raw)

    samples["suspend"].append(await timed(sbx.suspend))
    samples["raw_suspend"].append(await timed(raw.suspend))

    async def resume() -> None:
        await sbx.resume()
        await sbx.run(["true"])

    async def raw_resume() -> None:
        await raw.resume()
        raw.call(P.Exec(cmd=["true"]))

    samples["resume_first_exec"].append(await timed(resume))
    samples["raw_resume_first_exec"].append(await timed(raw_resume))

    await sbx.suspend()  # and once more, resumed on demand by the first request
    samples["auto_resume_first_exec"].append(await timed(lambda: sbx.run(["true"])))
    await sbx.terminate()
    await raw.destroy()


@dataclass
class Rig:
    """A daemon on a temporary home, and runsc set up the way the daemon uses it, for the raw side."""

    root: Path
    paths: Paths
    image: Path
    version: str
    platform: str
    flags: tuple[str, ...]
    runsc: Runsc
    client: AsyncClient


@asynccontextmanager
async def rig(prefix: str) -> AsyncIterator[Rig]:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    image_dir = Path(os.environ.get("STASIS_IMAGE_DIR") or default_home() / "images")
    paths = Paths(home=root / "home", images=image_dir)
    paths.ensure()
    binary = find_runsc()
    version = await runsc_version(binary)
    platform, _ = await choose_platform(binary, version, paths.home)
    flags = await supported_flags(binary, "checkpoint", PREFERRED_CHECKPOINT_FLAGS)
    runsc = Runsc(binary, paths.runtime / "raw-runsc", platform)
    runsc.root.mkdir(parents=True)
    daemon_pid, daemon_exited = await start_daemon(paths)
    client = AsyncClient(paths)
    image = next(image_dir.glob("default-*/rootfs"))
    try:
        yield Rig(root, paths, image, version, platform, flags, runsc, client)
    finally:
        await client.aclose()
        os.kill(daemon_pid, signal.SIGTERM)
        await daemon_exited
        for leftover in await runsc.list_ids():
            await runsc.delete(leftover)
        shutil.rmtree(paths.runtime, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


async def bench(rounds: int, hold_mb: int) -> dict:
    samples: dict[str, list[float]] = {k: [] for k in (
        "create_first_exec", "raw_create_first_exec", "exec", "raw_exec", "suspend", "raw_suspend",
        "resume_first_exec", "raw_resume_first_exec", "agent_exec", "auto_resume_first_exec",
    )}  # fmt: skip
    async with rig("stasis-bench-") as r:
        for n in range(rounds):
            console.print(f"round {n + 1}/{rounds}", style="dim")
            await one_round(r.client, RawBox(r.root, r.runsc, r.image, r.flags, n), hold_mb, samples)
        version, platform, flags = r.version, r.platform, r.flags

    med = {k: statistics.median(v) for k, v in samples.items()}
    rows = [
        ("create → first exec", "create_first_exec", "raw_create_first_exec", "runsc run + first reply", 0.150),
        ("exec round trip (true)", "exec", "raw_exec", "subprocess.run(['true']) on host", 0.010),
        ("exec round trip (true)", "exec", "agent_exec", "agent over FIFO, no daemon", None),
        ("suspend", "suspend", "raw_suspend", "runsc checkpoint + delete", None),
        ("resume → first exec", "resume_first_exec", "raw_resume_first_exec", "runsc restore + first reply", None),
        (
            "run on a suspended sandbox",
            "auto_resume_first_exec",
            "resume_first_exec",
            "explicit resume, then run",
            None,
        ),
    ]
    report = {
        "rounds": rounds,
        "hold_mb": hold_mb,
        "runsc": version,
        "platform": platform,
        "checkpoint_flags": list(flags),
        "median_seconds": med,
        "agent_exec_over_fifo_median_seconds": med["agent_exec"],
        "rows": [
            {"operation": op, "stasis": med[a], "raw": med[b], "baseline": base, "ratio": med[a] / med[b], "goal": goal}
            for op, a, b, base, goal in rows
        ],
    }
    return report


def comparison_table(title: str, rows: list[dict]) -> Table:
    """Each operation beside its raw primitive: times, the ratio, and the goal where there is one."""
    table = Table(title=title, header_style="bold")
    for column in ("operation", "stasis", "raw primitive", "baseline", "ratio", "goal"):
        table.add_column(column, justify="right" if column in ("stasis", "raw primitive", "ratio") else "left")
    for row in rows:
        goal = f"≤ {row['goal'] * 1000:.0f} ms" if row["goal"] else ""
        table.add_row(
            row["operation"], f"{row['stasis'] * 1000:.1f} ms", f"{row['raw'] * 1000:.1f} ms", row["baseline"],
            f"{row['ratio']:.2f}x", goal,
        )  # fmt: skip
    return table


def save_report(name: str, report: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2))
    console.print(f"wrote {RESULTS / f'{name}.json'}")


def show(report: dict) -> None:
    title = f"stasis lifecycle (median of {report['rounds']} rounds, runsc {report['runsc']}, {report['platform']})"
    console.print(comparison_table(title, report["rows"]))
    console.print(
        f"agent exec over the FIFO, no daemon: {report['agent_exec_over_fifo_median_seconds'] * 1000:.2f} ms; "
        f"suspend/resume hold {report['hold_mb']} MiB of live random data"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--hold-mb", type=int, default=64)
    args = parser.parse_args()
    report = asyncio.run(bench(args.rounds, args.hold_mb))
    show(report)
    save_report("lifecycle", report)


if __name__ == "__main__":
    main()
