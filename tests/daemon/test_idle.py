"""Idle sandboxes suspend (or terminate) themselves; any request resumes them transparently."""

from __future__ import annotations

import random
import threading
import time

import httpx

from stasis import Client, Sandbox, SandboxStatus
from tests.conftest import Daemon, sandbox_processes_under, wait_until

S = SandboxStatus


def metric(text: str, series: str) -> float:
    """The value of one series in Prometheus text format."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in metrics")


def status_of(client: Client, ref: str) -> SandboxStatus:
    return Sandbox.connect(ref, client=client).status


def test_idle_named_sandbox_suspends_and_the_next_run_resumes_it(daemon: Daemon, client: Client, backend: str) -> None:
    sbx = Sandbox.create("idler", timeout_secs=2, memory_mb=256, backend=backend, client=client)
    counter = "i=0; while :; do i=$((i+1)); echo $i > /root/n.tmp; mv /root/n.tmp /root/n; sleep 0.1; done"
    proc = sbx.start_process(["sh", "-c", counter])  # renamed into place: a reader never sees it half-written
    wait_until(lambda: sbx.run("test -s /root/n").exit_code == 0)
    info = sbx.info()
    assert info.idle_action == "suspend" and info.idle_action_at is not None
    wait_until(lambda: status_of(client, "idler") == S.SUSPENDED, timeout=20)
    assert [p for p in sandbox_processes_under(daemon.paths.home) if sbx.id in p] == []
    frozen = int(sbx.read_file("/root/n"))  # this read resumed it
    assert status_of(client, "idler") == S.RUNNING
    assert sbx.get_process(proc.id).status == "running"
    wait_until(lambda: int(sbx.read_file("/root/n")) > frozen)
    sbx.terminate()


def test_unnamed_sandboxes_are_terminated_when_idle(client: Client) -> None:
    sbx = Sandbox.create(timeout_secs=1, memory_mb=256, client=client)
    wait_until(lambda: sbx.info().status == S.TERMINATED, timeout=20)


def test_on_idle_overrides_the_default(client: Client) -> None:
    named = Sandbox.create("short-lived", timeout_secs=1, on_idle="terminate", memory_mb=256, client=client)
    unnamed = Sandbox.create(timeout_secs=1, on_idle="suspend", memory_mb=256, client=client)
    wait_until(lambda: named.info().status == S.TERMINATED, timeout=20)
    wait_until(lambda: unnamed.info().status == S.SUSPENDED, timeout=20)
    unnamed.terminate()


def test_a_long_run_holds_the_idle_clock(client: Client) -> None:
    sbx = Sandbox.create("busy", timeout_secs=1, memory_mb=256, client=client)
    result = sbx.run("sleep 4; echo done")
    assert result.stdout == "done\n"
    assert [t["to_status"] for t in client.json("GET", f"/v1/sandboxes/{sbx.id}/transitions")] == [
        "pending",
        "running",
    ]
    wait_until(lambda: sbx.info().status == S.SUSPENDED, timeout=20)
    sbx.terminate()


def test_a_failed_idle_suspend_keeps_the_sandbox_running(own_daemon: Daemon) -> None:
    own_daemon.start(STASIS_FAIL_POINT="gvisor.suspend.before_checkpoint")
    client = own_daemon.client()
    sbx = Sandbox.create("stubborn", timeout_secs=1, memory_mb=256, client=client)
    wait_until(lambda: (sbx.info().error or "").startswith("suspend failed"), timeout=20)
    info = sbx.info()
    assert info.status == S.RUNNING
    assert "injected failure" in (info.error or "")
    assert sbx.run("echo alive").stdout == "alive\n"


def test_concurrent_clients_against_sandboxes_that_idle_suspend(daemon: Daemon, client: Client) -> None:
    boxes = [Sandbox.create(f"crowd-{i}", timeout_secs=1, memory_mb=256, client=client) for i in range(5)]
    errors: list[str] = []
    answered = 0
    lock = threading.Lock()

    def worker(n: int) -> None:
        nonlocal answered
        rng = random.Random(n)
        with daemon.client() as own:
            for k in range(6):
                box = rng.choice(boxes)
                token = f"{n}-{k}-{rng.random()}"
                try:
                    result = Sandbox.connect(box.id, client=own).run(["echo", token], timeout=60)
                    if result.stdout != token + "\n":
                        errors.append(f"{box.name}: wanted {token!r}, got {result.stdout!r}")
                    else:
                        with lock:
                            answered += 1
                except Exception as exc:
                    errors.append(f"{box.name}: {type(exc).__name__}: {exc}")
                time.sleep(rng.uniform(0.2, 2.0))  # long enough, often, for the reaper to suspend

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a request hung"
    assert errors == []
    assert answered == 20 * 6
    metrics = httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.paths.socket))).get("http://stasis/metrics")
    assert metric(metrics.text, 'stasis_idle_actions_total{action="suspend"}') >= 1
    assert metric(metrics.text, "stasis_auto_resumes_total") >= 1
    for box in boxes:
        box.terminate()


def test_metrics_count_sandboxes_by_state(daemon: Daemon, sandbox: Sandbox) -> None:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.paths.socket))) as http:
        text = http.get("http://stasis/metrics").text
    assert metric(text, 'stasis_sandboxes{state="running"}') >= 1
    assert "stasis_suspend_seconds_bucket" in text
