"""`make demo`: the mission in one minute.

A sandbox runs a Python process holding a counter and 200 MB in memory (64 MB in a
microVM on TCG, whose guest CPU is ~10x slower at filling and hashing it), plus a
tmux session. We suspend it, SIGKILL the daemon, start a new one, resume, and
show that the very same processes carried on.

    make demo                              # gVisor
    make demo ARGS="--backend microvm"     # a QEMU microVM with its own Linux kernel
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time

from rich.console import Console
from rich.table import Table

from stasis import Client, Sandbox, SandboxNotFound, procs
from stasis.paths import Paths

console = Console()

HOLDER = r"""
import hashlib, json, os, signal, threading, time
signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # until the buffer exists: a report request must not kill us
buffer = os.urandom(HOLD_MB * 1024 * 1024)
counter = 0
def count():
    global counter
    while True:
        counter += 1
        time.sleep(0.1)
def report(*_):
    state = {"pid": os.getpid(), "counter": counter, "sha256": hashlib.sha256(buffer).hexdigest()}
    with open("/root/state.tmp", "w") as f:
        json.dump(state, f)
    os.rename("/root/state.tmp", "/root/state.json")
threading.Thread(target=count, daemon=True).start()
signal.signal(signal.SIGUSR1, report)
report()
while True:
    time.sleep(3600)
"""


def wait_for_report(sbx: Sandbox) -> None:
    deadline = time.monotonic() + 120
    while sbx.run("test -f /root/state.json").exit_code != 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the holder process did not report")
        time.sleep(0.1)


def snapshot(sbx: Sandbox, pid: int) -> dict:
    wait_for_report(sbx)  # its first report: the buffer is filled and the handler installed
    sbx.run(f"rm -f /root/state.json; kill -USR1 {pid}")
    wait_for_report(sbx)
    state = json.loads(sbx.read_file("/root/state.json"))
    state["tmux_pid"] = sbx.run("tmux display -p '#{pid}'").stdout.strip()
    pane = sbx.run("tmux capture-pane -p -t demo").stdout.splitlines()
    state["pane"] = [line for line in pane if "hello" in line]
    return state


def daemon_pid(paths: Paths) -> int:
    return int(paths.pidfile.read_text())


def host_processes(sandbox_id: str) -> int:
    """runsc or QEMU processes of this sandbox on the host."""
    return len(procs.processes(lambda cmd: ("runsc" in cmd or "qemu-system" in cmd) and sandbox_id in cmd))


def agent_part(client: Client) -> list[str]:
    """With a model endpoint configured, an agent works in the resumed sandbox."""
    if not os.environ.get("OPENAI_BASE_URL"):
        console.print(
            "[dim]agent part skipped: set OPENAI_BASE_URL (and OPENAI_API_KEY, STASIS_MODEL) to watch an agent "
            "work in the sandbox, e.g. OPENAI_BASE_URL=http://localhost:11434/v1 STASIS_MODEL=qwen2.5 make demo[/dim]"
        )
        return []
    from stasis.agent import AgentRunner, Journal, OpenAIModel
    from stasis.cli.agent import _show_agent_event

    console.rule("an agent in the same sandbox")
    journal = Journal(Paths.from_env().agent_journal)
    runner = AgentRunner(journal, OpenAIModel(), client, on_event=_show_agent_event)
    task = "Find the Python version and the largest file under /root in this sandbox; remember both."
    record = runner.start("demo", task, max_steps=12)
    console.print(f"agent run {record.id}: {record.status}; `stasis agent log {record.id}` shows the transcript")
    journal.close()
    return record.checkpoints


def main() -> int:
    keep = "--keep" in sys.argv
    backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "gvisor"
    label = {"gvisor": "gVisor", "microvm": "QEMU microVM"}.get(backend, backend)
    paths = Paths.from_env()
    client = Client(paths)
    with contextlib.suppress(SandboxNotFound):
        Sandbox.connect("demo", client=client).terminate()

    with console.status(f"creating sandbox [bold]demo[/bold] ({label})..."):
        started = time.monotonic()
        sbx = Sandbox.create("demo", memory_mb=1024, backend=backend, client=client)
        created_in = time.monotonic() - started
    console.print(f"[green]✓[/green] created sandbox demo ({sbx.id}, {label}) in {created_in:.2f}s")

    hold_mb = 200 if backend == "gvisor" else 64
    sbx.write_file("/root/holder.py", HOLDER.replace("HOLD_MB", str(hold_mb)))
    holder = sbx.start_process(["python3", "/root/holder.py"], name="holder")
    sbx.run("tmux new-session -d -s demo -x 100 -y 20")
    sbx.run("tmux send-keys -t demo 'echo hello from before the suspend; uptime' Enter")
    time.sleep(1.5)
    before = snapshot(sbx, holder.pid)
    console.print(
        f"[green]✓[/green] python pid {before['pid']} counting ({before['counter']}) "
        f"and holding {hold_mb} MB (sha256 {before['sha256'][:16]}…); tmux server pid {before['tmux_pid']}"
    )

    with console.status("suspending (memory, processes and files to disk)..."):
        info = sbx.suspend()
    console.print(
        f"[green]✓[/green] suspended in {info.last_suspend_seconds:.3f}s; "
        f"{label} processes left on the host: {host_processes(sbx.id)}"
    )

    old_pid = daemon_pid(paths)
    os.kill(old_pid, signal.SIGKILL)
    console.print(f"[yellow]✗[/yellow] daemon pid {old_pid} killed with SIGKILL")
    time.sleep(3)  # a suspended sandbox does not care how long it sleeps

    with console.status("starting a new daemon and resuming..."):
        client = Client(paths)
        sbx = Sandbox.connect("demo", client=client)  # starts the daemon, which recovers the store
        console.print(
            f"[green]✓[/green] new daemon pid {daemon_pid(paths)} sees demo as [bold]{sbx.status.value}[/bold]"
        )
        info = sbx.resume()
    console.print(f"[green]✓[/green] resumed in {info.last_resume_seconds:.3f}s")
    after = snapshot(sbx, holder.pid)

    table = Table(title="the same processes, continued", header_style="bold")
    table.add_column("evidence")
    table.add_column("before suspend")
    table.add_column("after daemon kill + resume")
    table.add_column("")
    rows = [
        ("python pid", before["pid"], after["pid"], before["pid"] == after["pid"]),
        ("in-memory counter", before["counter"], after["counter"], after["counter"] >= before["counter"]),
        (f"sha256 of {hold_mb} MB in RAM", before["sha256"][:16], after["sha256"][:16], before["sha256"] == after["sha256"]),  # noqa: E501
        ("tmux server pid", before["tmux_pid"], after["tmux_pid"], before["tmux_pid"] == after["tmux_pid"]),
        ("tmux pane history", before["pane"][-1][:30], after["pane"][-1][:30], before["pane"] == after["pane"]),
    ]  # fmt: skip
    ok = True
    for label, was, now, good in rows:
        ok &= bool(good)
        verdict = ("went on" if label == "in-memory counter" else "same") if good else "DIFFERENT"
        table.add_row(label, str(was), str(now), f"[green]{verdict}[/green]" if good else f"[red]{verdict}[/red]")
    console.print(table)
    console.print(f"suspend {info.last_suspend_seconds:.3f}s · resume {info.last_resume_seconds:.3f}s")

    agent_checkpoints = agent_part(client)

    if keep:
        console.print("sandbox [bold]demo[/bold] keeps running: try `stasis run demo -- tmux capture-pane -p -t demo`")
    else:
        sbx.terminate()
        for checkpoint_id in agent_checkpoints:
            Sandbox.delete_checkpoint(checkpoint_id, client=client)
        console.print("removed sandbox demo (run `make demo ARGS=--keep` to keep it)")
    client.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
