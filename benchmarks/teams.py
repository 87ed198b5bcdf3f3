"""What teams cost a request: a team key's check (with its ownership lookup and the audit log's entry) beside the
owner's token on the same request, a transition's lifecycle event beside the same transition without it, and the
usage meter's reading of a running sandbox beside the bare read of its CPU counter.

    python benchmarks/teams.py [--rounds 300]

Over TCP to a daemon of its own: `GET /v1/sandboxes/ID` and `POST /v1/sandboxes/ID/exec` (`true`) with a team's
key and with the owner's token, interleaved; and `Store.transition` on a SQLite file of its own with the events
outbox and without it (its journal entry alone). The goal: each costs at most 1 ms more than its baseline. Writes
benchmarks/results/teams.json.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from common import report_ratios, serving_daemon, write_results

from stasis import Client, Sandbox
from stasis.daemon.core import store as store_module
from stasis.daemon.core.store import Store
from stasis.daemon.rooms.host_usage import cpu_reading
from stasis.daemon.rooms.meter import Meter
from stasis.models import SandboxSpec, SandboxStatus
from stasis.sdk import team as teams

OWNER = "bench-owner-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def requests(rounds: int) -> dict[str, tuple[list[float], list[float], str]]:
    port = free_port()
    with serving_daemon("stasis-bench-teams-", ("--tcp", f"127.0.0.1:{port}"), STASIS_TOKEN=OWNER):
        url = f"http://127.0.0.1:{port}"
        with Client(url=url, token=OWNER) as owner:
            teams.create_team("bench", client=owner)
            key = teams.create_key("bench", ["read", "write", "exec"], client=owner).key
            with Client(url=url, token=key) as team_client:
                sbx = Sandbox.create(backend="gvisor", memory_mb=256, client=team_client)
            rows = {}
            for name, method, path, body in (
                ("GET a sandbox", "GET", f"/v1/sandboxes/{sbx.id}", None),
                ("exec `true`", "POST", f"/v1/sandboxes/{sbx.id}/exec", {"cmd": ["true"]}),
            ):
                keyed, owned = [], []
                with httpx.Client(base_url=url) as http:
                    for _ in range(rounds):  # interleaved: the machine's noise falls on both alike
                        for token, samples in ((key, keyed), (OWNER, owned)):
                            started = time.perf_counter()
                            answer = http.request(method, path, json=body, headers={"authorization": f"Bearer {token}"})
                            samples.append(time.perf_counter() - started)
                            answer.raise_for_status()  # a refusal is not the request measured
                rows[f"{name} with a team's key"] = (keyed, owned, "the owner's token")
            rows["a meter reading of a running sandbox, kept"] = meter_readings(sbx.id, rounds)
            Sandbox.connect(sbx.id, client=owner).terminate()
    return rows


class _NoNetwork:
    def traffic(self, sandbox_id: str) -> None:
        return None


def meter_readings(sandbox_id: str, rounds: int) -> tuple[list[float], list[float], str]:
    """The meter's reading of a real sandbox's cgroup, kept durably (an fsync'd SQLite commit), beside the bare
    read of the same counter: what the meter adds for each running sandbox every STASIS_METER_SECONDS."""
    with tempfile.TemporaryDirectory() as directory:
        meter = Meter(Path(directory) / "meter.db", _NoNetwork())  # type: ignore[arg-type]
        kept, read = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            meter.sample(sandbox_id)
            kept.append(time.perf_counter() - started)
            started = time.perf_counter()
            cpu_reading(sandbox_id)
            read.append(time.perf_counter() - started)
        meter.db.close()
    return kept, read, "the bare read of its CPU counter"


def transitions(rounds: int) -> tuple[list[float], list[float], str]:
    with tempfile.TemporaryDirectory() as directory:
        with_events, without = [], []
        store = Store(Path(directory) / "with.db")
        info = store.insert_sandbox("sb-benchevents1", None, SandboxSpec(), "key")
        store.transition(info.id, SandboxStatus.RUNNING)
        original = store_module.event_of
        for _ in range(rounds):
            for samples, hook in ((with_events, original), (without, lambda *args: None)):
                store_module.event_of = hook  # without: the journal entry alone, as before events
                started = time.perf_counter()
                store.transition(info.id, SandboxStatus.SNAPSHOTTING)
                store.transition(info.id, SandboxStatus.RUNNING)
                samples.append((time.perf_counter() - started) / 2)
        store_module.event_of = original
    return with_events, without, "the same transition without its event"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    rows = requests(args.rounds)
    rows["a transition, with its lifecycle event"] = transitions(args.rounds)
    report = report_ratios("Teams: a key's check, the audit log, lifecycle events", "teams", rows,
                           {"rounds": args.rounds})  # fmt: skip
    for operation, (ours, base, _) in rows.items():
        extra = (statistics.median(ours) - statistics.median(base)) * 1000
        report[operation]["added_ms"] = extra
        print(f"{operation}: {extra:+.3f} ms (goal: at most +1 ms)")
    write_results("teams", report)


if __name__ == "__main__":
    main()
