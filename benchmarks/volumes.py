"""A volume's snapshot and fork: 1 GiB in 10,000 files, beside `cp -a` of the same tree (the shell's copy).

    python benchmarks/volumes.py [--rounds 3] [--files 10000] [--mib 1024]

The files are written straight into the volume's directory on the host (a sandbox's writes land there the same
way). Each round takes a snapshot (`Volume.snapshot()`: a copy walked by directory descriptors, reflinked where
the file system can) and forks it into a new volume (`Volume.create(from_snapshot=)`), beside `cp -a` of the
volume's files on the same file system. On a file system with reflinks (XFS, btrfs) no data is copied; on ext4
(this machine) all of it is. Writes
benchmarks/results/volumes.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import time
import uuid

from common import report_ratios, serving_daemon

from stasis import Client, Volume
from stasis.volumes import Volumes


def fill(root: str, files: int, total: int) -> None:
    size = total // files
    block = os.urandom(size)
    for i in range(files):
        folder = os.path.join(root, f"d{i // 100:03d}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"f{i:05d}.bin"), "wb") as f:
            f.write(block)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--mib", type=int, default=1024)
    args = parser.parse_args()
    snapshots, forks, copies = [], [], []
    with serving_daemon("stasis-bench-volumes-") as paths, Client(paths) as client:
        volume = Volume.create(f"bench-{uuid.uuid4().hex[:6]}", client=client)
        data = Volumes(paths.volumes).data(volume.name)
        fill(str(data), args.files, args.mib << 20)
        subprocess.run(["sync"], check=True)
        for round_number in range(args.rounds):
            started = time.perf_counter()
            snapshot = volume.snapshot()
            snapshots.append(time.perf_counter() - started)
            started = time.perf_counter()
            name = f"fork-{round_number}-{uuid.uuid4().hex[:6]}"
            fork = Volume.create(name, from_snapshot=snapshot.id, client=client)
            forks.append(time.perf_counter() - started)
            copy = data.parent / f"copy-{round_number}"
            started = time.perf_counter()
            subprocess.run(["cp", "-a", str(data), str(copy)], check=True)
            copies.append(time.perf_counter() - started)
            shutil.rmtree(copy)
            fork.delete()
            Volume.delete_snapshot(snapshot.id, client=client)
        volume.delete()
    rows = {
        f"snapshot ({args.mib} MiB in {args.files} files)": (snapshots, copies, "cp -a of the files"),
        f"fork of the snapshot ({args.mib} MiB in {args.files} files)": (forks, copies, "cp -a of the files"),
    }
    report_ratios("Volumes: snapshot and fork", "volumes", rows, {"rounds": args.rounds, "files": args.files,
                                                                   "mib": args.mib})  # fmt: skip


if __name__ == "__main__":
    main()
