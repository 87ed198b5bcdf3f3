"""The harness through the real openai client against a real HTTP server, tools in a real sandbox."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stasis import Client, Sandbox
from stasis.agent import AgentRunner, Journal, OpenAIModel
from tests.agent.conftest import ScriptedModel, call, final, tools
from tests.conftest import Daemon


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "agent.db")
    yield j
    j.close()


def runner(journal: Journal, url: str, client: Client, checkpoint: bool = False) -> AgentRunner:
    return AgentRunner(
        journal, OpenAIModel("scripted", base_url=url, api_key="test"), client, checkpoint_at_end=checkpoint
    )


def tool_results(model: ScriptedModel) -> list[str]:
    """What the model was sent back as tool results, in its last request."""
    return [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "tool"]


def test_a_task_runs_its_tools_in_the_sandbox(model_server, journal: Journal, client: Client) -> None:  # type: ignore[no-untyped-def]
    model, url = model_server
    model.script = [
        tools(call("write_file", path="/root/hello.py", content="print('hi from the sandbox')\n")),
        tools(call("run", command="python3 /root/hello.py")),
        tools(call("read_file", path="/root/hello.py")),
        final("done: hello.py prints a greeting"),
    ]
    sbx = Sandbox.create(memory_mb=256, client=client)
    record = runner(journal, url, client).start(sbx.id, "write and run hello.py")
    assert record.status == "completed"
    assert record.final == "done: hello.py prints a greeting"
    results = tool_results(model)
    assert results[0] == "wrote 29 bytes to /root/hello.py"
    assert results[1] == "exit code: 0\nstdout:\nhi from the sandbox\n"
    assert results[2] == "print('hi from the sandbox')\n"
    assert sbx.read_file("/root/hello.py") == b"print('hi from the sandbox')\n"
    kinds = [e.kind for e in journal.events(record.id)]
    assert kinds == ["system"] + ["model_response", "tool_call", "tool_result"] * 3 + ["model_response"]
    sbx.terminate()


def test_bad_tool_calls_become_results_the_model_can_read(model_server, journal: Journal, client: Client) -> None:  # type: ignore[no-untyped-def]
    model, url = model_server
    model.script = [
        tools(call("run", raw_arguments='{"command": "echo unterminated')),
        tools(call("launch_missiles", target="moon")),
        tools(call("read_file", path="/no/such/file")),
        tools(call("run")),
        final("recovered"),
    ]
    sbx = Sandbox.create(memory_mb=256, client=client)
    record = runner(journal, url, client).start(sbx.id, "misbehave")
    assert record.status == "completed"
    bad_json, unknown, missing, no_args = tool_results(model)
    assert bad_json.startswith("error: the arguments are not valid JSON")
    assert unknown == "error: unknown tool 'launch_missiles'; the tools are read_file, write_file, run, remember"
    assert missing.startswith("error:") and "/no/such/file" in missing
    assert no_args == "error: argument 'command' (a string) is required"
    sbx.terminate()


def test_rate_limits_and_server_errors_are_retried(model_server, journal: Journal, client: Client) -> None:  # type: ignore[no-untyped-def]
    model, url = model_server
    model.script = [tools(call("run", command="echo ok")), final("fine")]
    model.failures = [429, 500]  # the first two requests fail, then the endpoint recovers
    sbx = Sandbox.create(memory_mb=256, client=client)
    record = runner(journal, url, client).start(sbx.id, "survive a flaky endpoint")
    assert record.status == "completed" and record.final == "fine"
    assert len(model.requests) == 4  # 429, 500, then the two real steps
    sbx.terminate()


def test_huge_tool_output_is_bounded_head_and_tail(model_server, journal: Journal, client: Client) -> None:  # type: ignore[no-untyped-def]
    model, url = model_server
    model.script = [
        tools(call("run", command="echo START; head -c 10000000 /dev/zero | tr '\\0' a; echo; echo END")),
        final("read it"),
    ]
    sbx = Sandbox.create(memory_mb=512, client=client)
    record = runner(journal, url, client).start(sbx.id, "print 10 MB")
    assert record.status == "completed"
    (result,) = tool_results(model)
    assert len(result) < 20_000
    assert "characters cut" in result
    assert result.startswith("exit code: 0")
    assert result.rstrip().endswith("END")
    sbx.terminate()


def test_step_limit_ends_the_run_clearly(model_server, journal: Journal, client: Client) -> None:  # type: ignore[no-untyped-def]
    model, url = model_server
    model.script = [tools(call("run", command="true"))] * 10
    sbx = Sandbox.create(memory_mb=256, client=client)
    record = runner(journal, url, client).start(sbx.id, "loop forever", max_steps=3)
    assert record.status == "step_limit"
    assert record.final == "stopped after 3 model steps"
    sbx.terminate()


def test_notes_reach_the_next_run_and_runs_from_its_checkpoint(
    model_server, journal: Journal, daemon: Daemon, client: Client
) -> None:  # type: ignore[no-untyped-def]
    model, url = model_server
    model.script = [tools(call("remember", note="the tests live in /srv/app/tests")), final("learned")]
    sbx = Sandbox.create("learner", memory_mb=256, client=client)
    first = runner(journal, url, client, checkpoint=True).start("learner", "learn something")
    assert first.status == "completed"
    assert len(first.checkpoints) == 1
    checkpoint = Sandbox.get_checkpoint(first.checkpoints[0], client=client)
    assert checkpoint.metadata["notes"] == ["the tests live in /srv/app/tests"]
    assert checkpoint.metadata["summary"] == "learned"

    model.script = [final("ok")]
    runner(journal, url, client).start("learner", "use what you know")
    assert "the tests live in /srv/app/tests" in model.system_prompts()[-1]

    child = Sandbox.create("learner-child", snapshot_id=checkpoint.id, client=client)
    fresh_journal = Journal(Path(str(journal.db.execute("PRAGMA database_list").fetchone()[2]) + ".other"))
    third = runner(fresh_journal, url, client).start("learner-child", "continue from the checkpoint")
    assert "the tests live in /srv/app/tests" in model.system_prompts()[-1]
    assert third.checkpoints == [checkpoint.id]  # the run records which checkpoint it came from
    fresh_journal.close()
    for s in (sbx, child):
        s.terminate()
    Sandbox.delete_checkpoint(checkpoint.id, client=client)


def test_the_sandbox_idles_between_turns_and_the_next_turn_resumes_it(
    model_server, journal: Journal, client: Client
) -> None:  # type: ignore[no-untyped-def]
    model, url = model_server
    model.script = [
        tools(call("run", command="echo first > /root/turns")),
        tools(call("run", command="echo second >> /root/turns; cat /root/turns")),
        final("both turns ran"),
    ]
    model.step_delays = {1: 4.0}  # the model "thinks" long enough for the idle reaper to suspend the sandbox
    sbx = Sandbox.create("napper", timeout_secs=1, memory_mb=256, client=client)
    record = runner(journal, url, client).start("napper", "two turns")
    assert record.status == "completed"
    assert tool_results(model)[-1] == "exit code: 0\nstdout:\nfirst\nsecond\n"
    statuses = [t["to_status"] for t in client.json("GET", f"/v1/sandboxes/{sbx.id}/transitions")]
    assert "suspended" in statuses and statuses[statuses.index("suspended") + 1 :].count("running") >= 1
    sbx.terminate()
