"""Harbor (the real package, in a Python >= 3.12 virtualenv of its own) running trials in stasis sandboxes.

Harbor needs Python 3.12; the suite runs on 3.11. `make setup` makes `.venv-harbor` with a newer
Python when this host has one, and these tests drive Harbor there: its `harbor run` CLI with the
offline `oracle` agent, and its environment API from a script.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from stasis import Sandbox
from tests.conftest import Daemon
from tests.images.conftest import images_daemon  # noqa: F401 - the fixture: builds stay out of the user's cache

ROOT = Path(__file__).resolve().parents[2]
HARBOR_PYTHON = ROOT / ".venv-harbor" / "bin" / "python"
pytestmark = pytest.mark.skipif(
    not HARBOR_PYTHON.exists(),
    reason="Harbor needs Python >= 3.12 and this host has none (make setup looks for python3.12/3.13)",
)

TASK = {
    "instruction.md": "Write the answer, 42, to /app/answer.txt.\n",
    "environment/Dockerfile": "FROM default\nRUN mkdir -p /app && echo seeded > /app/seed.txt\nWORKDIR /app\n",
    "solution/solve.sh": "#!/bin/bash\ncat /app/seed.txt\necho 42 > /app/answer.txt\n",
    "tests/test.sh": """
        #!/bin/bash
        if [ "$(cat /app/answer.txt)" = 42 ] && [ "$(cat /app/seed.txt)" = seeded ]; then
          echo 1 > /logs/verifier/reward.txt
        else
          echo 0 > /logs/verifier/reward.txt
        fi
    """,
}


def make_task(directory: Path) -> Path:
    """A task as Harbor's docs start one: `harbor init` writes the layout and task.toml, then the task's own files
    (a Dockerfile FROM stasis' default image, since no registry is reachable here; the verifier in the shared
    environment; no network)."""
    made = subprocess.run([str(HARBOR_PYTHON.parent / "harbor"), "init", "stasis/answer", "--task", "--no-pytest",
                           "--verifier-mode", "shared", "-o", str(directory.parent)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    assert directory.name == "answer" and (directory / "task.toml").exists(), made.stdout
    toml = (directory / "task.toml").read_text()
    assert 'network_mode = "public"' in toml and 'environment_mode = "shared"' in toml, toml
    (directory / "task.toml").write_text(toml.replace('network_mode = "public"', 'network_mode = "no-network"'))
    for name, text in TASK.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
        if name.endswith(".sh"):
            path.chmod(0o755)
    return directory


def harbor(daemon: Daemon, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env={**daemon.env, "NO_COLOR": "1"}, capture_output=True, text=True,
                          timeout=900)  # fmt: skip


def test_harbor_run_with_the_oracle_agent_passes_a_task_built_from_its_dockerfile(
    images_daemon: Daemon,  # noqa: F811
    tmp_path: Path,
) -> None:
    task = make_task(tmp_path / "answer")
    result = harbor(images_daemon, str(HARBOR_PYTHON.parent / "harbor"), "run", "-p", str(task), "-a", "oracle",
                    "-e", "stasis.integrations.harbor:StasisEnvironment", "-o", str(tmp_path / "jobs"), "-y", "-q",
                    cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rewards = [p.read_text().strip() for p in (tmp_path / "jobs").rglob("reward.txt")]
    assert rewards == ["1"], (rewards, result.stdout[-3000:])
    # harbor deletes a trial's environment by default: nothing of it keeps running
    trials = Sandbox.list(include_terminated=True, client=images_daemon.client())
    assert trials and all(info.status == "terminated" for info in trials)


SCRIPT = textwrap.dedent("""
    import asyncio, json, sys, tempfile
    from pathlib import Path
    from harbor.models.task.config import EnvironmentConfig
    from harbor.models.trial.paths import TrialPaths
    from stasis.integrations.harbor import StasisEnvironment

    task, work = Path(sys.argv[1]), Path(tempfile.mkdtemp())
    found = {}

    async def main():
        compose = work / "compose"
        compose.mkdir()
        (compose / "docker-compose.yaml").write_text("services: {main: {image: busybox}}")
        try:
            StasisEnvironment(compose, "c", "c__t__env", TrialPaths(work / "c"), EnvironmentConfig())
        except FileNotFoundError as exc:
            found["compose"] = str(exc)
        env = StasisEnvironment(task / "environment", "answer", "answer__t1__env", TrialPaths(work / "trial"),
                                EnvironmentConfig(network_mode="no-network"))
        await env.start(force_build=False)
        try:
            first = await env.exec("echo turn one > notes.txt; nohup sleep 600 >/dev/null 2>&1 & echo $! > bg.pid; pwd")
            found["pwd"] = first.stdout.strip()
            await asyncio.to_thread(env.sandbox.suspend)
            found["status"] = env.sandbox.info().status
            second = await env.exec("cat notes.txt; kill -0 $(cat bg.pid) && echo still-running")
            found["second"] = second.stdout
            (work / "up" / "sub").mkdir(parents=True)
            (work / "up" / "sub" / "a.txt").write_text("A")
            await env.upload_dir(work / "up", "/app")
            await env.upload_file(task / "instruction.md", "/app/instruction.md")
            await env.download_dir("/app", work / "down")
            found["downloaded"] = sorted(str(p.relative_to(work / "down")) for p in (work / "down").rglob("*"))
            await env.download_file("/app/sub/a.txt", work / "a.txt")
            found["file"] = (work / "a.txt").read_text()
            try:
                await env.exec("sleep 30", timeout_sec=1)
            except RuntimeError as exc:
                found["timeout"] = str(exc)
            try:
                await env.download_file("/no/such/file", work / "x")
            except FileNotFoundError as exc:
                found["missing"] = type(exc).__name__
            found["failed"] = (await env.exec("exit 7")).return_code
            big = await env.exec("head -c 3000000 /dev/zero | tr '\\\\0' a")
            found["big"] = [len(big.stdout), sorted(set(big.stdout))]
            nowhere = await env.exec("pwd", cwd="/no/such/dir")
            found["nowhere"] = [nowhere.return_code, nowhere.stderr]
            pieces = []
            async def heard(text, stream):
                pieces.append([stream, text])
            with env.scoped_output_callback(heard):
                streamed = await env.exec("echo one; echo two >&2; sleep 0.3; echo three")
            found["streamed"] = [pieces, streamed.stdout]
        finally:
            sandbox_id = env.sandbox.id
            await env.stop(delete=True)
        found["sandbox"] = sandbox_id
        print(json.dumps(found))

    asyncio.run(main())
""")


def test_the_environment_api_keeps_files_and_processes_across_a_suspend(images_daemon: Daemon,  # noqa: F811
                                                                        tmp_path: Path) -> None:  # fmt: skip
    task = make_task(tmp_path / "answer")
    result = harbor(images_daemon, str(HARBOR_PYTHON), "-c", SCRIPT, str(task), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["pwd"] == "/app" and found["status"] == "suspended"
    assert "turn one" in found["second"] and "still-running" in found["second"]
    assert {"seed.txt", "notes.txt", "sub/a.txt", "instruction.md"} <= set(found["downloaded"])
    assert found["file"] == "A" and found["failed"] == 7
    assert found["big"] == [3_000_000, ["a"]]  # all of it, as Docker's environment returns it
    assert found["nowhere"][0] == 126 and "/no/such/dir" in found["nowhere"][1]  # an exit code, not a raise
    pieces, stdout = found["streamed"]
    assert "".join(text for stream, text in pieces if stream == "stdout") == stdout == "one\nthree\n"
    assert ["stderr", "two\n"] in pieces
    assert "docker-compose tasks are not supported" in found["compose"]
    assert found["timeout"] == "Command timed out after 1 seconds" and found["missing"] == "FileNotFound"
    assert Sandbox.connect(found["sandbox"], client=images_daemon.client()).info().status == "terminated"
