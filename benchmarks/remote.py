"""The remote store: push and pull throughput against boto3 copying the same bytes, and resume from the
store → first exec against a local resume, in one run, on moto's S3 server on loopback.

    python benchmarks/remote.py [--rounds 3] [--megabytes 256] [--backend gvisor]

Rows (medians): push of a FILESYSTEM checkpoint holding ``--megabytes`` of random data (every piece new:
a fresh prefix each round) vs boto3's ``upload_file`` of a file of that size (s3transfer: parallel
multipart); the pull of it on a second node (a cold cache) vs ``download_file``; a sandbox pushed by node
A and resumed by node B (take-over, fetch, restore) → first exec vs suspend/resume on one node → first
exec. Loopback and an in-process server measure our overhead (hashing, compression, the tar stream,
the manifest), not a network. Writes benchmarks/results/remote.json.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import tempfile
import time
from pathlib import Path

import boto3
from common import Comparison, report_ratios, serving_daemon
from moto.server import ThreadedMotoServer

from stasis import Client, Sandbox

BUCKET = "stasis-bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--megabytes", type=int, default=256)
    parser.add_argument("--backend", default="gvisor")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
    aws = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_REGION": "us-east-1"}  # fmt: skip
    os.environ.update(aws)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    rows: dict[str, Comparison] = {}
    report: dict[str, object] = {"megabytes": args.megabytes, "backend": args.backend}
    try:
        with contextlib.ExitStack() as stack:
            homes = []
            for node in ("a", "b"):
                env = {**aws, "STASIS_REMOTE": f"s3://{BUCKET}/bench", "STASIS_NODE": f"bench-{node}"}
                homes.append(stack.enter_context(serving_daemon(f"stasis-bench-remote-{node}-", **env)))
            a, b = (stack.enter_context(Client(paths=home)) for home in homes)
            rows.update(transfers(a, b, s3, args.rounds, args.megabytes, args.backend))
            rows.update(resumes(a, b, args.rounds, args.backend))
    finally:
        server.stop()
    report_ratios("remote store", "remote", rows, report)


def transfers(a: Client, b: Client, s3, rounds: int, megabytes: int, backend: str) -> dict[str, Comparison]:  # type: ignore[no-untyped-def]
    pushes, pulls, uploads, downloads = [], [], [], []
    for round_ in range(rounds):
        sbx = Sandbox.create(f"data-{round_}", backend=backend, memory_mb=512, client=a)
        sbx.run(f"head -c {megabytes << 20} /dev/urandom > /root/data.bin")
        checkpoint = sbx.checkpoint("filesystem")
        started = time.perf_counter()
        Sandbox.push_checkpoint(checkpoint.id, client=a)
        pushes.append(time.perf_counter() - started)
        started = time.perf_counter()
        Sandbox.pull_checkpoint(checkpoint.id, client=b)
        pulls.append(time.perf_counter() - started)
        sbx.terminate()
        with tempfile.TemporaryDirectory() as scratch:
            data = Path(scratch) / "data.bin"
            data.write_bytes(os.urandom(megabytes << 20))
            started = time.perf_counter()
            s3.upload_file(str(data), BUCKET, f"raw/{round_}")
            uploads.append(time.perf_counter() - started)
            started = time.perf_counter()
            s3.download_file(BUCKET, f"raw/{round_}", str(data) + ".back")
            downloads.append(time.perf_counter() - started)
    return {
        f"push {megabytes} MB checkpoint": (pushes, uploads, "boto3 upload_file"),
        f"pull {megabytes} MB checkpoint": (pulls, downloads, "boto3 download_file"),
    }


def resumes(a: Client, b: Client, rounds: int, backend: str) -> dict[str, Comparison]:
    remote, local = [], []
    for round_ in range(rounds):
        sbx = Sandbox.create(f"moving-{round_}", backend=backend, memory_mb=512, client=a)
        sbx.run("head -c 50000000 /dev/urandom > /root/state.bin")
        sbx.suspend()
        started = time.perf_counter()
        sbx.resume()
        sbx.run(["true"])
        local.append(time.perf_counter() - started)
        sbx.push()
        started = time.perf_counter()
        Sandbox.pull(sbx.id, client=b)
        moved = Sandbox.connect(sbx.id, client=b)
        moved.resume()
        moved.run(["true"])
        remote.append(time.perf_counter() - started)
        moved.terminate()
    return {"resume → first exec, from the store": (remote, local, "a local resume → first exec")}


if __name__ == "__main__":
    main()
