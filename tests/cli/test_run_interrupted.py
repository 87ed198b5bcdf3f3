"""Ctrl-C on `stasis run` ends it within seconds, and the command in the sandbox with it, even when the sandbox's
agent does not answer for a while (a loaded host). The real CLI against the real app on the fake backend."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from stasis.cli.quick import KILL_WAIT
from stasis.daemon.app import create_app
from stasis.daemon.core.service import SandboxService
from stasis.paths import Paths
from tests.conftest import wait_until
from tests.fakes import FakeBackend
from tests.fastkit import fake_home

pytestmark = pytest.mark.fast


@dataclass
class FakeDaemon:
    paths: Paths
    service: SandboxService
    http: httpx.Client

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "STASIS_HOME": str(self.paths.home), "STASIS_IMAGE_DIR": str(self.paths.images)}

    def agent_pid(self, name: str) -> int:
        box = self.service.boxes.box(self.service.store.get(name))
        pid = self.service.backends["fake"].pid(box)  # type: ignore[attr-defined]
        assert pid is not None
        return int(pid)

    def process(self, process_id: str) -> dict[str, Any]:
        return dict(self.http.get(f"/v1/sandboxes/box/processes/{process_id}").json())

    def running_cli_commands(self) -> list[str]:
        listing = self.http.get("/v1/sandboxes/box/processes").json()
        return [p["id"] for p in listing if p["id"].startswith("cli-") and p["status"] == "running"]


@pytest.fixture
def fake_daemon() -> Iterator[FakeDaemon]:
    """The daemon's app served on its unix socket from a thread, with a sandbox named "box"."""
    paths = fake_home("run-interrupted")
    started: dict[str, Any] = {}

    async def serve() -> None:
        service = SandboxService(paths, backends={"fake": FakeBackend(paths)})
        config = uvicorn.Config(create_app(paths, service=service), uds=str(paths.socket), log_config=None)
        started.update(service=service, server=uvicorn.Server(config))
        await started["server"].serve()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    http = httpx.Client(transport=httpx.HTTPTransport(uds=str(paths.socket)), base_url="http://stasis", timeout=60)
    wait_until(lambda: answers(http))
    assert http.post("/v1/sandboxes", json={"name": "box", "backend": "fake"}).status_code == 201
    try:
        yield FakeDaemon(paths, started["service"], http)
    finally:
        for process in http.get("/v1/sandboxes/box/processes").json():  # the fake runs them on this host
            if process["status"] == "running":
                http.post(f"/v1/sandboxes/box/processes/{process['id']}/signal", json={"signal": "SIGKILL"})
        http.delete("/v1/sandboxes/box")
        started["server"].should_exit = True
        thread.join(30)
        http.close()


def answers(http: httpx.Client) -> bool:
    try:
        return http.get("/v1/health").is_success
    except httpx.TransportError:  # not listening yet (the socket's file comes first)
        return False


def stasis_run(fake_daemon: FakeDaemon, command: str, ignoring_sigint: bool = False) -> subprocess.Popen[bytes]:
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignoring_sigint else None
    cli = subprocess.Popen([sys.executable, "-m", "stasis", "run", "-n", "box", command], env=fake_daemon.env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=ignore)  # fmt: skip
    wait_until(fake_daemon.running_cli_commands)
    return cli


@pytest.mark.slow  # seconds of its own: the full suite runs it, the fast tier not
def test_ctrl_c_ends_stasis_run_within_seconds_even_when_the_agent_does_not_answer(fake_daemon: FakeDaemon) -> None:
    cli = stasis_run(fake_daemon, "sleep 300")
    (process_id,) = fake_daemon.running_cli_commands()
    agent = fake_daemon.agent_pid("box")
    os.kill(agent, signal.SIGSTOP)  # a starved sandbox: the kill cannot be confirmed for now
    try:
        began = time.monotonic()
        cli.send_signal(signal.SIGINT)
        code = cli.wait(timeout=120)
        took = time.monotonic() - began
    finally:
        os.kill(agent, signal.SIGCONT)
    assert cli.stderr is not None
    said = b" ".join(cli.stderr.read().split())
    assert code == 130 and took < 2 * KILL_WAIT + 5, (code, took, said)  # it waited the daemon's 60 s before
    assert b"not confirmed" in said and b"killed" not in said  # it said "killed" while the command ran on
    wait_until(lambda: fake_daemon.process(process_id)["status"] == "exited")  # once the agent answers, it is gone


def test_ctrl_c_interrupts_a_stasis_run_started_with_sigint_ignored(fake_daemon: FakeDaemon) -> None:
    """A shell's background job, CI, a worker pool: a process may start with SIGINT ignored, and Python then
    raises no KeyboardInterrupt. `stasis run` is interrupted all the same (the suite's Ctrl-C test hung so)."""
    cli = stasis_run(fake_daemon, "sleep 300", ignoring_sigint=True)
    (process_id,) = fake_daemon.running_cli_commands()
    cli.send_signal(signal.SIGINT)
    assert cli.wait(timeout=120) == 130
    wait_until(lambda: fake_daemon.process(process_id)["status"] == "exited")


def test_a_stasis_run_that_dies_takes_its_command_with_it_as_ssh_does(fake_daemon: FakeDaemon) -> None:
    cli = stasis_run(fake_daemon, "sleep 300")
    (process_id,) = fake_daemon.running_cli_commands()
    cli.kill()  # kill -9, or a closed terminal's SIGHUP: no chance to ask for the kill
    cli.wait()
    wait_until(lambda: fake_daemon.process(process_id)["status"] == "exited")


def test_a_streamed_run_outlives_a_client_that_did_not_ask_otherwise(fake_daemon: FakeDaemon) -> None:
    for process_id, query in (("kept", ""), ("killed", "?kill_on_disconnect=true")):
        body = {"cmd": ["sleep", "300"], "exec_id": process_id}
        with fake_daemon.http.stream("POST", f"/v1/sandboxes/box/exec/stream{query}", json=body) as streamed:
            assert next(streamed.iter_lines()) == f'{{"exec_id": "{process_id}"}}'
    wait_until(lambda: fake_daemon.process("killed")["status"] == "exited")
    assert fake_daemon.process("kept")["status"] == "running"  # to be collected by its exec_id, as documented
