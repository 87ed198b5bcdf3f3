"""Teams on one daemon over TCP: each team's key reaches its own sandboxes, checkpoints and volumes and nothing of
another team's (not found, never forbidden); scopes limit what a key may do; quotas refuse a start up front (a
suspended sandbox does not count); revoked and expired keys stop working; the owner's token sees everything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from stasis import (
    CheckpointNotFound,
    CheckpointType,
    Client,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    Sandbox,
    SandboxNotFound,
    Secret,
    Unauthorized,
    Volume,
    VolumeNotFound,
)
from stasis.sdk import team as teams
from tests.cli.test_ssh import STASIS, SshClient, ssh_client
from tests.conftest import Daemon, wait_until
from tests.images.test_oci import free_port

OWNER_TOKEN = "owner-token-of-the-teams-test"
BURN_SECONDS = 1.5
BURN = f"python3 -c 'import time\nwhile time.process_time() < {BURN_SECONDS}: pass'"  # CPU time, not wall time


@pytest.fixture
def served(own_daemon: Daemon) -> Iterator[Daemon]:
    own_daemon.sticky_env["STASIS_TOKEN"] = OWNER_TOKEN
    own_daemon.url = f"http://127.0.0.1:{free_port()}"  # type: ignore[attr-defined]
    own_daemon.start("--tcp", own_daemon.url.removeprefix("http://"))  # type: ignore[attr-defined]
    yield own_daemon


def cli(daemon: Daemon, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**daemon.env, "STASIS_URL": daemon.url, "STASIS_TOKEN": token}  # type: ignore[attr-defined]
    return subprocess.run([sys.executable, "-m", "stasis", *args], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def new_key(daemon: Daemon, team: str, *options: str) -> str:
    made = cli(daemon, OWNER_TOKEN, "key", "create", "--team", team, *options, "--json")
    assert made.returncode == 0, made.stderr
    return json.loads(made.stdout)["key"]  # type: ignore[no-any-return]


def test_each_team_reaches_only_its_own_and_scopes_and_quotas_hold(served: Daemon) -> None:
    url = served.url  # type: ignore[attr-defined]
    for team in ("red", "blue"):
        assert cli(served, OWNER_TOKEN, "team", "create", team).returncode == 0
    red_key, blue_key = new_key(served, "red"), new_key(served, "blue", "--scope", "sandboxes:write", "--scope", "exec")
    reader_key = new_key(served, "red", "--scope", "read")
    with Client(url=url, token=red_key) as red, Client(url=url, token=blue_key) as blue, \
            Client(url=url, token=reader_key) as reader, Client(url=url, token=OWNER_TOKEN) as owner:  # fmt: skip
        assert teams.whoami(client=red)["team"] == "red" and teams.whoami(client=owner)["team"] is None
        sbx = Sandbox.create(backend="gvisor", memory_mb=256, client=red)
        assert sbx.info().spec.team == "red"
        sbx.run("echo red-only > /root/secret.txt")
        Volume.create("red-data", client=red)
        checkpoint = sbx.checkpoint(CheckpointType.FILESYSTEM)

        # Another team finds nothing of red's: every way in answers "not found".
        assert Sandbox.list(client=blue) == [] and Volume.list(client=blue) == []
        with pytest.raises(SandboxNotFound):
            Sandbox.connect(sbx.id, client=blue)
        raw = httpx.Client(base_url=url, headers={"authorization": f"Bearer {blue_key}"})
        told = raw.get("/v1/health").json()  # a tenant learns the backends' names, not the host's pid, home or builds
        assert (told["pid"], told["home"], set(told["backends"])) == (0, "", {"gvisor", "microvm"}), told
        assert not any(told["backends"].values())
        assert teams.whoami(client=owner) and httpx.get(f"{url}/v1/health", headers={
            "authorization": f"Bearer {OWNER_TOKEN}"}).json()["backends"]["gvisor"]  # fmt: skip
        for method, path in (
            ("POST", f"/v1/sandboxes/{sbx.id}/exec"),
            ("GET", f"/v1/sandboxes/{sbx.id}/files"),
            ("DELETE", f"/v1/sandboxes/{sbx.id}"),
            ("GET", f"/v1/checkpoints/{checkpoint.id}"),
            ("GET", "/v1/volumes/red-data"),
            ("POST", f"/v1/checkpoints/{checkpoint.id}/fork"),
        ):
            answer = raw.request(method, path, json={"cmd": ["cat", "/root/secret.txt"]})
            assert answer.status_code == 404, (method, path, answer.text)  # fmt: skip
        with pytest.raises(CheckpointNotFound):
            Sandbox.create(snapshot_id=checkpoint.id, client=blue)
        with pytest.raises(VolumeNotFound):
            Sandbox.create(backend="gvisor", volumes={"/data": "red-data"}, client=blue)
        removed = raw.post("/v1/sandboxes/remove", json={"refs": [sbx.id]}).json()
        assert removed["removed"] == [] and sbx.id in removed["failed"]
        # ... word for word what a name nobody has gets, so a key learns nothing of what other teams have
        for kind, path in (("sandbox", "/v1/sandboxes/{}"), ("checkpoint", "/v1/checkpoints/{}"),
                           ("volume", "/v1/volumes/{}")):  # fmt: skip
            theirs = {"sandbox": sbx.id, "checkpoint": checkpoint.id, "volume": "red-data"}[kind]
            nobodys = {"sandbox": "sb-000000000000", "checkpoint": "ck-000000000000", "volume": "no-such"}[kind]
            answers = [raw.get(path.format(ref)).json() for ref in (theirs, nobodys)]
            assert json.dumps(answers[0]).replace(theirs, "X") == json.dumps(answers[1]).replace(nobodys, "X"), kind
        red_named_remove = Sandbox.create("remove", backend="gvisor", memory_mb=256, client=red)
        with pytest.raises(Conflict) as taken:  # the name is red's: blue is told it is not free, not whose or why
            Sandbox.create("remove", backend="gvisor", memory_mb=256, client=blue)
        assert "cannot be used here" in str(taken.value) and "exists" not in str(taken.value)
        assert "stasis rm" not in str(taken.value)
        assert raw.get("/v1/sandboxes/remove").status_code == 404  # the bulk verb's path is no way around
        assert raw.delete("/v1/sandboxes/remove").status_code == 404
        red_named_remove.terminate()
        with pytest.raises(Forbidden, match="owner's templates"):
            sbx.checkpoint(CheckpointType.FILESYSTEM, name="template-web")  # a team cannot plant a template
        with pytest.raises(CheckpointNotFound, match="team red's"):
            Sandbox.create(snapshot_id=checkpoint.id, client=owner)  # never mixed into another's create
        for path in ("/v1/teams", "/v1/pools", "/metrics"):  # the owner's routes
            assert raw.get(path).status_code == 403, path
        Secret.add("OWNERS_ONLY", "x", hosts=["api.example.test"], client=owner)
        assert Secret.list(client=blue) == []  # a team's secrets are its own store: not the owner's, not red's
        with pytest.raises(NotFound, match="no secret named OWNERS_ONLY"):
            Sandbox.create(backend="gvisor", secrets=["OWNERS_ONLY"], network=True, client=blue)
        Secret.remove("OWNERS_ONLY", client=owner)

        # A read-only key of red's sees red's sandbox but may not change or run anything.
        assert [s.id for s in Sandbox.list(client=reader)] == [sbx.id]
        with pytest.raises(Forbidden, match="write scope"):
            Sandbox.create(backend="gvisor", client=reader)
        with pytest.raises(Forbidden, match="exec scope"):
            Sandbox.connect(sbx.id, client=reader).run("true")
        with pytest.raises(Forbidden, match="exec scope"):
            Sandbox.connect(sbx.id, client=reader).ports()  # a port's URL and token reach into the sandbox

        # The owner sees everything, and red's restore of its own checkpoint is red's.
        assert sbx.id in {s.id for s in Sandbox.list(client=owner)}
        restored = Sandbox.create(snapshot_id=checkpoint.id, client=red)
        assert restored.run("cat /root/secret.txt").stdout == "red-only\n" and restored.info().spec.team == "red"

        metrics = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {OWNER_TOKEN}"}).text
        assert 'stasis_team_sandboxes{state="running",team="red"} 2.0' in metrics  # the metrics have team labels

        # Quotas: refused up front with what is used; a suspended sandbox does not count.
        assert cli(served, OWNER_TOKEN, "team", "set", "red", "--max-running", "2").returncode == 0
        with pytest.raises(QuotaExceeded, match="2 running sandboxes in use of its 2") as refused:
            Sandbox.create(backend="gvisor", client=red)
        assert "stasis team set red --max-running" in str(refused.value)
        restored.suspend()
        third = Sandbox.create(backend="gvisor", memory_mb=256, client=red)
        with pytest.raises(QuotaExceeded):
            restored.run("true")  # an automatic resume counts as a start
        third.terminate()
        assert restored.run("true").exit_code == 0

        # Removing the team is refused while it has sandboxes; revoked and expired keys stop working.
        with pytest.raises(Conflict, match="has sandboxes"):
            teams.remove_team("red", client=owner)
        short = new_key(served, "red", "--expires", "1")
        with Client(url=url, token=short) as expiring:
            wait_until(lambda: key_refused(expiring), timeout=30)
        red_id = next(k.id for k in teams.list_keys(client=owner, team="red") if k.scopes == ["read", "write", "exec"])
        assert cli(served, OWNER_TOKEN, "key", "revoke", red_id).returncode == 0
        with pytest.raises(Unauthorized):
            Sandbox.list(client=red)
        listed = json.loads(cli(served, OWNER_TOKEN, "key", "ls", "--json").stdout)
        assert not any("key" in k or "secret" in json.dumps(k) for k in listed)  # only hashes are kept
        for s in (sbx, restored):
            Sandbox.connect(s.id, client=owner).terminate()
        Sandbox.delete_checkpoint(checkpoint.id, client=owner)
        Volume("red-data", owner).delete()
        teams.remove_team("red", client=owner)
        with pytest.raises(Unauthorized):
            Sandbox.list(client=reader)  # a removed team's keys are revoked with it
        with pytest.raises(Conflict, match="never used again"):
            teams.create_team("red", client=owner)  # its usage and events stay its own
    bad = httpx.get(f"{url}/v1/sandboxes", headers={"authorization": "Bearer sk_stasis_aaaaaaaaaaaa_" + "0" * 48})
    assert bad.status_code == 401


def key_refused(client: Client) -> bool:
    """Whether the client's key is refused now (revoked, expired)."""
    try:
        Sandbox.list(client=client)
    except Unauthorized:
        return True
    return False


def test_the_unix_socket_is_the_owners(served: Daemon) -> None:
    with Client(url=served.url, token=OWNER_TOKEN) as owner:  # type: ignore[attr-defined]
        teams.create_team("green", client=owner)
    assert os.stat(served.paths.socket).st_mode & 0o777 == 0o600
    with served.client() as local:  # no token: the socket's mode is the guard
        assert teams.whoami(client=local)["team"] is None
        assert [t.name for t in teams.list_teams(client=local)] == ["green"]
        made = teams.create_key("green", ["read"], client=local)
    with Client(served.paths, token=made.key) as as_green:  # a key sent over the socket acts as its team there
        assert teams.whoami(client=as_green)["team"] == "green"
        with served.client() as local:
            teams.revoke_key(made.id, client=local)
        with pytest.raises(Unauthorized):  # and once it stops working it is refused, never taken for the owner
            teams.whoami(client=as_green)


def test_usage_adds_up_survives_a_kill_and_the_audit_log_says_who_did_what(served: Daemon) -> None:
    url = served.url  # type: ignore[attr-defined]
    assert cli(served, OWNER_TOKEN, "team", "create", "green").returncode == 0
    key = new_key(served, "green")
    with Client(url=url, token=key) as green, Client(url=url, token=OWNER_TOKEN) as owner:
        clock = {"created": [time.time()]}
        sbx = Sandbox.create(backend="gvisor", cpus=2, memory_mb=512, client=green)
        clock["created"].append(time.time())
        assert sbx.run(BURN).exit_code == 0  # busy for BURN_SECONDS of CPU
        clock["suspended"] = [time.time()]
        sbx.suspend()
        clock["suspended"].append(time.time())
        time.sleep(2)  # suspended for a while
        clock["resumed"] = [time.time()]
        sbx.resume()
        clock["resumed"].append(time.time())
        assert sbx.run(BURN).exit_code == 0  # and again, in its next run on the host
        clock["ended"] = [time.time()]
        sbx.terminate()
        clock["ended"].append(time.time())
        report = teams.usage(client=green, since=clock["created"][0] - 60)
        (row,) = [r for r in report.sandboxes if r.sandbox_id == sbx.id]
        # Between what the test's own clock allows: at least the time between calls, at most the time around them.
        ran = (clock["suspended"][0] - clock["created"][1], clock["suspended"][1] - clock["created"][0])
        ran_again = (clock["ended"][0] - clock["resumed"][1], clock["ended"][1] - clock["resumed"][0])
        assert ran[0] + ran_again[0] <= row.running_seconds <= ran[1] + ran_again[1]
        assert clock["resumed"][0] - clock["suspended"][1] <= row.suspended_seconds
        assert row.suspended_seconds <= clock["resumed"][1] - clock["suspended"][0]
        assert row.cpu_allocated_seconds == pytest.approx(2 * row.running_seconds)
        # Burnt, as the host counted it: both runs' (the first read as it was suspended). At least most of what
        # the guest counted (gVisor's clock for a task may run on while the host has it waiting), and never more
        # than every core of the host for as long as the sandbox was up.
        assert 2 * BURN_SECONDS * 0.6 <= row.cpu_seconds <= (os.cpu_count() or 1) * (row.running_seconds + 1)
        assert row.memory_gib_seconds == pytest.approx(0.5 * row.running_seconds)
        assert [t.team for t in report.teams] == ["green"]  # a key sees its own team's
        exported = cli(served, key, "usage", "--csv", "--since", "1h").stdout.splitlines()
        assert exported[0].startswith("sandbox_id,") and any(line.startswith(sbx.id) for line in exported[1:])

        raw = httpx.Client(base_url=url, headers={"authorization": f"Bearer {key}"})
        assert raw.post("/v1/pools", json={"name": "stolen", "size": 1}).status_code == 403
        with pytest.raises(Forbidden):
            teams.audit(client=green)  # the log is the owner's
        entries = teams.audit(client=owner)
        mine = [e for e in entries if e["team"] == "green"]
        assert {(e["method"], e["path"], e["status"]) for e in mine} >= {
            ("POST", "/v1/sandboxes", 201), ("POST", f"/v1/sandboxes/{sbx.id}/suspend", 200),
            ("POST", "/v1/pools", 403), ("DELETE", f"/v1/sandboxes/{sbx.id}", 200)}  # fmt: skip
        assert all(e["key_id"] and e["client"].startswith("127.0.0.1:") for e in mine)
        assert any(e["team"] is None and e["path"] == "/v1/teams" and e["status"] == 201 for e in entries)

    served.kill()  # nothing accounted or logged is lost
    served.start("--tcp", url.removeprefix("http://"))
    with Client(url=url, token=OWNER_TOKEN) as owner:
        again = teams.usage(client=owner, team="green", since=report.since)
        (same,) = [r for r in again.sandboxes if r.sandbox_id == sbx.id]
        assert same.running_seconds == pytest.approx(row.running_seconds)
        assert same.cpu_seconds == pytest.approx(row.cpu_seconds)
        assert len(teams.audit(client=owner)) >= len(entries)


def test_disk_lifetime_and_checkpoint_quotas_hold(served: Daemon) -> None:
    url = served.url  # type: ignore[attr-defined]
    made = cli(served, OWNER_TOKEN, "team", "create", "bounded", "--max-disk-mb", "1024", "--max-lifetime-secs",
               "3600", "--max-checkpoint-mb", "1")  # fmt: skip
    assert made.returncode == 0, made.stderr
    with Client(url=url, token=new_key(served, "bounded")) as bounded:
        sbx = Sandbox.create(backend="gvisor", memory_mb=256, disk_mb=768, lifetime_secs=7200, client=bounded)
        assert sbx.info().spec.lifetime_secs == 3600  # at most the team's longest lifetime
        sbx.suspend()
        with pytest.raises(QuotaExceeded, match="768 MiB of disk in use of its 1024"):
            Sandbox.create(backend="gvisor", memory_mb=256, disk_mb=768, client=bounded)  # suspended disks count
        sbx.resume()
        sbx.run("head -c 3M /dev/urandom > /root/blob")
        assert sbx.checkpoint(CheckpointType.FILESYSTEM).size_bytes > 1 << 20  # the first fits: nothing was stored
        with pytest.raises(QuotaExceeded, match="checkpoints take"):
            sbx.checkpoint(CheckpointType.FILESYSTEM)
        sbx.terminate()
        for checkpoint in Sandbox.list_checkpoints(client=bounded):
            Sandbox.delete_checkpoint(checkpoint.id, client=bounded)
        # volumes share one store with every team: a key's volume always has a limit, and the limits count
        data = Volume.create("bounded-data", max_size_mb=512, client=bounded)
        with pytest.raises(QuotaExceeded, match="512 MiB of disk in use of its 1024"):
            Volume.create("bounded-more", client=bounded)  # no limit given: a team's default, 1024 MiB, passes it
        with pytest.raises(InvalidRequest, match="keeps a size limit"):
            data.set_max_size(None)
        with pytest.raises(QuotaExceeded):
            data.set_max_size(2048)
        with pytest.raises(QuotaExceeded, match="MiB of disk in use"):
            Sandbox.create(backend="gvisor", memory_mb=256, disk_mb=768, client=bounded)  # volumes count for disks
        assert Volume.create("bounded-small", max_size_mb=256, client=bounded).info().max_size_mb == 256
        for name in ("bounded-data", "bounded-small"):
            Volume.get(name, client=bounded).delete()


def test_ssh_with_a_teams_key_reaches_its_own_sandbox_alone(served: Daemon, tmp_path: Path) -> None:
    url = served.url  # type: ignore[attr-defined]
    with Client(url=url, token=OWNER_TOKEN) as owner:
        keys = {}
        for team in ("sshred", "sshblue"):
            teams.create_team(team, client=owner)
            keys[team] = teams.create_key(team, ["read", "write", "exec"], client=owner).key
    user = ssh_client(served, tmp_path)
    with Client(url=url, token=keys["sshred"]) as red:
        sbx = Sandbox.create("ssh-red", backend="gvisor", memory_mb=256, client=red)
        try:
            red_env = {**user.env, "STASIS_URL": url, "STASIS_TOKEN": keys["sshred"]}
            as_red = SshClient(red_env, user.config, user.home)
            ran = as_red.ssh("stasis-ssh-red", "echo", "red-over-ssh")
            assert ran.returncode == 0 and ran.stdout == "red-over-ssh\n", ran.stderr
            as_blue = SshClient({**red_env, "STASIS_TOKEN": keys["sshblue"]}, user.config, user.home)
            said = "no sandbox named or with id 'ssh-red'"
            for refused in (as_blue.ssh("stasis-ssh-red", "true"), as_blue.run(str(STASIS), "ssh", "ssh-red")):
                assert refused.returncode != 0 and said in refused.stderr, refused.stderr
            for path in (f"/v1/sandboxes/{sbx.id}/ssh/host-key", f"/v1/sandboxes/{sbx.id}/ssh"):
                answer = httpx.get(f"{url}{path}", headers={"authorization": f"Bearer {keys['sshblue']}"})
                assert answer.status_code == 404, path
        finally:
            sbx.terminate()


def test_a_revoked_key_takes_the_keys_it_made_and_their_open_terminals_with_it(served: Daemon) -> None:
    url = served.url  # type: ignore[attr-defined]
    with Client(url=url, token=OWNER_TOKEN) as owner:
        teams.create_team("gold", client=owner)
        admin = teams.create_key("gold", ["read", "write", "exec", "admin"], client=owner)
        with Client(url=url, token=admin.key) as by_admin:
            deputy = teams.create_key("gold", ["read", "write", "exec", "admin"], client=by_admin)
        with Client(url=url, token=deputy.key) as by_deputy:
            worker = teams.create_key("gold", ["read", "write", "exec"], client=by_deputy)
        other = teams.create_key("gold", ["read", "exec"], client=owner)  # the owner's own: not admin's lineage
        made = {k.id: k.made_by for k in teams.list_keys(client=owner, team="gold")}
        assert made == {admin.id: None, deputy.id: admin.id, worker.id: deputy.id, other.id: None}  # `key ls`
        sbx = Sandbox.create(backend="gvisor", memory_mb=256, client=Client(url=url, token=worker.key))
        path = f"/v1/sandboxes/{sbx.id}/pty?cmd=" + json.dumps(["cat"])
        ws_url = url.replace("http://", "ws://") + path.replace(" ", "%20")
        headers = {"authorization": f"Bearer {worker.key}"}
        with ws_connect(ws_url, additional_headers=headers) as terminal, \
                ws_connect(ws_url, additional_headers={"authorization": f"Bearer {other.key}"}) as kept:  # fmt: skip
            for ws in (terminal, kept):
                ws.send(b"typed\r")
                seen = b""
                while b"typed" not in seen:
                    message = ws.recv(timeout=60)
                    seen += message if isinstance(message, bytes) else b""
            teams.revoke_key(admin.id, client=owner)
            with pytest.raises(ConnectionClosed) as closed:  # the worker's open terminal ends with its maker's maker
                while True:
                    terminal.recv(timeout=60)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401, closed.value
            kept.send(b"still\r")  # a key of another lineage keeps its terminal
            seen = b""
            while b"still" not in seen:
                message = kept.recv(timeout=60)
                seen += message if isinstance(message, bytes) else b""
        for key in (admin, deputy, worker):
            assert httpx.get(f"{url}/v1/sandboxes", headers={"authorization": f"Bearer {key.key}"}).status_code == 401
        assert all(k.revoked_at for k in teams.list_keys(client=owner, team="gold") if k.id != other.id)
        Sandbox.connect(sbx.id, client=owner).terminate()  # its maker's key is gone: the owner removes it
