"""Transfers cut off midway: the store stopped under a push, the daemon SIGKILLed before, during and
after the hand-over. Every case ends with the sandbox on exactly one node, whole, and a push or pull
that runs again finishes the job without sending what already arrived."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stasis import Client, Conflict, Sandbox, SandboxNotFound, StasisError, StoreUnreachable
from tests.conftest import Daemon
from tests.remote.conftest import S3
from tests.remote.test_remote import holder_state, start_holder


def prepared(a: Daemon, name: str) -> tuple[Sandbox, int, str]:
    """A suspended sandbox with a file and a process holding memory: (it, the pid, the memory's hash)."""
    with a.client() as client:
        sbx = Sandbox.create(name, memory_mb=512, client=client)
        sbx.write_file("/root/notes.txt", b"precious")
        pid = start_holder(sbx)
        digest = holder_state(sbx)[1]
        sbx.suspend()
        return sbx, pid, digest


def check_whole(daemon: Daemon, name: str, pid: int, digest: str) -> None:
    """Resumed on ``daemon`` (taken from the store first if it is not there): its file, process and memory."""
    with daemon.client() as client:
        try:
            sbx = Sandbox.connect(name, client=client)
        except SandboxNotFound:
            Sandbox.pull(name, client=client)
            sbx = Sandbox.connect(name, client=client)
        sbx.resume()
        assert sbx.read_file("/root/notes.txt") == b"precious"
        assert sbx.run(f"kill -0 {pid}").exit_code == 0
        assert holder_state(sbx)[1] == digest


def killed_during(daemon: Daemon, action: Callable[[Client], object]) -> None:
    """Run ``action`` on a daemon started with a kill point; it dies there; start it again."""
    with daemon.client() as client, pytest.raises(StasisError):  # the connection drops mid-request
        action(client)
    assert daemon.killed_at_its_kill_point()
    daemon.start()


def test_a_push_to_a_stopped_store_fails_and_the_sandbox_stays(nodes: tuple[Daemon, Daemon], s3: S3) -> None:
    a = nodes[0].start()
    _, pid, digest = prepared(a, "stays")
    s3.stop()
    with a.client() as client, pytest.raises(StoreUnreachable, match="could not"):
        Sandbox.connect("stays", client=client).push()
    s3.restart()
    check_whole(a, "stays", pid, digest)  # still here, suspended, whole


def test_a_daemon_killed_after_sending_the_pieces_keeps_the_sandbox_and_a_retry_sends_nothing_again(
    nodes: tuple[Daemon, Daemon],
) -> None:
    a, b = nodes
    a.start(STASIS_KILL_POINT="remote.push.after_chunks")
    _, pid, digest = prepared(a, "half-sent")
    killed_during(a, lambda client: Sandbox.connect("half-sent", client=client).push())
    with a.client() as client:
        assert Sandbox.connect("half-sent", client=client).info().status.value == "suspended"
        result = Sandbox.connect("half-sent", client=client).push()
        assert result.moved_bytes < result.bytes / 100, "the pieces that arrived before the kill are not sent again"
    b.start()
    check_whole(b, "half-sent", pid, digest)


def test_a_daemon_killed_after_the_hand_over_finishes_removing_its_copy_on_restart(
    nodes: tuple[Daemon, Daemon],
) -> None:
    a, b = nodes
    a.start(STASIS_KILL_POINT="remote.push.after_manifest")
    sbx, pid, digest = prepared(a, "handed")
    killed_during(a, lambda client: Sandbox.connect("handed", client=client).push())
    with a.client() as client:
        assert Sandbox.list(client=client) == []  # the store had taken it: its copy here is gone
    assert not (a.paths.sandboxes / sbx.id).exists()
    b.start()
    check_whole(b, "handed", pid, digest)


def test_a_node_killed_after_taking_a_sandbox_fetches_it_whole_on_the_next_pull(
    nodes: tuple[Daemon, Daemon],
) -> None:
    a, b = nodes
    a.start()
    _, pid, digest = prepared(a, "taken")
    with a.client() as client:
        Sandbox.connect("taken", client=client).push()
    b.start(STASIS_KILL_POINT="remote.pull.after_take")
    killed_during(b, lambda client: Sandbox.pull("taken", client=client))
    check_whole(b, "taken", pid, digest)  # the resume pulls again: node B owns it, it fetches it whole
    with a.client() as client, pytest.raises(Conflict, match="node-b"):
        Sandbox.pull("taken", client=client)
