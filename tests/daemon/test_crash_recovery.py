"""A daemon SIGKILLed at any step of a transition recovers: each sandbox ends where it was or where
it was going, with processes and files intact, and nothing half-way or orphaned on the host."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stasis import DaemonUnavailable, Sandbox, SandboxStatus, faults
from tests.conftest import Daemon, sandbox_processes_under, wait_until

S = SandboxStatus


ALL_POINTS = faults.all_points()


def points(*prefixes: str) -> list[str]:
    return [p for p in ALL_POINTS if p.startswith(prefixes)]


CREATE_POINTS = points("create.", "gvisor.start.")
SUSPEND_POINTS = points("suspend.", "gvisor.suspend.")
RESUME_POINTS = points("resume.", "gvisor.resume.")
TERMINATE_POINTS = points("terminate.", "gvisor.destroy.")
CHECKPOINT_POINTS = points("checkpoint.", "gvisor.checkpoint.")
FORK_POINTS = points("fork.")
REMOTE_POINTS = points("remote.")
RESTORE_POINTS = points("gvisor.start_from.")
# A microVM at its backend's own points; the service's points (create., suspend., resume.: the same code for both
# backends, recovered through the backend's probe, which its own points exercise too) on gVisor.
MICROVM_SUSPEND_POINTS = points("microvm.suspend.")
MICROVM_RESUME_POINTS = points("microvm.resume.")
MICROVM_CREATE_POINTS = points("microvm.start.")
MICROVM_CHECKPOINT_POINTS = points("microvm.checkpoint.")
NETWORK_POINTS = points("network.")  # tested in tests/network/test_network_lifecycle.py
IMAGE_POINTS = points("image.")  # tested in tests/images/test_build.py


def test_every_kill_point_in_the_code_is_listed_and_tested() -> None:
    source = Path(faults.__file__).parent
    # Point names appear as literals, passed to faults.point() directly or through a helper.
    prefixes = "create|gvisor|microvm|suspend|resume|checkpoint|fork|terminate|agent|network|image|remote"
    literal = rf'"((?:{prefixes})\.[a-z_]+(?:\.[a-z_]+)*)"'
    used = {m for f in source.rglob("*.py") if f.name != "faults.py" for m in re.findall(literal, f.read_text())}
    used -= {"checkpoint.img", "suspend.partial", "agent.db", "agent.py", "agent.sock", "image.json"}  # files
    assert used == set(ALL_POINTS) | set(faults.AGENT_POINTS)
    tested = CREATE_POINTS + SUSPEND_POINTS + RESUME_POINTS + TERMINATE_POINTS + CHECKPOINT_POINTS + FORK_POINTS
    tested += RESTORE_POINTS + MICROVM_SUSPEND_POINTS + MICROVM_RESUME_POINTS + MICROVM_CREATE_POINTS
    tested += MICROVM_CHECKPOINT_POINTS + NETWORK_POINTS + IMAGE_POINTS
    tested += REMOTE_POINTS  # killed in tests/remote/test_remote_crash.py
    assert set(tested) == set(ALL_POINTS)
    assert len(ALL_POINTS) >= 30


def prepare(sbx: Sandbox) -> int:
    sbx.write_file("/root/keep.txt", b"precious")
    proc = sbx.start_process(["sh", "-c", "while :; do date +%s%N > /root/tick; sleep 0.05; done"])
    wait_until(lambda: sbx.run("test -s /root/tick").exit_code == 0)
    return proc.pid


def assert_intact(sbx: Sandbox, pid: int) -> None:
    if sbx.status == S.SUSPENDED:
        sbx.resume()
    assert sbx.status == S.RUNNING
    assert sbx.read_file("/root/keep.txt") == b"precious"
    assert str(pid) in sbx.run("ps -eo pid").stdout.split()
    first = sbx.read_file("/root/tick")
    wait_until(lambda: sbx.read_file("/root/tick") != first)


def crash_during(daemon: Daemon, action) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DaemonUnavailable):
        action()
    assert daemon.proc is not None
    daemon.proc.wait(timeout=60)
    assert daemon.killed_at_its_kill_point(), "the daemon did not reach its kill point"
    daemon.start()


def live_runsc(daemon: Daemon) -> set[str]:
    """Ids of sandboxes with runsc processes on the host."""
    lines = sandbox_processes_under(daemon.paths.home)
    return {m for line in lines for m in re.findall(r"sandboxes/(sb-[0-9a-z]{12})", line)}


SUSPEND_OR_RESUME = [("gvisor", "suspend", p) for p in SUSPEND_POINTS]
SUSPEND_OR_RESUME += [("gvisor", "resume", p) for p in RESUME_POINTS]
SUSPEND_OR_RESUME += [("microvm", "suspend", p) for p in MICROVM_SUSPEND_POINTS]
SUSPEND_OR_RESUME += [("microvm", "resume", p) for p in MICROVM_RESUME_POINTS]


@pytest.mark.parametrize(("backend", "transition", "point"), SUSPEND_OR_RESUME)
def test_kill_during_suspend_or_resume(own_daemon: Daemon, backend: str, transition: str, point: str) -> None:
    own_daemon.start(STASIS_KILL_POINT=point)
    sbx = Sandbox.create("victim", memory_mb=256, backend=backend, client=own_daemon.client())
    pid = prepare(sbx)
    if transition == "resume":
        sbx.suspend()
    crash_during(own_daemon, getattr(sbx, transition))
    sbx = Sandbox.connect("victim", client=own_daemon.client())
    # Where it was, or where it was going; never half-way, and nothing runs for a suspended sandbox.
    assert sbx.status in (S.RUNNING, S.SUSPENDED), f"{sbx.status} after recovery"
    assert live_runsc(own_daemon) == ({sbx.id} if sbx.status == S.RUNNING else set())
    assert_intact(sbx, pid)


CREATES = [("gvisor", p) for p in CREATE_POINTS] + [("microvm", p) for p in MICROVM_CREATE_POINTS]


@pytest.mark.parametrize(("backend", "point"), CREATES)
def test_kill_during_create(own_daemon: Daemon, backend: str, point: str) -> None:
    own_daemon.start(STASIS_KILL_POINT=point)
    crash_during(
        own_daemon, lambda: Sandbox.create("newborn", memory_mb=256, backend=backend, client=own_daemon.client())
    )
    client = own_daemon.client()
    listed = Sandbox.list(client=client)
    # A create cut off is rolled back: the name is free again and nothing runs.
    assert listed == []
    assert live_runsc(own_daemon) == set()
    assert list(own_daemon.paths.sandboxes.iterdir()) == []
    assert Sandbox.create("newborn", memory_mb=256, backend=backend, client=client).run("echo ok").stdout == "ok\n"


@pytest.mark.parametrize("point", TERMINATE_POINTS)
def test_kill_during_terminate(own_daemon: Daemon, point: str) -> None:
    own_daemon.start(STASIS_KILL_POINT=point)
    sbx = Sandbox.create("doomed", memory_mb=256, client=own_daemon.client())
    crash_during(own_daemon, sbx.terminate)
    assert Sandbox.list(client=own_daemon.client()) == []
    assert live_runsc(own_daemon) == set()
    assert list(own_daemon.paths.sandboxes.iterdir()) == []


def no_partial_checkpoints(daemon: Daemon) -> None:
    root = daemon.paths.home / "checkpoints"
    visible = {c.id for c in Sandbox.list_checkpoints(client=daemon.client())}
    on_disk = {p.name for p in root.iterdir()} if root.exists() else set()
    assert on_disk == visible, f"partial artifacts on disk: {on_disk - visible}"


CHECKPOINTS = [("gvisor", p) for p in CHECKPOINT_POINTS] + [("microvm", p) for p in MICROVM_CHECKPOINT_POINTS]


@pytest.mark.parametrize(("backend", "point"), CHECKPOINTS)
def test_kill_during_checkpoint(own_daemon: Daemon, backend: str, point: str) -> None:
    own_daemon.start(STASIS_KILL_POINT=point)
    sbx = Sandbox.create("victim", memory_mb=256, backend=backend, client=own_daemon.client())
    pid = prepare(sbx)
    crash_during(own_daemon, lambda: sbx.checkpoint("memory", name="snap"))
    no_partial_checkpoints(own_daemon)
    sbx = Sandbox.connect("victim", client=own_daemon.client())
    assert sbx.status == S.RUNNING, f"{sbx.status} after recovery"
    assert_intact(sbx, pid)
    for ckpt in Sandbox.list_checkpoints(client=own_daemon.client()):  # only a sealed one survives, and works
        restored = Sandbox.create(snapshot_id=ckpt.id, client=own_daemon.client())
        assert restored.read_file("/root/keep.txt") == b"precious"


@pytest.mark.parametrize("point", FORK_POINTS)
def test_kill_during_fork(own_daemon: Daemon, point: str) -> None:
    own_daemon.start(STASIS_KILL_POINT=point)
    sbx = Sandbox.create("victim", memory_mb=256, client=own_daemon.client())
    pid = prepare(sbx)
    crash_during(own_daemon, lambda: sbx.copy(times=2))
    no_partial_checkpoints(own_daemon)
    assert Sandbox.list_checkpoints(client=own_daemon.client()) == []  # a fork's checkpoint never outlives it
    client = own_daemon.client()
    for info in Sandbox.list(client=client):
        assert info.status == S.RUNNING
        child = Sandbox(info, client)
        assert child.read_file("/root/keep.txt") == b"precious"
    assert live_runsc(own_daemon) == {i.id for i in Sandbox.list(client=client)}
    assert_intact(Sandbox.connect("victim", client=client), pid)


@pytest.mark.parametrize("point", RESTORE_POINTS)
def test_kill_during_create_from_checkpoint(own_daemon: Daemon, point: str) -> None:
    own_daemon.start(STASIS_KILL_POINT=point)
    sbx = Sandbox.create("origin", memory_mb=256, client=own_daemon.client())
    pid = prepare(sbx)
    ckpt = sbx.checkpoint("memory")
    crash_during(own_daemon, lambda: Sandbox.create("copy", snapshot_id=ckpt.id, client=own_daemon.client()))
    client = own_daemon.client()
    assert [i.name for i in Sandbox.list(client=client)] == ["origin"]  # the cut-off create is rolled back
    assert live_runsc(own_daemon) == {sbx.id}
    restored = Sandbox.create("copy", snapshot_id=ckpt.id, client=client)  # the checkpoint is intact
    assert_intact(restored, pid)


def test_unknown_runsc_containers_and_directories_are_reaped(own_daemon: Daemon) -> None:
    own_daemon.start()
    keep = Sandbox.create("keeper", memory_mb=256, client=own_daemon.client())
    stray = own_daemon.paths.sandboxes / "sb-strayleftovr"
    stray.mkdir()
    own_daemon.kill()
    own_daemon.start()
    assert not stray.exists()
    assert live_runsc(own_daemon) == {keep.id}
    assert Sandbox.connect("keeper", client=own_daemon.client()).run("echo still").stdout == "still\n"
