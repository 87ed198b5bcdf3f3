"""Agent harness overhead per step: journal writes and tool dispatch, beside the bare tool call.

    .venv/bin/python benchmarks/agent.py [--steps N]

The harness runs N steps of the tool call `run("true")` against a local scripted
OpenAI-compatible server. For each step, overhead = step wall time - model call -
tool call (both measured inside the loop). The baseline is the same tool call made
directly through the SDK: sbx.run("true"). Prints a table, writes
benchmarks/results/agent.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from itertools import pairwise
from pathlib import Path

from common import serving_daemon
from rich.console import Console
from rich.table import Table

from stasis import Client, Sandbox
from stasis.agent import AgentRunner, Journal, OpenAIModel
from stasis.agent.scripted import ScriptedModel, call, final, serve_scripted, tools

console = Console(width=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    with serving_daemon("stasis-bench-agent-") as paths:
        client = Client(paths)
        sbx = Sandbox.create(memory_mb=256, client=client)
        bare = []
        for _ in range(args.steps):
            started = time.perf_counter()
            sbx.run("true")
            bare.append(time.perf_counter() - started)

        scripted = ScriptedModel(script=[tools(call("run", command="true"))] * args.steps + [final("done")])
        journal = Journal(paths.home / "agent-bench.db")
        with serve_scripted(scripted) as url:
            model = OpenAIModel("scripted", base_url=url, api_key="bench")
            record = AgentRunner(journal, model, client, checkpoint_at_end=False).start(sbx.id, "bench", args.steps + 1)
        events = journal.events(record.id)
        responses = [e for e in events if e.kind == "model_response"]
        results = {e.key: e for e in events if e.kind == "tool_result"}
        overheads, tool_times = [], []
        for this, following in pairwise(responses):
            call_id = this.payload["message"]["tool_calls"][0]["id"]
            tool = results[call_id]
            wall = following.at - this.at
            overheads.append(wall - (following.seconds or 0) - (tool.seconds or 0))
            tool_times.append(tool.seconds or 0)
        sbx.terminate()
        client.close()

    report = {
        "steps": len(overheads),
        "harness_overhead_per_step_median_ms": statistics.median(overheads) * 1000,
        "harness_overhead_per_step_p90_ms": sorted(overheads)[int(len(overheads) * 0.9)] * 1000,
        "tool_call_in_harness_median_ms": statistics.median(tool_times) * 1000,
        "bare_sdk_run_median_ms": statistics.median(bare) * 1000,
        "goal_ms": 5.0,
    }
    table = Table(title=f"agent harness, {report['steps']} steps of run('true')", header_style="bold")
    table.add_column("measure")
    table.add_column("median", justify="right")
    table.add_row(
        "harness overhead per step (journal + dispatch)", f"{report['harness_overhead_per_step_median_ms']:.2f} ms"
    )
    table.add_row("the tool call inside the harness", f"{report['tool_call_in_harness_median_ms']:.1f} ms")
    table.add_row("baseline: sbx.run('true') from the SDK", f"{report['bare_sdk_run_median_ms']:.1f} ms")
    console.print(table)
    results_dir = Path(__file__).parent / "results"
    results_dir.mkdir(exist_ok=True)
    (results_dir / "agent.json").write_text(json.dumps(report, indent=2))
    console.print(f"wrote {results_dir / 'agent.json'} (goal: ≤ {report['goal_ms']:.0f} ms overhead per step)")


if __name__ == "__main__":
    main()
