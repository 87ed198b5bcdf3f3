"""mini-swe-agent (the real package, its DeterministicModel) running its actions in a stasis sandbox."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from minisweagent import package_dir
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments import get_environment
from minisweagent.models.test_models import DeterministicModel, make_output

from stasis import Sandbox, SandboxNotFound
from stasis.integrations.minisweagent import StasisEnvironment
from tests.conftest import Daemon

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
AGENT_CONFIG = yaml.safe_load((package_dir / "config" / "default.yaml").read_text())["agent"]


def scripted(*commands: str) -> DeterministicModel:
    """A model that answers each turn with the next command, in mini-swe-agent's own text format."""
    outputs = [make_output(f"```mswea_bash_command\n{c}\n```", [{"command": c}]) for c in commands]
    return DeterministicModel(outputs=outputs)


def observations(agent: DefaultAgent) -> list[str]:
    return [m["content"] for m in agent.messages if m["role"] == "user"][1:]


def test_a_second_run_finds_the_files_and_processes_of_the_first_across_a_suspend(daemon: Daemon) -> None:
    env = StasisEnvironment(client=daemon.client())
    try:
        first = DefaultAgent(scripted(
            "echo 'the bug is in parse()' > /root/notes.txt && cat /root/notes.txt",
            "nohup sh -c 'while true; do date +%s >> /root/ticks; sleep 0.2; done' >/dev/null 2>&1 &"
            " echo $! > /root/bg.pid",
            SUBMIT,
        ), env, **AGENT_CONFIG)  # fmt: skip
        assert first.run("find the bug")["exit_status"] == "Submitted"
        assert "the bug is in parse()" in observations(first)[0]

        env.suspend()
        assert env.sandbox.info().status == "suspended"

        second = DefaultAgent(scripted(
            "cat /root/notes.txt; kill -0 $(cat /root/bg.pid) && echo still-running",
            "ticks=$(wc -l < /root/ticks); sleep 1; test $(wc -l < /root/ticks) -gt $ticks && echo ticking",
            SUBMIT,
        ), env, **AGENT_CONFIG)  # fmt: skip
        assert second.run("fix it")["exit_status"] == "Submitted"
        found, ticking = observations(second)[:2]
        assert "the bug is in parse()" in found and "still-running" in found
        assert "ticking" in ticking and "<returncode>0</returncode>" in ticking
    finally:
        env.cleanup()
    assert env.sandbox.info().status == "terminated"


def test_output_is_one_stream_and_bad_input_is_an_observation_not_a_hang(daemon: Daemon) -> None:
    env = StasisEnvironment(client=daemon.client(), timeout=2)
    try:
        both = env.execute({"command": "echo out; echo err >&2; echo out2"})
        assert both == {"output": "out\nerr\nout2\n", "returncode": 0, "exception_info": ""}
        missing = env.execute({"command": "cat /no/such/file"})
        assert missing["returncode"] == 1 and "No such file or directory" in missing["output"]
        slow = env.execute({"command": "echo started; sleep 30"})
        assert slow["returncode"] == -1 and "timed out after 2s" in slow["exception_info"]
        assert "started" in slow["output"]
        assert env.execute({"command": "pwd"}, cwd="/tmp")["output"] == "/tmp\n"
        nowhere = env.execute({"command": "pwd"}, cwd="/no/such/dir")  # as the local and Docker environments
        assert nowhere["returncode"] == -1 and "/no/such/dir" in nowhere["exception_info"]
        assert nowhere["extra"]["exception_type"] == "WorkdirNotFound"
        big = env.execute({"command": "head -c 3000000 /dev/zero | tr '\\0' a"})
        assert len(big["output"]) == 3_000_000 and big["exception_info"] == ""
        assert env.get_template_vars()["sandbox_id"] == env.sandbox.id
        assert env.serialize()["info"]["config"]["environment"]["sandbox"] == env.sandbox.id
    finally:
        env.cleanup()
    with pytest.raises(SandboxNotFound):
        StasisEnvironment(client=daemon.client(), sandbox="no-such-sandbox")


def test_the_mini_cli_runs_in_a_named_sandbox(daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mini --environment-class``: the framework's own CLI, config files and trajectory."""
    sandbox = Sandbox.create("mini-cli", client=daemon.client())
    try:
        commands = ["echo from-mini > /root/mini.txt", SUBMIT]
        outputs = scripted(*commands).config.outputs
        model = {"model_class": "deterministic", "model_name": "deterministic", "outputs": outputs}
        config = tmp_path / "stasis.yaml"
        config.write_text(yaml.safe_dump({"model": model, "environment": {"sandbox": "mini-cli"}}))
        mini = shutil.which("mini", path=str(Path(sys.executable).parent))
        assert mini is not None, "mini-swe-agent's CLI is installed by `make setup`"
        result = subprocess.run(
            [mini, "-c", "mini.yaml", "-c", str(config), "-y", "--exit-immediately", "-t", "write a file", "-o",
             str(tmp_path / "t.json"), "--environment-class", "stasis.integrations.minisweagent.StasisEnvironment"],
            env={**daemon.env, "MSWEA_CONFIGURED": "1", "MSWEA_SILENT_STARTUP": "1"},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        assert sandbox.read_file("/root/mini.txt") == b"from-mini\n"
        trajectory = json.loads((tmp_path / "t.json").read_text())
        assert trajectory["info"]["exit_status"] == "Submitted"
        assert trajectory["info"]["config"]["environment"]["sandbox"] == sandbox.id
        for key in ("STASIS_HOME", "STASIS_IMAGE_DIR"):  # where the CLI found the daemon
            monkeypatch.setenv(key, daemon.env[key])
        # get_environment with the same spec attaches to the same sandbox; cleanup leaves it running
        env = get_environment({"environment_class": "stasis.integrations.minisweagent.StasisEnvironment",
                               "sandbox": "mini-cli"})  # fmt: skip
        assert isinstance(env, StasisEnvironment) and env.sandbox.id == sandbox.id
        env.cleanup()
        assert sandbox.info().status == "running"
    finally:
        sandbox.terminate()


def mini(daemon: Daemon, config: Path, task: str, trajectory: Path) -> subprocess.CompletedProcess[str]:
    """The `mini` CLI as its docs run it: a YAML config that names the environment class."""
    command = shutil.which("mini", path=str(Path(sys.executable).parent))
    assert command is not None, "mini-swe-agent's CLI is installed by `make setup`"
    return subprocess.run(
        [command, "-c", "mini.yaml", "-c", str(config), "-y", "--exit-immediately", "-t", task, "-o", str(trajectory)],
        env={**daemon.env, "MSWEA_CONFIGURED": "1", "MSWEA_SILENT_STARTUP": "1", "FORWARDED": "from-the-host"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_mini_keeps_a_named_sandbox_suspended_between_runs_with_its_processes(daemon: Daemon, tmp_path: Path) -> None:
    def config(name: str, *commands: str) -> Path:
        model = {"model_class": "deterministic", "model_name": "deterministic",
                 "outputs": scripted(*commands).config.outputs}  # fmt: skip
        environment = {"environment_class": "stasis.integrations.minisweagent.StasisEnvironment", "name": "mini-kept",
                       "forward_env": ["FORWARDED"]}  # fmt: skip
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"model": model, "environment": environment}))
        return path

    first = config("first", "nohup sleep 600 >/dev/null 2>&1 & echo $! > /root/bg.pid; echo $FORWARDED", SUBMIT)
    second = config("second", "kill -0 $(cat /root/bg.pid) && echo still-running > /root/seen", SUBMIT)
    try:
        result = mini(daemon, first, "start it", tmp_path / "one.json")
        assert result.returncode == 0, result.stdout + result.stderr
        steps = json.loads((tmp_path / "one.json").read_text())["messages"]
        assert any("from-the-host" in str(m.get("content")) for m in steps)  # forward_env
        sandbox = Sandbox.connect("mini-kept", client=daemon.client())
        assert sandbox.info().status == "suspended"  # mini exited: kept, with its memory
        result = mini(daemon, second, "check it", tmp_path / "two.json")
        assert result.returncode == 0, result.stdout + result.stderr
        assert [s.id for s in Sandbox.list(client=daemon.client()) if s.name == "mini-kept"] == [sandbox.id]
        assert sandbox.read_file("/root/seen") == b"still-running\n"
    finally:
        Sandbox.connect("mini-kept", client=daemon.client()).terminate()
