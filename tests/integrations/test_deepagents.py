"""LangChain Deep Agents (the real create_deep_agent graph, LangChain's own fake chat model) with its
shell and files in a stasis sandbox."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from deepagents import create_deep_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage

from stasis import SandboxNotFound
from stasis.integrations.deepagents import StasisSandbox
from tests.conftest import Daemon


class ScriptedChatModel(GenericFakeChatModel):
    """LangChain's fake model, answering with the scripted tool calls; binding tools changes nothing."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self


def scripted(*calls: tuple[str, dict[str, Any]]) -> ScriptedChatModel:
    ids = itertools.count()
    turns: Iterator[AIMessage] = iter(
        [AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": f"call-{next(ids)}"}]) for n, a in calls]
        + [AIMessage(content="done")]
    )
    return ScriptedChatModel(messages=turns)


def tool_results(state: dict[str, Any]) -> list[str]:
    return [str(m.content) for m in state["messages"] if isinstance(m, ToolMessage)]


def test_a_second_turn_finds_the_file_and_process_of_the_first_across_a_suspend(daemon: Daemon) -> None:
    backend = StasisSandbox.create("deep-agent", client=daemon.client())
    try:
        first = create_deep_agent(scripted(
            ("write_file", {"file_path": "/root/plan.md", "content": "1. read the paper\n"}),
            ("execute", {"command": "nohup sleep 600 >/dev/null 2>&1 & echo $! > /root/bg.pid; echo started"}),
        ), backend=backend)  # fmt: skip
        results = tool_results(first.invoke({"messages": [{"role": "user", "content": "plan the work"}]}))
        assert "started" in results[1], results
        backend.suspend()
        assert backend.sandbox.info().status == "suspended"

        again = StasisSandbox.connect("deep-agent", client=daemon.client())
        second = create_deep_agent(scripted(
            ("read_file", {"file_path": "/root/plan.md"}),
            ("execute", {"command": "kill -0 $(cat /root/bg.pid) && echo still-running"}),
        ), backend=again)  # fmt: skip
        results = tool_results(second.invoke({"messages": [{"role": "user", "content": "go on"}]}))
        assert "1. read the paper" in results[0] and "still-running" in results[1], results
        assert again.id == backend.id
    finally:
        backend.sandbox.terminate()


def test_files_move_in_bulk_and_bad_input_is_said_not_hung(daemon: Daemon) -> None:
    backend = StasisSandbox.create(client=daemon.client(), timeout=2)
    try:
        blob = bytes(range(256)) * 64
        uploads = backend.upload_files([("/root/data/blob.bin", blob), ("/proc/version", b"x")])
        assert uploads[0].error is None and uploads[1].error is not None
        downloads = backend.download_files(["/root/data/blob.bin", "/root/missing.txt", "/root/data"])
        assert downloads[0].content == blob
        assert (downloads[1].error, downloads[2].error) == ("file_not_found", "is_directory")

        both = backend.execute("echo out; echo err >&2; exit 3")
        assert (both.output, both.exit_code) == ("out\nerr\n", 3)
        slow = backend.execute("echo started; sleep 30")
        assert slow.exit_code == 124 and "timed out after 2 seconds" in slow.output and "started" in slow.output
        with pytest.raises(ValueError, match="must be positive"):  # as the local shell backend: 0 is no "no limit"
            backend.execute("sleep 30", timeout=0)
        assert backend.execute("sleep 1; echo patient", timeout=10).output == "patient\n"
        listed = backend.ls("/root/data")
        assert [e["path"] for e in listed.entries or []] == ["/root/data/blob.bin"], listed
        assert backend.read("/root/nothing-here.txt").error
    finally:
        backend.sandbox.terminate()
    with pytest.raises(SandboxNotFound):
        StasisSandbox.connect("no-such-sandbox", client=daemon.client())


def test_the_agents_execute_tool_keeps_its_limits_and_never_raises(daemon: Daemon) -> None:
    """Through create_deep_agent's own tool: timeout=0 is refused as the local backend refuses it (it once meant no
    limit, past the middleware's max_execute_timeout), and a sandbox that is gone is an answer, not a crash."""
    backend = StasisSandbox.create(client=daemon.client(), timeout=5)
    agent = create_deep_agent(scripted(
        ("execute", {"command": "sleep 30; echo never", "timeout": 0}),
        ("execute", {"command": "echo fine"}),
    ), backend=backend)  # fmt: skip
    results = tool_results(agent.invoke({"messages": [{"role": "user", "content": "run it"}]}))
    assert "must be positive" in results[0] and "never" not in results[0], results
    assert "fine" in results[1]
    backend.sandbox.terminate()
    gone = backend.execute("echo hello")
    assert gone.exit_code == 1 and gone.output.startswith("Error executing command"), gone
