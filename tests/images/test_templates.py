"""Templates that start warm: a sandbox created from one has its server running before the first exec."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stasis import Client, NameTaken, NotFound, Sandbox, Template, TemplateNotReady
from tests.conftest import Daemon
from tests.network.servers import COUNTER

READY = "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8000), timeout=1)\""
GET = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/warm', timeout=5).read().decode())"


def test_a_sandbox_from_a_template_has_its_server_answering_at_once(client: Client, backend: str) -> None:
    name = f"counter-{backend}"
    start = f"python3 -c '{COUNTER.replace(chr(39), chr(34))}' 8000"
    template = Template.create(name, start_cmd=start, ready_cmd=READY, backend=backend, memory_mb=512,
                               client=client)  # fmt: skip
    made: list[Sandbox] = []
    try:
        assert name in [t.name for t in Template.list(client=client)]
        with pytest.raises(NameTaken, match="replace=True"):
            Template.create(name, start_cmd="true", client=client)
        made = [Sandbox.create(template=name, client=client) for _ in range(2)]
        for sbx in made:  # the first exec finds the server up; each copy has its own counter
            assert sbx.run(["python3", "-c", GET]).stdout == "1 /warm\n"
            assert sbx.run(["python3", "-c", GET]).stdout == "2 /warm\n"
        assert made[0].info().from_checkpoint == template.checkpoint_id
    finally:
        for sbx in made:
            sbx.terminate()
        Template.delete(name, client=client)
    assert name not in [t.name for t in Template.list(client=client)]
    with pytest.raises(NotFound, match=f"no template named '{name}'"):
        Sandbox.create(template=name, client=client)


def test_a_template_that_never_gets_ready_says_why_and_leaves_nothing(client: Client) -> None:
    before = {c.id for c in Sandbox.list_checkpoints(client=client)}
    sandboxes = {s.id for s in Sandbox.list(client=client)}
    heard: list[tuple[int, str]] = []

    def checked(attempt: int, seconds: float, said: str) -> None:
        heard.append((attempt, said))

    with pytest.raises(TemplateNotReady, match=r"(?s)did not succeed within 3s.*exited.*port taken"):
        Template.create("never", start_cmd="echo port taken; exit 1", ready_cmd="echo not yet; false",
                        ready_timeout=3, client=client, on_check=checked)  # fmt: skip
    assert heard and heard[0] == (1, "exit 1: not yet")  # each failed check is said as it happens, not 120 s later
    assert {c.id for c in Sandbox.list_checkpoints(client=client)} == before
    assert {s.id for s in Sandbox.list(client=client)} == sandboxes


def test_the_cli_makes_lists_uses_and_removes_templates(daemon: Daemon) -> None:
    env = {**os.environ, **daemon.env}

    def stasis(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stasis", *args], env=env, capture_output=True, text=True,
                              timeout=300)  # fmt: skip

    made = stasis("template", "create", "cli-warm", "--start", "sleep 1000 & echo up > /root/up", "--ready",
                  "test -e /root/up", "--memory-mb", "256")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "cli-warm" in stasis("template", "ls").stdout
    assert stasis("create", "from-cli-warm", "--template", "cli-warm").returncode == 0
    assert stasis("run", "from-cli-warm", "--", "cat", "/root/up").stdout == "up\n"
    assert stasis("rm", "from-cli-warm").returncode == 0
    assert stasis("template", "rm", "cli-warm").returncode == 0
    assert "cli-warm" not in stasis("template", "ls").stdout
