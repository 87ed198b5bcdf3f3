"""Warm pools on real backends: a matching create claims a started member, claimed sandboxes are
distinct machines, the pool refills, a daemon SIGKILL leaves no orphaned member and removing the
pool frees everything."""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from stasis import InvalidRequest, NameTaken, Pool, Sandbox, SandboxNotFound, Template
from stasis.cli import app
from tests.conftest import Daemon, sandbox_processes_under, wait_until

MEMORY = 512  # every pool and every create that should claim from it ask for this


def runsc_ids(daemon: Daemon) -> set[str]:
    """Containers runsc keeps state for under this daemon's home."""
    return {p.name.split("_sandbox:")[0] for p in daemon.paths.runsc_root.glob("*_sandbox:*.state")}


def identity(sbx: Sandbox) -> tuple[str, str, str]:
    result = sbx.run("hostname; cat /etc/machine-id; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
    assert result.exit_code == 0, result.stderr
    hostname, machine_id, random = result.stdout.split()
    return hostname, machine_id, random


@pytest.mark.parametrize("backend", ["gvisor", "microvm"])
def test_creates_claim_distinct_members_and_the_pool_refills(own_daemon: Daemon, backend: str) -> None:
    own_daemon.start()
    with own_daemon.client() as client:
        Pool.create("warm", size=2, backend=backend, memory_mb=MEMORY, client=client)
        ready = Pool.wait_ready("warm", client=client)
        assert Sandbox.list(client=client) == []  # members are nobody's sandboxes yet
        with pytest.raises(SandboxNotFound):
            Sandbox.connect(ready.members[0], client=client)

        a = Sandbox.create("claim-a", backend=backend, memory_mb=MEMORY, timeout_secs=300, client=client)
        b = Sandbox.create("claim-b", backend=backend, memory_mb=MEMORY, client=client)
        assert {a.id, b.id} == set(ready.members)
        assert a.info().from_pool == b.info().from_pool == "warm"
        assert a.info().spec.timeout_secs == 300  # the claim's idle policy, not the member's "never"
        assert {i.name for i in Sandbox.list(client=client)} == {"claim-a", "claim-b"}

        ids = {sbx: identity(sbx) for sbx in (a, b)}
        for part in range(3):  # hostname, machine id, 16 random bytes
            assert ids[a][part] != ids[b][part]
        if backend == "microvm":  # its agent renames the machine; gVisor's keeps its id (no CAP_SYS_ADMIN)
            assert ids[a][0] == "claim-a"
        else:
            assert ids[a][0] == a.id
        assert len(ids[a][1]) == 32

        refilled = Pool.wait_ready("warm", client=client)
        assert refilled.claimed == 2 and not set(refilled.members) & {a.id, b.id}

        other = Sandbox.create("not-pooled", backend=backend, memory_mb=MEMORY + 128, client=client)
        assert other.info().from_pool is None and other.id not in refilled.members

        Pool.remove("warm", client=client)
        assert Pool.list(client=client) == []
        assert a.run("echo still-mine").stdout == "still-mine\n"  # claimed sandboxes stay
        for sbx in (a, b, other):
            sbx.terminate()
    assert sandbox_processes_under(own_daemon.paths.home) == []
    assert list(own_daemon.paths.sandboxes.iterdir()) == []


def test_a_daemon_sigkill_leaves_no_orphaned_member_and_rm_frees_everything(own_daemon: Daemon) -> None:
    own_daemon.start()
    with own_daemon.client() as client:
        Pool.create("survivor", size=2, memory_mb=MEMORY, client=client)
        before = Pool.wait_ready("survivor", client=client)
    own_daemon.kill()  # with both members running: they go on without the daemon
    own_daemon.start()
    with own_daemon.client() as client:
        after = Pool.wait_ready("survivor", client=client)
        assert set(after.members) == set(before.members)  # re-adopted, not started again
        assert runsc_ids(own_daemon) == set(after.members)
        claimed = Sandbox.create(memory_mb=MEMORY, client=client)
        assert claimed.id in before.members and claimed.run("echo ok").stdout == "ok\n"
        # Killed again while the refill starts a member: the half-started one is rolled back.
        wait_until(lambda: Pool.get("survivor", client=client).starting > 0, timeout=30, interval=0.01)
    own_daemon.kill()
    own_daemon.start()
    with own_daemon.client() as client:
        refilled = Pool.wait_ready("survivor", client=client)
        assert len(refilled.members) == 2
        assert runsc_ids(own_daemon) == set(refilled.members) | {claimed.id}
        Pool.remove("survivor", client=client)
        assert runsc_ids(own_daemon) == {claimed.id}
        Sandbox.connect(claimed.id, client=client).terminate()
    assert runsc_ids(own_daemon) == set()
    assert sandbox_processes_under(own_daemon.paths.home) == []
    assert list(own_daemon.paths.sandboxes.iterdir()) == []


def test_bad_pools_are_refused_with_what_to_do(own_daemon: Daemon) -> None:
    own_daemon.start(STASIS_POOL_MEMORY_MB="1024")
    with own_daemon.client() as client:
        with pytest.raises(InvalidRequest, match=r"memory budget is 1024 MiB.*STASIS_POOL_MEMORY_MB"):
            Pool.create("big", size=3, memory_mb=512, client=client)
        with pytest.raises(InvalidRequest, match="unknown image 'no-such-image'"):
            Pool.create("nowhere", image="no-such-image", client=client)
        with pytest.raises(InvalidRequest, match="invalid sandbox name"):
            Pool.create("../escape", client=client)
        Pool.create("one", size=1, memory_mb=512, client=client)
        with pytest.raises(NameTaken):
            Pool.create("one", size=1, memory_mb=512, client=client)
        with pytest.raises(InvalidRequest, match="1024 MiB and 512 MiB of it is taken"):
            Pool.create("two", size=2, memory_mb=512, client=client)
        Pool.remove("one", client=client)


def test_the_cli_creates_lists_and_removes_a_pool(own_daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    own_daemon.start()
    monkeypatch.setenv("STASIS_HOME", str(own_daemon.paths.home))
    monkeypatch.setenv("STASIS_IMAGE_DIR", str(own_daemon.paths.images))
    runner = CliRunner()
    created = runner.invoke(app, ["pool", "create", "cli-pool", "--size", "1", "--memory-mb", str(MEMORY)])
    assert created.exit_code == 0, created.output
    assert "1/1 ready" in created.stdout
    listed = runner.invoke(app, ["pool", "ls"])
    assert "cli-pool" in listed.stdout and "default" in listed.stdout
    assert runner.invoke(app, ["pool", "rm", "cli-pool"]).exit_code == 0
    assert "no pools" in runner.invoke(app, ["pool", "ls"]).stdout
    assert runsc_ids(own_daemon) == set()


def test_a_pool_of_a_template_hands_out_its_running_server(own_daemon: Daemon) -> None:
    own_daemon.start()
    serve = "python3 -m http.server 8000 --bind 127.0.0.1"
    ready = "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8000), timeout=1)\""
    get = "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/').status)\""
    with own_daemon.client() as client:
        Template.create("served", start_cmd=serve, ready_cmd=ready, memory_mb=MEMORY, client=client)
        Pool.create("served-pool", template="served", size=2, client=client)
        members = Pool.wait_ready("served-pool", client=client).members
        a = Sandbox.create("tpl-a", template="served", client=client)
        b = Sandbox.create("tpl-b", template="served", client=client)
        assert {a.id, b.id} == set(members) and a.info().from_pool == "served-pool"
        assert a.info().spec.memory_mb == MEMORY  # the template's
        assert a.run(get).stdout == b.run(get).stdout == "200\n"  # restored with its server running
        assert identity(a)[1] != identity(b)[1]  # forks of one memory image, each its own machine id
        Pool.wait_ready("served-pool", client=client)
        c = Sandbox.create("tpl-c", template="served", client=client)
        wait_until(lambda: Pool.get("served-pool", client=client).starting > 0, timeout=30)
        Pool.remove("served-pool", client=client)  # while it restores c's replacement
        assert {a.id, b.id, c.id} == runsc_ids(own_daemon), "a start cut short left a sandbox behind"
        for sbx in (a, b, c):
            sbx.terminate()
        assert sandbox_processes_under(own_daemon.paths.home) == []
        Template.delete("served", client=client)


def test_a_claimed_sandboxs_idle_clock_starts_at_the_claim(own_daemon: Daemon) -> None:
    own_daemon.start()
    with own_daemon.client() as client:
        Pool.create("idle", size=1, memory_mb=MEMORY, client=client)
        Pool.wait_ready("idle", client=client)
        time.sleep(3)  # the member waited longer than the claim's idle timeout
        sbx = Sandbox.create("idle-claim", memory_mb=MEMORY, timeout_secs=2, client=client)
        time.sleep(1)
        assert sbx.info().status.value == "running"
        wait_until(lambda: sbx.info().status.value == "suspended", timeout=15)  # then it does idle out
        Pool.remove("idle", client=client)
        sbx.terminate()
