"""A volume's snapshot and fork: 1 GiB in 10,000 files, beside `cp -a` of the same tree (the shell's copy).

    python benchmarks/volumes.py [--rounds 3] [--files 10000] [--mib 1024]

The files are written straight into the volume's directory on the host, in the daemon's mount namespace (a
sandbox's writes land there the same way). Each round takes a snapshot (`Volume.snapshot()`) and forks it into a
new volume (`Volume.create(from_snapshot=)`), beside `cp -a` of the volume's files on the same file system. With
the btrfs store (root, a kernel with btrfs: this machine) both are subvolume snapshots and copy nothing; with
`STASIS_VOLUME_STORE=copy` (plain directories) they copy the files. Writes benchmarks/results/volumes.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid

from common import report_ratios, serving_daemon

from stasis import Client, Volume
from stasis.volumes import Volumes

FILL = """
import os, sys
root, files, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
block = os.urandom(total // files)
for i in range(files):
    folder = os.path.join(root, f"d{i // 100:03d}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"f{i:05d}.bin"), "wb") as f:
        f.write(block)
"""


def in_daemon_namespace(pin: str, *argv: str) -> None:
    """Run ``argv`` where the daemon's mounts are (the btrfs store is mounted only there)."""
    subprocess.run(["nsenter", f"--mount={pin}", *argv] if os.path.exists(pin) else list(argv), check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--mib", type=int, default=1024)
    args = parser.parse_args()
    snapshots, forks, copies = [], [], []
    with serving_daemon("stasis-bench-volumes-") as paths, Client(paths) as client:
        volume = Volume.create(f"bench-{uuid.uuid4().hex[:6]}", client=client)
        store = volume.info().store
        data = Volumes(paths.volumes).data(volume.name) if store == "copy" else paths.volumes / volume.name / "data"
        pin = str(paths.mount_pin)
        in_daemon_namespace(pin, sys.executable, "-c", FILL, str(data), str(args.files), str(args.mib << 20))
        in_daemon_namespace(pin, "sync")
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
            in_daemon_namespace(pin, "cp", "-a", str(data), str(copy))
            copies.append(time.perf_counter() - started)
            in_daemon_namespace(pin, "rm", "-rf", str(copy))
            fork.delete()
            Volume.delete_snapshot(snapshot.id, client=client)
        volume.delete()
    rows = {
        f"snapshot ({args.mib} MiB in {args.files} files)": (snapshots, copies, "cp -a of the files"),
        f"fork of the snapshot ({args.mib} MiB in {args.files} files)": (forks, copies, "cp -a of the files"),
    }
    report_ratios("Volumes: snapshot and fork", "volumes", rows, {"rounds": args.rounds, "files": args.files,
                                                                   "mib": args.mib, "store": store})  # fmt: skip


if __name__ == "__main__":
    main()
