"""SSH into a sandbox through stasis, beside stasis's own API for the same work.

    .venv/bin/python benchmarks/ssh.py [--rounds N] [--megabytes M] [--backend gvisor|microvm]

Round trip: `ssh stasis-NAME true` (a new SSH connection each time: ProxyCommand, key authorisation,
sshd -i in the sandbox, key exchange) beside `Sandbox.run("true")` (one HTTP request). Throughput:
`scp` of an M MB file into the sandbox beside `Sandbox.write_file` of the same bytes. Prints
medians and writes benchmarks/results/ssh.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import serving_daemon, timed, write_results
from rich.console import Console
from rich.table import Table

from stasis import Client, Sandbox

console = Console(width=120)
STASIS = Path(sys.executable).parent / "stasis"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--megabytes", type=int, default=20)
    parser.add_argument("--backend", default="gvisor")
    args = parser.parse_args()
    with serving_daemon("stasis-bench-ssh-") as paths, tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch) / "home"
        (home / ".ssh").mkdir(parents=True, mode=0o700)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh/id_ed25519")], check=True)
        env = {**os.environ, "HOME": str(home), "STASIS_HOME": str(paths.home), "STASIS_IMAGE_DIR": str(paths.images)}
        config = Path(scratch) / "ssh_config"
        config.write_text(subprocess.run([str(STASIS), "ssh-config"], env=env, capture_output=True, text=True,
                                         check=True).stdout)  # fmt: skip
        key = str(home / ".ssh/id_ed25519")  # ssh looks in the passwd home, not $HOME
        ssh = ["-F", str(config), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-i", key]
        blob = Path(scratch) / "blob.bin"
        data = os.urandom(args.megabytes << 20)
        blob.write_bytes(data)
        client = Client(paths)
        sbx = Sandbox.create("bench-ssh", memory_mb=512, backend=args.backend, client=client)
        try:
            subprocess.run(["ssh", *ssh, "stasis-bench-ssh", "true"], env=env, check=True)  # host key made once

            def ssh_true() -> None:
                subprocess.run(["ssh", *ssh, "stasis-bench-ssh", "true"], env=env, check=True)

            def scp_up() -> None:
                subprocess.run(["scp", *ssh, str(blob), "stasis-bench-ssh:/root/blob.bin"], env=env, check=True)

            def write_file() -> None:
                sbx.write_file("/root/w.bin", data)

            copies = max(3, args.rounds // 3)
            rows = {
                "ssh stasis-NAME true": timed(ssh_true, args.rounds),
                "Sandbox.run('true')": timed(lambda: sbx.run("true"), args.rounds),
                f"scp {args.megabytes} MB in": timed(scp_up, copies),
                f"write_file {args.megabytes} MB": timed(write_file, copies),
            }
        finally:
            sbx.terminate()
            client.close()
    report = {name: statistics.median(samples) for name, samples in rows.items()}
    report |= {"backend": args.backend, "rounds": args.rounds, "megabytes": args.megabytes}
    table = Table(title=f"SSH through stasis ({args.backend}), medians", header_style="bold")
    for column in ("operation", "median", "throughput"):
        table.add_column(column, justify="left" if column == "operation" else "right")
    for name, samples in rows.items():
        median = statistics.median(samples)
        rate = f"{args.megabytes / median:.1f} MB/s" if "MB" in name else ""
        table.add_row(name, f"{median * 1000:.0f} ms", rate)
    ssh_rt, api_rt = report["ssh stasis-NAME true"], report["Sandbox.run('true')"]
    console.print(table)
    console.print(f"ssh round trip / API round trip: {ssh_rt / api_rt:.1f}x")
    console.print(f"wrote {write_results(f'ssh-{args.backend}', report)}")


if __name__ == "__main__":
    main()
