"""Checkpoint benchmark: stasis beside the raw runsc primitive, in the same run.

    .venv/bin/python benchmarks/checkpoints.py [--rounds N]

Rows (medians):
  MEMORY checkpoint        stasis: sbx.checkpoint("memory")      raw: pause, cp -a, checkpoint --leave-running, resume
  FILESYSTEM checkpoint    stasis: sbx.checkpoint("filesystem")  raw: pause + cp -a upper + resume
  create from checkpoint   stasis: create(snapshot_id) + run     raw: cp -a files + runsc restore + first reply
  copy(times=1|4)          stasis: sbx.copy(times=N)             raw: the MEMORY checkpoint + N restores
  checkpoint vs touched    MEMORY checkpoint time and size of a 1 GiB sandbox with 16 / 256 MiB touched
Prints a table and writes benchmarks/results/checkpoints.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path

from lifecycle import RawBox, Rig, holder_cmd, rig, timed
from rich.console import Console
from rich.table import Table

from stasis import AsyncSandbox
from stasis.backends.gvisor.backend import copy_tree
from stasis.backends.gvisor.runsc import Runsc
from stasis.guest import protocol as P

console = Console(width=140)
RESULTS = Path(__file__).parent / "results"


async def raw_checkpoint(raw: RawBox, dest: Path, memory: bool) -> None:
    raw.call(P.Sync())
    await raw.runsc.call("pause", raw.id)
    await copy_tree(raw.dir / "upper", dest / "files")
    if memory:
        (dest / "memory").mkdir()
        await raw.runsc.call(
            "checkpoint", "--leave-running", *raw.checkpoint_flags, "--image-path", str(dest / "memory"), raw.id
        )
    await raw.runsc.call("resume", raw.id)


async def raw_restore(root: Path, runsc: Runsc, image: Path, flags: tuple[str, ...], n: int, source: Path) -> RawBox:
    box = RawBox(root, runsc, image, flags, n, files_from=source / "files")
    await box._launch(
        "restore", "--detach", "--bundle", str(box.bundle), "--image-path", str(source / "memory"), box.id
    )
    box.call(P.Exec(cmd=["true"]))
    return box


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


async def bench(rounds: int) -> dict:
    async with rig("stasis-bench-ckpt-") as r:
        return await measure(r, rounds)


async def measure(r: Rig, rounds: int) -> dict:
    root, runsc, image, flags, client = r.root, r.runsc, r.image, r.flags, r.client
    version, platform = r.version, r.platform
    s: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        s.setdefault(key, []).append(value)

    counter = 0
    for n in range(rounds):
        console.print(f"round {n + 1}/{rounds}", style="dim")
        sbx = await AsyncSandbox.create(client=client, memory_mb=1024)
        await sbx.start_process(holder_cmd(64))
        raw = RawBox(root, runsc, image, flags, counter := counter + 1)
        await raw.start()
        raw.call(P.StartProcess(cmd=holder_cmd(64)))
        await asyncio.sleep(2)  # both holders fill their 64 MiB

        for kind in ("memory", "filesystem"):
            ckpt_box: list = []

            async def ours(kind: str = kind, box: list = ckpt_box) -> None:
                box.append(await sbx.checkpoint(kind))

            add(f"{kind}_checkpoint", await timed(ours))
            raw_dest = root / f"raw-ckpt-{kind}-{n}"
            raw_dest.mkdir()
            add(
                f"raw_{kind}_checkpoint",
                await timed(lambda d=raw_dest, k=kind: raw_checkpoint(raw, d, k == "memory")),
            )
            add(f"{kind}_checkpoint_bytes", float(ckpt_box[0].size_bytes))
            add(f"raw_{kind}_checkpoint_bytes", float(tree_bytes(raw_dest)))

        memory_ckpt = next(c for c in await AsyncSandbox.list_checkpoints(client=client) if c.type == "memory")
        restored: list[AsyncSandbox] = []

        async def create_from(restored: list = restored) -> None:
            child = await AsyncSandbox.create(client=client, snapshot_id=memory_ckpt.id)
            await child.run(["true"])
            restored.append(child)

        add("create_from_checkpoint", await timed(create_from))
        raw_children: list[RawBox] = []

        async def raw_create_from(children: list = raw_children) -> None:
            nonlocal counter
            counter += 1
            children.append(await raw_restore(root, runsc, image, flags, counter, root / f"raw-ckpt-memory-{n}"))

        add("raw_create_from_checkpoint", await timed(raw_create_from))

        for times in (1, 4):
            forks: list = []

            async def fork(times: int = times, forks: list = forks) -> None:
                forks.extend(await sbx.copy(times=times))

            add(f"copy_{times}", await timed(fork))

            async def raw_fork(times: int = times, children: list = raw_children) -> None:
                nonlocal counter
                dest = root / f"raw-fork-{n}-{times}"
                dest.mkdir()
                await raw_checkpoint(raw, dest, True)
                for _ in range(times):
                    counter += 1
                    children.append(await raw_restore(root, runsc, image, flags, counter, dest))

            add(f"raw_copy_{times}", await timed(raw_fork))
            for child in forks:
                await child.terminate()

        for child in restored:
            await child.terminate()
        for box in raw_children:
            await box.destroy()
        for c in await AsyncSandbox.list_checkpoints(client=client):
            await AsyncSandbox.delete_checkpoint(c.id, client=client)
        await sbx.terminate()
        await raw.destroy()

    for touched in (16, 256):
        sbx = await AsyncSandbox.create(client=client, memory_mb=1024)
        await sbx.start_process(holder_cmd(touched))
        await asyncio.sleep(1 + touched / 100)
        box: list = []

        async def take(box: list = box) -> None:
            box.append(await sbx.checkpoint("memory"))

        add(f"touched_{touched}_seconds", await timed(take))
        add(f"touched_{touched}_bytes", float(box[0].size_bytes))
        await AsyncSandbox.delete_checkpoint(box[0].id, client=client)
        await sbx.terminate()

    med = {k: statistics.median(v) for k, v in s.items()}
    rows = []
    for label, ours, theirs in (
        ("MEMORY checkpoint (64 MiB live)", "memory_checkpoint", "raw_memory_checkpoint"),
        ("FILESYSTEM checkpoint", "filesystem_checkpoint", "raw_filesystem_checkpoint"),
        ("create from checkpoint → first exec", "create_from_checkpoint", "raw_create_from_checkpoint"),
        ("copy(times=1)", "copy_1", "raw_copy_1"),
        ("copy(times=4)", "copy_4", "raw_copy_4"),
    ):
        rows.append({"operation": label, "stasis": med[ours], "raw": med[theirs], "ratio": med[ours] / med[theirs]})
    return {
        "rounds": rounds,
        "runsc": version,
        "platform": platform,
        "median_seconds": med,
        "rows": rows,
        "disk_per_checkpoint_bytes": {
            "memory": med["memory_checkpoint_bytes"],
            "filesystem": med["filesystem_checkpoint_bytes"],
        },
        "checkpoint_vs_touched_memory": {
            "16MiB": {"seconds": med["touched_16_seconds"], "bytes": med["touched_16_bytes"]},
            "256MiB": {"seconds": med["touched_256_seconds"], "bytes": med["touched_256_bytes"]},
        },
    }


def show(report: dict) -> None:
    table = Table(title=f"stasis checkpoints (median of {report['rounds']}, {report['platform']})", header_style="bold")
    for column in ("operation", "stasis", "raw primitive", "ratio"):
        table.add_column(column, justify="left" if column == "operation" else "right")
    for row in report["rows"]:
        table.add_row(
            row["operation"], f"{row['stasis'] * 1000:.0f} ms", f"{row['raw'] * 1000:.0f} ms", f"{row['ratio']:.2f}x"
        )
    console.print(table)
    disk = report["disk_per_checkpoint_bytes"]
    console.print(
        f"disk per checkpoint: MEMORY {disk['memory'] / 1e6:.1f} MB, FILESYSTEM {disk['filesystem'] / 1e6:.2f} MB"
    )
    for touched, row in report["checkpoint_vs_touched_memory"].items():
        console.print(
            f"1 GiB sandbox, {touched} touched: checkpoint {row['seconds'] * 1000:.0f} ms, {row['bytes'] / 1e6:.0f} MB"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    report = asyncio.run(bench(args.rounds))
    show(report)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "checkpoints.json").write_text(json.dumps(report, indent=2))
    console.print(f"wrote {RESULTS / 'checkpoints.json'}")


if __name__ == "__main__":
    main()
