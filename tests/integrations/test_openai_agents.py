"""The OpenAI Agents SDK (its Runner and SandboxAgent, a chat-completions model on the project's scripted
OpenAI-compatible server) with a stasis sandbox as the agent's sandbox provider."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from agents import Runner, set_tracing_disabled
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.run_config import RunConfig, SandboxRunConfig
from agents.sandbox import ExecTimeoutError, SandboxAgent, WorkspaceReadNotFoundError
from agents.sandbox.capabilities import Shell
from openai import AsyncOpenAI

from stasis import AsyncClient, Sandbox
from stasis.agent.scripted import ScriptedModel, call, final, serve_scripted, tools
from stasis.integrations.openai_agents import StasisSandboxClient, StasisSandboxClientOptions
from tests.conftest import Daemon

set_tracing_disabled(True)  # the SDK would otherwise export traces to OpenAI's servers


def agent_client(daemon: Daemon) -> StasisSandboxClient:
    return StasisSandboxClient(AsyncClient(paths=daemon.paths))


async def run_turn(url: str, session: Any, task: str) -> list[str]:
    """One run of a SandboxAgent in ``session``; the outputs of its shell calls."""
    model = OpenAIChatCompletionsModel(model="scripted", openai_client=AsyncOpenAI(base_url=url, api_key="test"))
    # the shell capability alone: apply_patch is a hosted tool, which chat completions cannot carry
    agent = SandboxAgent(name="worker", instructions="Work in the sandbox.", model=model, capabilities=[Shell()])
    result = await Runner.run(agent, task, run_config=RunConfig(sandbox=SandboxRunConfig(session=session)))
    assert result.final_output == "done"
    return [str(item.output) for item in result.new_items if item.type == "tool_call_output_item"]


def shell(command: str) -> dict[str, Any]:
    return tools(call("exec_command", cmd=command))


def test_a_resumed_session_finds_the_file_and_process_of_the_first_across_a_suspend(daemon: Daemon) -> None:
    first_model = ScriptedModel(script=[
        shell("echo 'step one done' > notes.txt && pwd"),
        shell("nohup sleep 600 >/dev/null 2>&1 & echo $! > bg.pid; echo started"),
        final("done"),
    ])  # fmt: skip
    second_model = ScriptedModel(script=[
        shell("cat notes.txt; kill -0 $(cat bg.pid) && echo still-running"),
        final("done"),
    ])  # fmt: skip

    async def scenario() -> None:
        client = agent_client(daemon)
        session = await client.create(options=StasisSandboxClientOptions(name="openai-agent"))
        async with session:
            with serve_scripted(first_model) as url:
                outputs = await run_turn(url, session, "start the work")
        assert "/workspace" in outputs[0] and "started" in outputs[1], outputs
        # The session ended: the sandbox is suspended with its memory, not terminated
        sandbox = Sandbox.connect("openai-agent", client=daemon.client())
        assert sandbox.info().status == "suspended"
        saved = json.dumps(client.serialize_session_state(session.state))

        resumed = await client.resume(client.deserialize_session_state(json.loads(saved)))
        async with resumed:
            assert resumed.state.sandbox_id == sandbox.id
            with serve_scripted(second_model) as url:
                outputs = await run_turn(url, resumed, "go on")
            assert "step one done" in outputs[0] and "still-running" in outputs[0], outputs
            await client.delete(resumed)
        assert sandbox.info().status == "terminated"

    asyncio.run(scenario())


def test_the_workspace_moves_as_a_tar_and_bad_input_raises_the_sdks_errors(daemon: Daemon, tmp_path: Path) -> None:
    async def scenario() -> None:
        client = agent_client(daemon)
        session = await client.create(options=StasisSandboxClientOptions(pause_on_exit=False, exec_timeout=2))
        async with session:
            await session.write(Path("data/blob.bin"), io.BytesIO(bytes(range(256)) * 16))
            archive = (await session.persist_workspace()).read()
            with pytest.raises(WorkspaceReadNotFoundError):
                await session.read(Path("missing.txt"))
            with pytest.raises(ExecTimeoutError):
                await session.exec("sleep 30")
            result = await session.exec("echo out; echo err >&2; exit 3")
            assert (result.stdout, result.stderr, result.exit_code) == (b"out\n", b"err\n", 3)
            await session.write(Path("data/blob.bin"), io.BytesIO(b"changed"))
            await session.hydrate_workspace(io.BytesIO(archive))
            assert (await session.read(Path("data/blob.bin"))).read() == bytes(range(256)) * 16
            sandbox_id = session.state.sandbox_id
        assert Sandbox.connect(sandbox_id, client=daemon.client()).info().status == "terminated"

        # A session whose sandbox is gone resumes into a new one, hydrated from its workspace snapshot
        state = session.state
        resumed = await client.resume(state)
        async with resumed:
            assert resumed.state.sandbox_id != sandbox_id
            await client.delete(resumed)

    asyncio.run(scenario())
