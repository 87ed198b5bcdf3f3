"""What fast storage costs where it is not faster: the lifecycle of a sandbox holding files, fast vs durable.

    python benchmarks/storage.py [--rounds 3] [--files 20000] [--big-mb 256]

Two gVisor sandboxes side by side, one per storage, each holding the same tree (``--files`` small files and one
file of ``--big-mb``, written once): suspend, resume → first exec, a FILESYSTEM and a MEMORY checkpoint, a live
fork, and the suspend image's size. A fast sandbox's files are in its kernel's memory, so its suspend image and
its MEMORY checkpoints carry them, and a FILESYSTEM checkpoint reads them through the sandbox. The ratio is fast
over durable. Writes benchmarks/results/storage.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from common import report_ratios, serving_daemon

from stasis import Client, Sandbox

WRITE = """set -e
mkdir -p /root/tree && cd /root/tree
python3 - <<'PY'
import os
for i in range({files}):
    d = f"d{{i // 500}}"
    os.makedirs(d, exist_ok=True)
    with open(f"{{d}}/f{{i}}.txt", "w") as f:
        f.write("x" * (100 + i % 4000))
PY
head -c {big_mb}M /dev/urandom > /root/big.bin
"""


def timed(action) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def one_round(sbx: Sandbox, client: Client, home: Path, image_mib: list[float]) -> dict[str, float]:
    out = {"suspend": timed(sbx.suspend)}
    image = home / "sandboxes" / sbx.id / "suspend"
    image_mib.append(sum(p.stat().st_blocks * 512 for p in image.iterdir()) / (1 << 20))
    out["resume → first exec"] = timed(lambda: (sbx.resume(), sbx.run(["true"])))
    made = []
    for kind in ("filesystem", "memory"):
        out[f"{kind.upper()} checkpoint"] = timed(lambda kind=kind: made.append(sbx.checkpoint(kind)))
    out["fork (copy, times=1)"] = timed(lambda: made.extend(sbx.copy(times=1)))
    for thing in made:
        if isinstance(thing, Sandbox):
            thing.terminate()
        else:
            Sandbox.delete_checkpoint(thing.id, client=client)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--big-mb", type=int, default=256)
    args = parser.parse_args()
    with serving_daemon("stasis-bench-storage-") as paths, Client(paths) as client:
        boxes = {
            storage: Sandbox.create(storage=storage, memory_mb=1024, disk_mb=8192, client=client)
            for storage in ("fast", "durable")
        }
        try:
            for sbx in boxes.values():
                done = sbx.run(WRITE.format(files=args.files, big_mb=args.big_mb), timeout=1800)
                if done.exit_code != 0:
                    raise RuntimeError(f"writing the tree failed in {sbx.id}: {done.stderr}")
            results: dict[str, list[dict[str, float]]] = {"fast": [], "durable": []}
            images: dict[str, list[float]] = {"fast": [], "durable": []}
            for _ in range(args.rounds):  # side by side, round by round: the noise hits both
                for storage, sbx in boxes.items():
                    results[storage].append(one_round(sbx, client, paths.home, images[storage]))
        finally:
            for sbx in boxes.values():
                sbx.terminate()
    fast, durable = results["fast"], results["durable"]
    rows = {op: ([r[op] for r in fast], [r[op] for r in durable], "durable storage") for op in fast[0]}
    sizes = {storage: statistics.median(mib) for storage, mib in images.items()}
    report_ratios(
        f"fast vs durable storage, holding {args.files} files + {args.big_mb} MiB",
        "storage",
        rows,
        {"rounds": args.rounds, "files": args.files, "big_mb": args.big_mb, "suspend_image_mib": sizes},
    )
    print(f"suspend image on disk: fast {sizes['fast']:.0f} MiB, durable {sizes['durable']:.0f} MiB")


if __name__ == "__main__":
    main()
