"""Warm pools: create → first exec claimed from a pool beside a create that boots, in one run.

    python benchmarks/pools.py [--rounds 10] [--backends gvisor,microvm] [--burst 20]

Rows per backend (medians): create → first exec (Sandbox.create + run(["true"])) from a ready pool
(a pool of 2) vs without one; then ``--burst`` creates at once (threads), from a pool of that size vs without:
the median latency of one create and the wall time of the burst. Each claim finds a ready member
(the pool is refilled between rounds): this measures the claim, not the refill.
Writes benchmarks/results/pools-BACKEND.json.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from common import Comparison, report_ratios, serving_daemon

from stasis import Client, Pool, Sandbox

MEMORY_MB = 256


def create_then_exec(client: Client, backend: str) -> tuple[float, Sandbox]:
    started = time.perf_counter()
    sbx = Sandbox.create(client=client, backend=backend, memory_mb=MEMORY_MB)
    sbx.run(["true"])
    return time.perf_counter() - started, sbx


def singles(client: Client, backend: str, rounds: int, pooled: bool) -> list[float]:
    samples = []
    for _ in range(rounds):
        if pooled:
            Pool.wait_ready("bench", client=client)
        seconds, sbx = create_then_exec(client, backend)
        samples.append(seconds)
        sbx.terminate()
    return samples


def burst(client: Client, backend: str, count: int) -> tuple[list[float], float]:
    started = time.perf_counter()
    with ThreadPoolExecutor(count) as workers:
        results = list(workers.map(lambda _: create_then_exec(client, backend), range(count)))
    wall = time.perf_counter() - started
    with ThreadPoolExecutor(4) as workers:
        list(workers.map(lambda r: r[1].terminate(), results))
    return [seconds for seconds, _ in results], wall


@contextlib.contextmanager
def pool(client: Client, backend: str, size: int) -> Iterator[None]:
    Pool.create("bench", size=size, backend=backend, memory_mb=MEMORY_MB, client=client)
    try:
        Pool.wait_ready("bench", timeout=900, client=client)
        yield
    finally:
        Pool.remove("bench", client=client)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--backends", default="gvisor,microvm")
    parser.add_argument("--burst", type=int, default=20)
    args = parser.parse_args()
    with serving_daemon("stasis-bench-pools-") as paths, Client(paths) as client:
        for backend in args.backends.split(","):
            cold = singles(client, backend, args.rounds, pooled=False)
            cold_burst, cold_wall = burst(client, backend, args.burst)
            with pool(client, backend, 2):  # idle members are not free on TCG: no more than a single needs
                warm = singles(client, backend, args.rounds, pooled=True)
            with pool(client, backend, args.burst):
                warm_burst, warm_wall = burst(client, backend, args.burst)
            rows: dict[str, Comparison] = {
                "create → first exec": (warm, cold, "no pool: a boot"),
                f"one create of {args.burst} at once": (warm_burst, cold_burst, "no pool: a boot"),
                f"{args.burst} creates at once, wall": ([warm_wall], [cold_wall], "no pool: a boot"),
            }
            report = {"rounds": args.rounds, "burst": args.burst, "backend": backend,
                      "pool_p95_s": statistics.quantiles(warm_burst, n=20)[-1],
                      "no_pool_p95_s": statistics.quantiles(cold_burst, n=20)[-1]}  # fmt: skip
            report_ratios(f"warm pools ({backend})", f"pools-{backend}", rows, report)


if __name__ == "__main__":
    main()
