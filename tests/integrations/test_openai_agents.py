"""The OpenAI Agents SDK (its Runner and SandboxAgent, a chat-completions model on the project's scripted
OpenAI-compatible server) with a stasis sandbox as the agent's sandbox provider."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from agents import Runner, set_tracing_disabled
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.run_config import RunConfig, SandboxRunConfig
from agents.sandbox import ExecTimeoutError, Manifest, SandboxAgent, WorkspaceReadNotFoundError
from agents.sandbox.capabilities import Shell
from agents.sandbox.errors import InvalidManifestPathError
from agents.sandbox.manifest import Environment
from agents.sandbox.snapshot import LocalSnapshotSpec
from openai import AsyncOpenAI

from stasis import AsyncClient, Sandbox
from stasis.agent.scripted import ScriptedModel, call, final, serve_scripted, tools
from stasis.integrations.openai_agents import StasisSandboxClient, StasisSandboxClientOptions
from tests.conftest import Daemon

set_tracing_disabled(True)  # the SDK would otherwise export traces to OpenAI's servers


def agent_client(daemon: Daemon) -> StasisSandboxClient:
    return StasisSandboxClient(AsyncClient(paths=daemon.paths))


async def run_turn(url: str, sandbox: Any, task: str) -> list[str]:
    """One run of a SandboxAgent in ``sandbox`` (a session, or a RunConfig); the outputs of its shell calls."""
    model = OpenAIChatCompletionsModel(model="scripted", openai_client=AsyncOpenAI(base_url=url, api_key="test"))
    # the shell capability alone: apply_patch is a hosted tool, which chat completions cannot carry
    agent = SandboxAgent(name="worker", instructions="Work in the sandbox.", model=model, capabilities=[Shell()])
    run_config = sandbox if isinstance(sandbox, RunConfig) else RunConfig(sandbox=SandboxRunConfig(session=sandbox))
    result = await Runner.run(agent, task, run_config=run_config)
    assert result.final_output == "done"
    return [str(item.output) for item in result.new_items if item.type == "tool_call_output_item"]


def shell(command: str) -> dict[str, Any]:
    return tools(call("exec_command", cmd=command))


def runner_config(client: StasisSandboxClient, name: str) -> RunConfig:
    """The usage of the SDK's docs: the Runner owns the session, made from a client and its options."""
    options = StasisSandboxClientOptions(name=name)
    return RunConfig(sandbox=SandboxRunConfig(client=client, options=options))


def test_a_runner_owned_session_ends_suspended_and_the_next_run_finds_its_process(daemon: Daemon) -> None:
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
        with serve_scripted(first_model) as url:
            outputs = await run_turn(url, runner_config(client, "openai-runner"), "start the work")
        assert "/workspace" in outputs[0] and "started" in outputs[1], outputs
        # The run ended: its sandbox is suspended with its memory, not terminated (the SDK's cleanup calls delete)
        sandbox = Sandbox.connect("openai-runner", client=daemon.client())
        assert sandbox.info().status == "suspended"
        try:
            with serve_scripted(second_model) as url:
                outputs = await run_turn(url, runner_config(client, "openai-runner"), "go on")
            assert "step one done" in outputs[0] and "still-running" in outputs[0], outputs
            # the same sandbox, suspended again: the sleep's cwd, /workspace, was never replaced under it
            named = [s.id for s in Sandbox.list(client=daemon.client()) if s.name == "openai-runner"]
            assert named == [sandbox.id]  # no second sandbox: the first one, found by its name
            assert sandbox.info().status == "suspended"
        finally:
            sandbox.terminate()

    asyncio.run(scenario())


def test_a_session_resumed_from_its_saved_state_is_not_hydrated_again(daemon: Daemon, tmp_path: Path) -> None:
    async def scenario() -> None:
        client = agent_client(daemon)
        snapshot = LocalSnapshotSpec(base_path=tmp_path)
        session = await client.create(snapshot=snapshot, options=StasisSandboxClientOptions(name="openai-state"))
        try:
            async with session:
                await session.exec("echo kept > notes.txt; nohup sleep 600 >/dev/null 2>&1 & echo $! > bg.pid")
                changed = (await session.exec("stat -c %Z notes.txt; sleep 1.5")).stdout  # in seconds
            saved = json.dumps(client.serialize_session_state(session.state))
            resumed = await client.resume(client.deserialize_session_state(json.loads(saved)))
            async with resumed:
                assert resumed.state.sandbox_id == session.state.sandbox_id
                alive = await resumed.exec("cat notes.txt; kill -0 $(cat bg.pid) && echo alive")
                assert alive.stdout == b"kept\nalive\n", alive
                # hydrating would have written notes.txt again (a new change time)
                assert (await resumed.exec("stat -c %Z notes.txt")).stdout == changed
            assert Sandbox.connect("openai-state", client=daemon.client()).info().status == "suspended"
        finally:
            Sandbox.connect("openai-state", client=daemon.client()).terminate()

    asyncio.run(scenario())


def test_the_session_behaves_as_the_sdks_own_providers(daemon: Daemon) -> None:
    """Each of these diverged from the E2B and Docker providers: the manifest's environment, paths that a
    workspace symlink leads outside, ephemeral paths kept out of the workspace tar, timeouts (None: no limit;
    0: one second), all of a command's output, and interactive commands that outlive their yield time."""
    manifest = Manifest(environment=Environment(value={"MYVAR": "from-the-manifest"}))

    async def scenario() -> None:
        client = agent_client(daemon)
        session = await client.create(manifest=manifest, options=StasisSandboxClientOptions(pause_on_exit=False))
        async with session:
            assert (await session.exec("echo $MYVAR")).stdout == b"from-the-manifest\n"
            await session.exec("ln -s /etc outside && mkdir cache && echo x > cache/tmp && echo y > kept.txt")
            with pytest.raises(InvalidManifestPathError):
                await session.write(Path("outside/evil.conf"), io.BytesIO(b"no"))
            assert (await session.exec("test -e /etc/evil.conf")).exit_code == 1
            session.register_persist_workspace_skip_path("cache")
            with tarfile.open(fileobj=await session.persist_workspace()) as tar:
                names = {m.name.removeprefix("./") for m in tar.getmembers()}
            assert "kept.txt" in names and not {n for n in names if n.startswith("cache")}, names
            assert (await session.exec("sleep 2; echo slept")).stdout == b"slept\n"  # no timeout: no limit
            with pytest.raises(ExecTimeoutError):
                await session.exec("sleep 30", timeout=0)
            big = await session.exec("head -c 3000000 /dev/zero | tr '\\0' a")
            assert len(big.stdout) == 3_000_000 and set(big.stdout) == {ord("a")}

            started = await session.pty_exec_start("for i in 1 2 3; do echo tick$i; sleep 1; done", yield_time_s=0.3)
            assert started.exit_code is None and started.process_id is not None  # still running, not killed
            polled, seen = started, started.output
            while polled.exit_code is None:
                polled = await session.pty_write_stdin(session_id=started.process_id, chars="", yield_time_s=5)
                seen += polled.output
            assert (seen, polled.exit_code) == (b"tick1\ntick2\ntick3\n", 0)
            repl = await session.pty_exec_start("read line; echo got $line", tty=True, yield_time_s=0.3)
            answer = await session.pty_write_stdin(session_id=repl.process_id, chars="hello\n", yield_time_s=5)
            assert b"got hello" in answer.output
            sandbox_id = session.state.sandbox_id
        assert Sandbox.connect(sandbox_id, client=daemon.client()).info().status == "terminated"

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
        Sandbox.connect(resumed.state.sandbox_id, client=daemon.client()).terminate()

    asyncio.run(scenario())


def test_a_workspace_with_a_link_pointing_outside_restores_into_a_new_sandbox(daemon: Daemon, tmp_path: Path) -> None:
    """Hydrating a workspace whose symlink points outside it (to /etc) works, as with the SDK's own providers; the
    link stays a link (nothing is written through it)."""

    async def scenario() -> None:
        client = agent_client(daemon)
        options = StasisSandboxClientOptions(pause_on_exit=False)
        session = await client.create(snapshot=LocalSnapshotSpec(base_path=tmp_path), options=options)
        async with session:
            await session.exec("ln -s /etc outside && echo kept > notes.txt")
        gone = session.state.sandbox_id  # terminated at the session's end: the resume needs a new one, hydrated
        resumed = await client.resume(session.state)
        try:
            async with resumed:
                assert resumed.state.sandbox_id != gone
                found = await resumed.exec("readlink outside; cat notes.txt")
                assert found.stdout == b"/etc\nkept\n", found
        finally:
            Sandbox.connect(resumed.state.sandbox_id, client=daemon.client()).terminate()

    asyncio.run(scenario())
