"""The code interpreter's cost: run_code beside the raw kernel server, and E2B's SDK beside stasis' own.

    python benchmarks/code.py [--rounds 20] [--creates 3] [--backend gvisor]

Rows (medians), all on the code-interpreter image:
- run_code("1+1") round trip, for a sandbox without network (the daemon reaches the kernel server through the
  agent) and with one (straight into its namespace), beside the same /execute sent from inside the sandbox
  (the kernel and its server alone, no daemon: the floor);
- E2B's code-interpreter SDK through `stasis e2b serve`, beside stasis' SDK on the same sandbox;
- create → first run_code (the server and a kernel start), beside create → first run("true"); the same from
  the warm template (`stasis template code-interpreter`);
- resume → first run_code, beside resume → first run("true").
Goal: a round trip ≤ 20 ms on gVisor. Writes benchmarks/results/code-BACKEND.json.
"""

from __future__ import annotations

import argparse
import time

from common import Comparison, e2b_listening, report_ratios, serving_daemon, timed
from e2b_code_interpreter import Sandbox as E2bSandbox

from stasis import Client, Sandbox, Template
from stasis.sdk.template import interpreter_template

MEMORY_MB = 1024
INSIDE = r"""
import http.client, json, statistics, sys, time
def once():
    connection = http.client.HTTPConnection("127.0.0.1", 49999)
    connection.request("POST", "/execute", body=json.dumps({"code": "1+1"}))
    connection.getresponse().read()
    connection.close()
once()
samples = []
for _ in range(int(sys.argv[1])):
    started = time.perf_counter(); once(); samples.append(time.perf_counter() - started)
print(json.dumps(samples))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--creates", type=int, default=3)
    parser.add_argument("--backend", default="gvisor")
    args = parser.parse_args()
    with (
        serving_daemon("stasis-bench-code-") as paths,
        Client(paths) as client,
        e2b_listening(client, args.backend, MEMORY_MB),
    ):
        rows = measure(client, args)
    report_ratios(f"run_code ({args.backend})", f"code-{args.backend}", rows, {"rounds": args.rounds})


def inside(sbx: Sandbox, rounds: int) -> list[float]:
    import json

    return json.loads(sbx.run(["python3", "-c", INSIDE, str(rounds)]).stdout)


def measure(client: Client, args: argparse.Namespace) -> dict[str, Comparison]:
    rows: dict[str, Comparison] = {}
    options = {"image": "code-interpreter", "memory_mb": MEMORY_MB, "backend": args.backend, "client": client}
    for network in (False, True):
        sbx = Sandbox.create(network=network, **options)
        try:
            sbx.run_code("1+1")
            ours = timed(lambda sbx=sbx: sbx.run_code("1+1"), args.rounds)
            label = "with network" if network else "without network"
            rows[f"run_code('1+1') round trip, {label}"] = (ours, inside(sbx, args.rounds), "/execute from inside")
        finally:
            sbx.terminate()

    theirs = E2bSandbox.create()
    try:
        theirs.run_code("1+1")
        same = Sandbox.connect(theirs.sandbox_id, client=client)
        e2b_side = timed(lambda: theirs.run_code("1+1"), args.rounds)
        rows["E2B SDK run_code('1+1') round trip"] = (e2b_side, timed(lambda: same.run_code("1+1"), args.rounds),
                                                      "stasis SDK, same sandbox")  # fmt: skip
    finally:
        theirs.kill()

    created: dict[str, list[float]] = {"code": [], "run": []}
    resumed: dict[str, list[float]] = {"code": [], "run": []}
    firsts = {"code": lambda s: s.run_code("1+1"), "run": lambda s: s.run("true")}
    for _ in range(args.creates):
        for kind, first in firsts.items():
            started = time.perf_counter()
            sbx = Sandbox.create(**options)
            first(sbx)
            created[kind].append(time.perf_counter() - started)
            sbx.run_code("1+1")  # the server and its kernel run in both, for the resume rows
            sbx.suspend()
            started = time.perf_counter()
            sbx.resume()
            first(sbx)
            resumed[kind].append(time.perf_counter() - started)
            sbx.terminate()
    rows["create → first run_code"] = (created["code"], created["run"], "create → first run('true')")
    interpreter_template("bench-code-warm", client=client, backend=args.backend, memory_mb=MEMORY_MB)
    try:
        warm: list[float] = []
        for _ in range(args.creates):
            started = time.perf_counter()
            sbx = Sandbox.create(template="bench-code-warm", client=client)
            sbx.run_code("1+1")
            warm.append(time.perf_counter() - started)
            sbx.terminate()
    finally:
        Template.delete("bench-code-warm", client=client)
    rows["create from the warm template → first run_code"] = (warm, created["run"], "create → first run('true')")
    rows["resume → first run_code"] = (resumed["code"], resumed["run"], "resume → first run('true')")
    return rows


if __name__ == "__main__":
    main()
