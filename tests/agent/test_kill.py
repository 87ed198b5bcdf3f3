"""The harness SIGKILLed at the worst moments, then resumed: correct answer, each command ran once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from stasis import Sandbox, faults
from stasis.agent import Journal
from tests.agent.conftest import ScriptedModel, call, final, tools
from tests.conftest import Daemon, wait_until

COUNTER = "echo ran >> /root/counter; sleep 2; wc -l < /root/counter"
EXPECTED_EVENTS = ["system", "model_response", "tool_call", "tool_result", "model_response"]


def harness(daemon: Daemon, url: str, *args: str, **env: str) -> subprocess.Popen:
    environment = {**daemon.env, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "test", "STASIS_MODEL": "scripted", **env}
    return subprocess.Popen(
        [sys.executable, "-m", "stasis", "agent", *args],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def only_run(daemon: Daemon) -> str:
    journal = Journal(daemon.paths.agent_journal)
    try:
        return journal.runs()[-1].id
    finally:
        journal.close()


def resume_and_check(daemon: Daemon, url: str, sbx: Sandbox, model: ScriptedModel, *, unfinished: bool = True) -> None:
    run_id = only_run(daemon)
    resumed = harness(daemon, url, "resume", run_id)
    output, _ = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, output
    journal = Journal(daemon.paths.agent_journal)
    record = journal.run(run_id)
    events = journal.events(run_id)
    journal.close()
    assert record.status == "completed" and record.final == "counted"
    assert [e.kind for e in events if e.kind != "resume"] == EXPECTED_EVENTS, "a step was journalled twice or lost"
    resumes = [e.key for e in events if e.kind == "resume"]
    assert resumes == (["1"] if unfinished else []), (
        "a resume is marked where it picked up, a finished run is left alone"
    )
    assert sbx.read_file("/root/counter") == b"ran\n", "the command ran more than once"
    tool_result = next(e for e in events if e.kind == "tool_result").payload["content"]
    assert tool_result == "exit code: 0\nstdout:\n1\n"
    assert model.requests[-1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_0_0", "content": tool_result}


@pytest.fixture
def scene(model_server, own_daemon: Daemon):  # type: ignore[no-untyped-def]
    model, url = model_server
    model.script = [tools(call("run", command=COUNTER)), final("counted")]
    own_daemon.start()
    sbx = Sandbox.create("agent-box", memory_mb=256, client=own_daemon.client())
    return model, url, own_daemon, sbx


def test_killed_while_the_model_is_answering(scene) -> None:  # type: ignore[no-untyped-def]
    model, url, daemon, sbx = scene
    model.delay = 60
    proc = harness(daemon, url, "run", "--sandbox", "agent-box", "count once")
    assert model.received.wait(30)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    model.delay = 0
    resume_and_check(daemon, url, sbx, model)


def test_killed_while_a_run_tool_call_is_in_flight(scene) -> None:  # type: ignore[no-untyped-def]
    model, url, daemon, sbx = scene
    proc = harness(daemon, url, "run", "--sandbox", "agent-box", "count once")
    wait_until(lambda: sbx.run("test -e /root/counter").exit_code == 0, timeout=60)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert sbx.run("pgrep -f 'sleep 2'").exit_code == 0, "the command goes on without the harness"
    assert listed_status(daemon, url) == "interrupted"  # nobody drives it any more: resumable
    resume_and_check(daemon, url, sbx, model)


def listed_status(daemon: Daemon, url: str) -> str:
    listing = harness(daemon, url, "ls", "--json")
    output, _ = listing.communicate(timeout=60)
    return json.loads(output)[-1]["status"]


def test_the_harness_refuses_without_an_endpoint_or_with_one_that_does_not_answer(scene) -> None:  # type: ignore[no-untyped-def]
    _, _, daemon, _ = scene
    unset = subprocess.run([sys.executable, "-m", "stasis", "agent", "run", "--sandbox", "agent-box", "x"],
                           env={k: v for k, v in daemon.env.items() if k != "OPENAI_BASE_URL"},
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert unset.returncode != 0 and "OPENAI_BASE_URL is not set" in " ".join(unset.stderr.split())
    dead = harness(daemon, "http://127.0.0.1:9/v1", "run", "--sandbox", "agent-box", "x")
    output, _ = dead.communicate(timeout=60)  # at once: no 25 s of retries first
    assert dead.returncode != 0 and "http://127.0.0.1:9/v1" in " ".join(output.split()), output


@pytest.mark.parametrize("point", faults.AGENT_POINTS)
def test_killed_at_each_step_boundary(scene, point: str) -> None:  # type: ignore[no-untyped-def]
    model, url, daemon, sbx = scene
    proc = harness(daemon, url, "run", "--sandbox", "agent-box", "count once", STASIS_KILL_POINT=point)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, f"the harness did not reach {point}"
    resume_and_check(daemon, url, sbx, model)


def test_resume_of_a_finished_run_changes_nothing(scene) -> None:  # type: ignore[no-untyped-def]
    model, url, daemon, sbx = scene
    proc = harness(daemon, url, "run", "--sandbox", "agent-box", "count once")
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    assert "■ completed" in output and "→ run" in output
    requests = len(model.requests)
    resume_and_check(daemon, url, sbx, model, unfinished=False)
    assert len(model.requests) == requests
    listed = subprocess.run(
        [sys.executable, "-m", "stasis", "agent", "ls", "--json"], env=daemon.env, capture_output=True, text=True
    )
    assert '"status": "completed"' in listed.stdout
    log = subprocess.run(
        [sys.executable, "-m", "stasis", "agent", "log", only_run(daemon)],
        env=daemon.env,
        capture_output=True,
        text=True,
    )
    assert "count once" in log.stdout and "counted" in log.stdout
