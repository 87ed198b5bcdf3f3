"""A fleet on a real Ray cluster on this machine (`stasis fleet local`: a head and 2 nodes, each its own raylet
with a host agent and a daemon), reached through its front door as one daemon: creates spread over the nodes,
names unique fleet-wide, every sandbox with its node, Ray's ports out of any sandbox's reach, and nothing left
once it stops."""

from __future__ import annotations

import collections
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from stasis import (
    Client,
    NameTaken,
    NetworkPolicy,
    Pool,
    QuotaExceeded,
    Sandbox,
    Secret,
    StasisError,
    Unauthorized,
    mountns,
)
from stasis.paths import Paths
from stasis.sdk import team as teams
from tests.conftest import IMAGE_DIR, TEST_ROOT, require_default_image, wait_until
from tests.daemon.test_teams import key_refused

STARTUP = 300.0  # seconds: a cluster, two raylets and two daemons on a loaded 2-core machine


@dataclass
class Fleet:
    process: subprocess.Popen[str]
    home: Path
    marker: str
    url: str
    token: str
    ray_address: str
    ray_token_path: str

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "STASIS_FLEET": self.url, "STASIS_TOKEN": self.token}

    def client(self) -> Client:
        return Client(url=self.url, token=self.token)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stasis", *args], env=self.env, capture_output=True, text=True,
                              timeout=300, check=False)  # fmt: skip


def processes_with(marker: str) -> list[int]:
    """Every process whose environment carries ``marker``: all the fleet started (Ray's too) inherits it."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def listening(pids: list[int]) -> list[str]:
    """The local addresses the processes ``pids`` listen on (TCP, IPv4 and IPv6)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                if (target := os.readlink(fd)).startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    addresses = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                address, port = fields[1].split(":")
                addresses.append(f"{_ip(address)}:{int(port, 16)}")
    return addresses


def _ip(hex_address: str) -> str:
    """/proc/net/tcp's address (host-order 32-bit words in hex) as text; an IPv4-mapped one as its IPv4."""
    raw = b"".join(bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, len(hex_address), 8))
    address = ipaddress.ip_address(raw)
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    require_default_image()
    home = TEST_ROOT / f"fleet-{uuid.uuid4().hex[:6]}"
    home.mkdir(parents=True)
    os.chmod(home, 0o755)  # a home that exists, open to others: the fleet makes it its own (0700)
    marker = f"STASIS_TEST_FLEET={uuid.uuid4().hex}"
    env = {**os.environ, "STASIS_IMAGE_DIR": str(IMAGE_DIR), marker.split("=")[0]: marker.split("=")[1]}
    env.pop("STASIS_FLEET", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "stasis", "fleet", "local", "--nodes", "2", "--home", str(home)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    exports: dict[str, str] = {}
    assert process.stdout is not None
    for line in process.stdout:
        if match := re.match(r"export (\w+)=(\S+)", line):
            exports[match.group(1)] = match.group(2)
        if {"STASIS_FLEET", "STASIS_TOKEN", "RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH"} <= set(exports):
            break
    assert process.poll() is None, process.stderr.read() if process.stderr else ""
    up = Fleet(process, home, marker, exports["STASIS_FLEET"], exports["STASIS_TOKEN"], exports["RAY_ADDRESS"],
               exports["RAY_AUTH_TOKEN_PATH"])  # fmt: skip
    try:
        yield up
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STARTUP)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise


def test_creates_spread_over_the_nodes_and_every_name_is_the_fleets(fleet: Fleet) -> None:
    assert os.stat(fleet.home).st_mode & 0o777 == 0o700  # Ray's 0777 socket directories live in it
    host_wide = Path(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp") / "ray" / "ray_current_cluster"
    assert not host_wide.exists() or fleet.ray_address not in host_wide.read_text()  # a plain ray.init() joins not
    client = fleet.client()
    made = [Sandbox.create(f"spread-{n}", memory_mb=256, backend="gvisor", client=client) for n in range(4)]
    try:
        nodes = {sbx.info().node for sbx in made}
        assert nodes == {"n1", "n2"}
        assert made[0].run("echo $((6 * 7))").stdout == "42\n"
        with pytest.raises(NameTaken, match=r"spread-0.*already exists in the fleet \(on node n[12]\)"):
            Sandbox.create("spread-0", memory_mb=256, backend="gvisor", client=client)
        listed = fleet.cli("ls")
        assert listed.returncode == 0, listed.stderr
        assert "NODE" in listed.stdout.splitlines()[0]
        assert {line.split()[-1] for line in listed.stdout.splitlines()[1:] if "spread-" in line} == {"n1", "n2"}
        info = json.loads(fleet.cli("info", "spread-1", "--json").stdout)
        assert info["node"] == made[1].info().node
        pinned = httpx.post(f"{fleet.url}/v1/sandboxes", json={"name": "on-n1", "memory_mb": 256, "node": "n1"},
                            headers={"authorization": f"Bearer {fleet.token}"}, timeout=300)  # fmt: skip
        assert pinned.status_code == 201 and pinned.json()["node"] == "n1"
        made.append(Sandbox.connect("on-n1", client=client))
        nodes_listed = json.loads(fleet.cli("fleet", "nodes", "--json").stdout)
        assert {(n["name"], n["state"]) for n in nodes_listed} == {("n1", "up"), ("n2", "up")}
        assert sum(n["sandboxes"] for n in nodes_listed) == 5
    finally:
        for sbx in made:
            sbx.terminate()


def test_a_sandbox_keeps_its_processes_through_the_door(fleet: Fleet) -> None:
    sbx = Sandbox.create("keeper", memory_mb=256, backend="gvisor", client=fleet.client())
    try:
        sbx.start_process(["sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done"])
        wait_until(lambda: sbx.run("cat /tmp/count").stdout.strip().isdigit())
        sbx.suspend()
        assert sbx.info().status.value == "suspended"
        before = int(sbx.run("cat /tmp/count").stdout)  # a command resumes it, on its node
        wait_until(lambda: int(sbx.run("cat /tmp/count").stdout) > before)
        sbx.write_file("/root/note", b"through the door")
        assert sbx.read_file("/root/note") == b"through the door"
    finally:
        sbx.terminate()


def test_a_move_keeps_a_counting_process_and_its_memory(fleet: Fleet) -> None:
    """`sbx.move()` suspends it on its node, hands it over through the fleet's store and resumes it on the other:
    the same id and name, a counter still counting from where it was, a value held only in memory still there."""
    sbx = Sandbox.create("mover", memory_mb=256, backend="gvisor", client=fleet.client())
    try:
        start = sbx.info().node
        sbx.start_process(["python3", "-c", COUNTER])
        wait_until(lambda: sbx.run("test -s /tmp/count").exit_code == 0)
        kept = sbx.read_file("/tmp/kept").decode()
        before = int(sbx.run("cat /tmp/count").stdout.split()[0])
        moved = sbx.move()
        assert moved.node != start and moved.node in ("n1", "n2") and moved.id == sbx.id
        wait_until(lambda: int(sbx.run("cat /tmp/count").stdout.split()[0]) > before + 5)
        _, still = sbx.run("cat /tmp/count").stdout.split()
        assert still == kept  # written by the process from its memory after the move
        assert sbx.info().node == moved.node
        listed = fleet.cli("move", "mover", start or "n1")
        assert listed.returncode == 0 and f"node {start}" in listed.stdout, listed.stderr
    finally:
        sbx.terminate()


def test_a_16_way_fork_spreads_over_both_nodes_and_its_children_diverge(fleet: Fleet) -> None:
    """Rollouts: a live fork of a sandbox into 16, over both nodes (the checkpoint through the store once per
    node), each child going on from the same memory, then on its own; N more from a named checkpoint; all of
    them removed in one call."""
    client = fleet.client()
    parent = Sandbox.create("rollout", memory_mb=256, backend="gvisor", client=client)
    children: list[Sandbox] = []
    try:
        parent.run("python3 -c 'import secrets; print(secrets.token_hex(8))' > /root/seed")
        seed = parent.read_file("/root/seed")
        children = parent.copy(times=16)
        spread = collections.Counter(c.info().node for c in children)  # by room: the parent's node counts it too
        assert set(spread) == {"n1", "n2"} and abs(spread["n1"] - spread["n2"]) <= 2, spread
        assert {c.read_file("/root/seed") for c in children} == {seed}  # the same instant
        drawn = {c.run("head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \\n'").stdout for c in children}
        assert len(drawn) == 16  # then each its own
        parent.checkpoint("memory", name="rollout-start")
        more = Sandbox.fork("rollout-start", n=4, client=client)
        children += more
        assert {c.info().node for c in more} == {"n1", "n2"}
        assert {c.read_file("/root/seed") for c in more} == {seed}
        removed = Sandbox.terminate_all(children)  # one call, each node removing its own
        assert sorted(removed) == sorted(c.id for c in children)
        assert {s.id for s in Sandbox.list(client=client)}.isdisjoint(removed)
        children = []
    finally:
        for sbx in [*children, parent]:
            sbx.terminate()


def test_no_sandbox_reaches_rays_ports(fleet: Fleet) -> None:
    """Ray's address is an authority: the local fleet binds every Ray port to loopback (token authentication on),
    and a sandbox with network, allowed everywhere, reaches none of them."""
    ray_listens = listening(processes_with(fleet.marker))
    assert ray_listens, "the fleet's processes listen somewhere"
    assert [a for a in ray_listens if not ipaddress.ip_address(a.rsplit(":", 1)[0]).is_loopback] == []
    gcs_port = int(fleet.ray_address.rsplit(":", 1)[1])
    sbx = Sandbox.create("prober", memory_mb=256, backend="gvisor", network=NetworkPolicy(allow_out=["*"]),
                         client=fleet.client())  # fmt: skip
    try:
        for host in ("127.0.0.1", "10.200.0.1"):  # its own loopback; its gateway, the host's side of its network
            probe = sbx.run(["python3", "-c", "import socket,sys; socket.create_connection((sys.argv[1], "
                             "int(sys.argv[2])), timeout=10); print('open')", host, str(gcs_port)])  # fmt: skip
            assert "open" not in probe.stdout and probe.exit_code != 0, (host, probe)
    finally:
        sbx.terminate()


def test_a_terminal_through_the_door(fleet: Fleet) -> None:
    """WebSockets (a terminal here; SSH and port-forward the same way) are relayed to the sandbox's node, frame by
    frame, each checked for the token before anything else."""
    sbx = Sandbox.create("terminal", memory_mb=256, backend="gvisor", client=fleet.client())
    base = fleet.url.replace("http://", "ws://") + f"/v1/sandboxes/{sbx.id}/pty?cols=80&rows=24&cmd="
    try:
        with pytest.raises(InvalidStatus, match="403"):  # refused before the upgrade, as the daemon refuses it
            ws_connect(base + "%5B%22cat%22%5D", additional_headers={"authorization": "Bearer nope"})
        headers = {"authorization": f"Bearer {fleet.token}"}
        with ws_connect(base + "%5B%22cat%22%5D", additional_headers=headers) as ws:
            ws.send(b"through the door\r")
            seen = b""
            while b"through the door" not in seen:
                message = ws.recv(timeout=60)
                seen += message if isinstance(message, bytes) else b""
    finally:
        sbx.terminate()


def test_a_secret_is_the_fleets(fleet: Fleet) -> None:
    """Added, rotated and removed through the door on every node (a sandbox may run, or move, on any)."""
    Secret.add("fleet-key", "s3cr3t-value", hosts=["api.example.test"], client=fleet.client())
    nodes = json.loads(fleet.cli("fleet", "nodes", "--json").stdout)
    try:
        for node in nodes:  # straight to each node's daemon
            listed = Secret.list(client=Client(url=node["url"], token=fleet.token))
            assert [s.name for s in listed] == ["fleet-key"] and listed[0].hosts == ["api.example.test"]
        assert [s.name for s in Secret.list(client=fleet.client())] == ["fleet-key"]
    finally:
        Secret.remove("fleet-key", client=fleet.client())
    for node in nodes:
        assert Secret.list(client=Client(url=node["url"], token=fleet.token)) == []


def test_teams_keys_quotas_and_usage_are_the_fleets(fleet: Fleet) -> None:
    """A team and its keys made through the door work on every node; a key sees its team's sandboxes on any node and
    nothing of another team's; a quota counts the team's sandboxes on every node; usage sums every node's."""
    owner, nodes = fleet.client(), json.loads(fleet.cli("fleet", "nodes", "--json").stdout)
    teams.create_team("fleetred", client=owner, max_running=2)
    teams.create_team("fleetblue", client=owner)
    red_key = teams.create_key("fleetred", ["read", "write", "exec"], client=owner).key
    blue_key = teams.create_key("fleetblue", ["read", "write", "exec"], client=owner).key
    for node in nodes:  # the very same key, straight to each node's daemon
        assert teams.whoami(client=Client(url=node["url"], token=red_key))["team"] == "fleetred"
    admin = teams.create_key("fleetblue", ["read", "exec", "admin"], client=owner)
    with Client(url=fleet.url, token=admin.key) as by_admin:  # a deputy made through the door, on every node
        deputy = teams.create_key("fleetblue", ["read"], client=by_admin)
    teams.revoke_key(admin.id, client=owner)
    for node in nodes:  # its maker revoked through the door: the deputy ends on every node, not just one
        with pytest.raises(Unauthorized), Client(url=node["url"], token=deputy.key) as gone:
            teams.whoami(client=gone)
    as_red = {"authorization": f"Bearer {red_key}"}
    made = []
    try:
        for node in ("n1", "n2"):  # one on each node: neither node alone sees two
            answer = httpx.post(f"{fleet.url}/v1/sandboxes", json={"name": f"red-{node}", "memory_mb": 256,
                                "backend": "gvisor", "node": node}, headers=as_red, timeout=300)  # fmt: skip
            assert answer.status_code == 201 and answer.json()["node"] == node, answer.text
            made.append(answer.json()["id"])
        with Client(url=fleet.url, token=red_key) as red, Client(url=fleet.url, token=blue_key) as blue:
            assert sorted(s.id for s in Sandbox.list(client=red)) == sorted(made)
            with pytest.raises(QuotaExceeded, match="2 running sandboxes in use of its 2 across the fleet"):
                Sandbox.create(memory_mb=256, backend="gvisor", client=red)
            assert Sandbox.connect("red-n2", client=red).run("echo red").stdout == "red\n"

            # Blue finds nothing of red's through any route of the door, HTTP or WebSocket.
            assert Sandbox.list(client=blue) == []
            raw = httpx.Client(base_url=fleet.url, headers={"authorization": f"Bearer {blue_key}"}, timeout=300)
            theirs, nobodys = raw.get(f"/v1/sandboxes/{made[0]}"), raw.get("/v1/sandboxes/sb-000000000000")
            assert theirs.status_code == nobodys.status_code == 404  # the very same bytes: nothing tells them apart
            assert theirs.content.replace(made[0].encode(), b"X") == nobodys.content.replace(b"sb-000000000000", b"X")
            for path, body in (("exec", {"cmd": ["true"]}), ("fork", {"times": 1}), ("move", {})):
                assert raw.post(f"/v1/sandboxes/{made[1]}/{path}", json=body).status_code == 404, path
            removed = raw.post("/v1/sandboxes/remove", json={"refs": [made[0]]}).json()
            assert removed["removed"] == [] and made[0] in removed["failed"]
            for path in ("/v1/fleet/nodes", "/v1/pools"):  # the fleet owner's
                assert raw.get(path).status_code == 403, path
            pty = f"{fleet.url.replace('http://', 'ws://')}/v1/sandboxes/{made[0]}/pty?cols=80&rows=24&cmd=%5B%22cat%22%5D"
            with pytest.raises(InvalidStatus):
                ws_connect(pty, additional_headers={"authorization": f"Bearer {blue_key}"})
            with ws_connect(pty, additional_headers=as_red) as ws:  # red's own terminal, through the door
                ws.send(b"red through the door\r")
                seen = b""
                while b"red through the door" not in seen:
                    message = ws.recv(timeout=60)
                    seen += message if isinstance(message, bytes) else b""

            # A team's secrets are on every node, its own.
            Secret.add("RED_FLEET", "red-value", hosts=["api.example.test"], client=red)
            for node in nodes:
                assert [s.name for s in Secret.list(client=Client(url=node["url"], token=red_key))] == ["RED_FLEET"]
            assert Secret.list(client=blue) == []
            Secret.remove("RED_FLEET", client=red)

            # A key forks, moves and removes its own through the door; the children count against its quota.
            teams.set_quotas("fleetred", client=owner, max_running=4)
            forked = httpx.post(f"{fleet.url}/v1/sandboxes/{made[0]}/fork", json={"times": 2}, headers=as_red,
                                timeout=300)  # fmt: skip
            assert forked.status_code == 201, forked.text
            children = [c["id"] for c in forked.json()]
            assert {Sandbox.connect(c, client=red).info().spec.team for c in children} == {"fleetred"}
            more = httpx.post(f"{fleet.url}/v1/sandboxes/{made[0]}/fork", json={"times": 1}, headers=as_red,
                              timeout=300)  # fmt: skip
            assert more.status_code == 429 and "4 running sandboxes in use of its 4 across the fleet" in more.text
            was_on = Sandbox.connect(made[0], client=red).info().node
            assert Sandbox.connect(made[0], client=red).move().node != was_on
            gone = httpx.post(f"{fleet.url}/v1/sandboxes/remove", json={"refs": children}, headers=as_red, timeout=300)
            assert sorted(gone.json()["removed"]) == sorted(children), gone.text

            report = teams.usage(client=red, since=0)
            assert {r.sandbox_id for r in report.sandboxes} == {*made, *children}
            assert [(t.team, t.sandboxes) for t in report.teams] == [("fleetred", 4)]
            assert report.teams[0].running_seconds > 0

            teams.set_quotas("fleetred", client=owner, max_running=2, max_cpus=4)  # on every node
            Sandbox.connect(made.pop(), client=red).terminate()  # one running now: the CPUs decide
            as_text = httpx.post(
                f"{fleet.url}/v1/sandboxes", json={"cpus": "8", "memory_mb": "256"}, headers=as_red, timeout=300
            )  # numbers sent as text are counted as the node reads them
            assert as_text.status_code == 429 and "CPUs in use of its 4 across the fleet" in as_text.text, as_text.text

            red_key_id = next(k.id for k in teams.list_keys(client=owner, team="fleetred"))
            teams.revoke_key(red_key_id, client=owner)
            for node in nodes:  # revoked on every node
                with pytest.raises(Unauthorized):
                    teams.whoami(client=Client(url=node["url"], token=red_key))
            wait_until(lambda: key_refused(red), timeout=60)  # and at the door, once its short memory of the key ends
    finally:
        for sandbox_id in made:
            Sandbox.connect(sandbox_id, client=owner).terminate()
    for team in ("fleetred", "fleetblue"):
        teams.remove_team(team, client=owner)


def test_the_door_wants_the_token_and_says_what_it_does_not_route(fleet: Fleet) -> None:
    assert httpx.get(f"{fleet.url}/v1/sandboxes", timeout=60).status_code == 401
    headers = {"authorization": f"Bearer {fleet.token}"}
    answer = httpx.post(f"{fleet.url}/v1/remote/push", json={}, headers=headers, timeout=60)
    assert answer.status_code == 501 and "not served through the fleet yet" in answer.json()["message"]
    for sneaky in ("/v1/sandboxes/x/%2e%2e/%2e%2e/secrets", "/v1/sandboxes/x/..%2F..%2Fremote%2Fpush"):
        answer = httpx.post(fleet.url + sneaky, json={}, headers=headers, timeout=60)  # never another node endpoint
        assert answer.status_code == 400 and "is not a sandbox's or checkpoint's name or id" in answer.json()["message"]
    assert httpx.get(f"{fleet.url}/v1/sandboxes", headers={"authorization": fleet.token}, timeout=60).status_code == 401


def test_the_console_through_the_door_shows_and_drives_every_nodes_sandboxes(fleet: Fleet) -> None:
    """The web console at the door's /ui in a real browser: one login (the fleet's token), the live list with the
    sandboxes of both nodes, a terminal in a sandbox of n2, a suspend from the list on n1; nothing without a
    login, before any node is asked."""
    from playwright.sync_api import expect, sync_playwright

    from tests.console.conftest import CHROMIUM
    from tests.console.test_console import echo_in_terminal

    assert httpx.get(f"{fleet.url}/ui/sandboxes/anything", timeout=60).headers["location"] == "/ui/login"
    assert httpx.get(f"{fleet.url}/ui/events", timeout=60).status_code == 401
    odd = [(b"cookie", "stasis_console=\u00e9t\u00e9".encode())]  # a cookie a sandbox's port could set: no 500
    assert httpx.get(f"{fleet.url}/ui/", headers=odd, timeout=60).status_code == 303
    login = fleet.client().request("POST", "/v1/console/tokens").json()["token"]  # what `stasis ui` opens with
    assert login != fleet.token  # a console login only, never the fleet's own token in a browser's history
    client = fleet.client()
    boxes = {node: Sandbox.create(f"ui-{node}", memory_mb=256, backend="gvisor", node=node, client=client)
             for node in ("n1", "n2")}  # fmt: skip
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_context(base_url=fleet.url).new_page()
            page.on("dialog", lambda dialog: dialog.accept())
            page.goto("/ui/")
            page.fill("#token", login)
            page.click("button[type=submit]")
            for node in boxes:
                expect(page.locator("#sandboxes tr", has_text=f"ui-{node}")).to_be_visible(timeout=30_000)
            page.goto(f"/ui/sandboxes/{boxes['n2'].id}")
            echo_in_terminal(page, "from-n2")
            page.goto("/ui/")
            row = page.locator("#sandboxes tr", has_text="ui-n1")
            row.locator("button[data-action=suspend]").click()
            expect(row.locator(".status")).to_have_text("suspended", timeout=60_000)
            browser.close()
        assert boxes["n1"].info().status.value == "suspended"
    finally:
        for sbx in boxes.values():
            sbx.terminate()


def test_a_pool_is_made_on_every_node_and_a_create_anywhere_claims_from_it(fleet: Fleet) -> None:
    """A pool through the door keeps `size` members started on each node; a create placed on either node takes
    one of that node's instead of booting; removing the pool removes its waiting members everywhere."""
    client = fleet.client()
    made = Pool.create("warm", size=1, backend="gvisor", memory_mb=256, client=client)
    claimed: list[Sandbox] = []
    try:
        assert made.spec.size == 2  # one per node
        ready = Pool.wait_ready("warm", timeout=240, client=client)
        assert ready.ready == 2 and len(ready.members) == 2
        for node in ("n1", "n2"):
            sbx = Sandbox.create(backend="gvisor", memory_mb=256, node=node, client=client)
            claimed.append(sbx)
            info = sbx.info()
            assert (info.from_pool, info.node, info.id in ready.members) == ("warm", node, True)
    finally:
        removed = Pool.remove("warm", client=client)
        for sbx in claimed:
            sbx.terminate()
    assert removed.name == "warm" and [p.name for p in Pool.list(client=client)] == []
    every = client.request("GET", "/v1/sandboxes", params={"all": "true"}).json()
    assert [s["id"] for s in every if s.get("pool") == "warm" and s["status"] != "terminated"] == []  # none waits


def test_rays_sandbox_api_runs_on_stasis_through_the_fleet(fleet: Fleet) -> None:
    """Ray's released sandbox backend interface, served by stasis sandboxes on the fleet; plus what it lacks:
    a pause that keeps memory and processes, and a checkpoint restored as a new sandbox going on from it."""
    from ray.experimental.sandbox import SandboxStatus
    from ray.experimental.sandbox.config import SandboxConfig

    from stasis.integrations.ray_sandbox import StasisSandboxBackend

    backend = StasisSandboxBackend(fleet.client())
    config = SandboxConfig(image="default", cpu=1, memory="256Mi", env={"GREETING": "hello"}, workdir="/tmp")
    sandbox_id = backend.create_sandbox(config)
    restored = None
    try:
        assert backend.get_status(sandbox_id) == SandboxStatus.RUNNING
        ran = backend.exec_command(sandbox_id, "echo $GREETING from $(pwd)")
        assert (ran.exit_code, ran.stdout) == (0, "hello from /tmp\n")
        assert backend.exec_command(sandbox_id, ["sh", "-c", "exit 3"]).exit_code == 3
        backend.write_file(sandbox_id, "/tmp/notes", "one\n")
        backend.write_file(sandbox_id, "/tmp/notes", b"two\n", append=True)
        assert backend.read_file(sandbox_id, "/tmp/notes") == b"one\ntwo\n"
        backend.exec_command(
            sandbox_id, "python3 -c 'import time; time.sleep(3600)' > /dev/null 2>&1 & echo $! > /tmp/pid"
        )
        backend.pause_sandbox(sandbox_id)
        assert backend.get_status(sandbox_id) == SandboxStatus.RUNNING  # paused, still alive: a command resumes it
        pid = backend.read_file(sandbox_id, "/tmp/pid").decode().strip()
        assert backend.exec_command(sandbox_id, f"kill -0 {pid}").exit_code == 0
        restored = backend.restore_sandbox(backend.checkpoint_sandbox(sandbox_id))
        assert backend.exec_command(restored, f"kill -0 {pid} && cat /tmp/notes").stdout == "one\ntwo\n"
    finally:
        backend.delete_sandbox(sandbox_id)
        if restored is not None:
            backend.delete_sandbox(restored)
    assert backend.get_status(sandbox_id) == SandboxStatus.TERMINATED


def e2b_face(fleet: Fleet) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """`stasis e2b serve --fleet URL`: the exports it prints, and its process."""
    env = {k: v for k, v in fleet.env.items() if k != "STASIS_FLEET"}  # --fleet says it
    served = subprocess.Popen(
        [sys.executable, "-m", "stasis", "e2b", "serve", "--fleet", fleet.url, "--listen", "127.0.0.1:0",
         "--backend", "gvisor", "--memory-mb", "256"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert served.stdout is not None
    exports: dict[str, str] = {}
    while len(exports) < 3:
        line = served.stdout.readline()
        assert line, served.stderr.read() if served.stderr else ""
        name, _, value = line.strip().removeprefix("export ").partition("=")
        exports[name] = value
    return served, exports


def test_the_e2b_sdk_through_the_fleets_face(fleet: Fleet) -> None:
    """E2B's own SDK, unchanged, against `stasis e2b serve --fleet`: its sandboxes placed over both nodes, each
    one's commands, files, pause and connect on whichever node holds it, one listing of them all, and a sandbox
    request without a credential refused before any node is asked."""
    from e2b import Sandbox as E2bSandbox

    served, exports = e2b_face(fleet)
    opts = {"api_key": exports["E2B_API_KEY"], "api_url": exports["E2B_API_URL"],
            "sandbox_url": exports["E2B_SANDBOX_URL"]}  # fmt: skip
    made: list[E2bSandbox] = []
    try:
        made = [E2bSandbox.create(timeout=900, metadata={"rollout": str(i)}, **opts) for i in range(4)]
        nodes = {s.sandbox_id: Sandbox.connect(s.sandbox_id, client=fleet.client()).info().node for s in made}
        assert set(nodes.values()) == {"n1", "n2"}, nodes
        for i, sbx in enumerate(made):
            assert sbx.commands.run(f"echo {i} $(whoami)").stdout == f"{i} user\n"
            sbx.files.write("/home/user/note", f"rollout {i}")
            assert sbx.files.read("/home/user/note") == f"rollout {i}"
            signed = sbx.download_url("/home/user/note")  # no header: the door finds the sandbox by its signature
            assert httpx.get(signed, timeout=60).text == f"rollout {i}"
        host_of = made[1].get_host(8000)
        assert host_of.startswith(f"8000-{made[1].sandbox_id}.localhost:")  # the door's own listener
        listed = {s.sandbox_id: s.metadata for s in E2bSandbox.list(query=None, **opts).next_items()}
        assert {sid: listed.get(sid) for sid in nodes} == {s.sandbox_id: s.get_info().metadata for s in made}
        assert sorted(listed[sid]["rollout"] for sid in nodes) == ["0", "1", "2", "3"]
        counting = made[0]
        counting.commands.run("sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done'",
                              background=True)  # fmt: skip
        wait_until(lambda: counting.commands.run("cat /tmp/n").stdout.strip() not in ("", "0"))
        counting.pause()
        again = E2bSandbox.connect(counting.sandbox_id, **opts)
        before = int(again.commands.run("cat /tmp/n").stdout)
        wait_until(lambda: int(again.commands.run("cat /tmp/n").stdout) > before)
        envd = f"{exports['E2B_SANDBOX_URL']}/process.Process/List"
        nobody, unknown = (
            httpx.post(envd, json={}, headers={"e2b-sandbox-id": ref, "content-type": "application/json"}, timeout=60)
            for ref in (counting.sandbox_id, "no-such-sandbox")
        )
        assert nobody.status_code == unknown.status_code == 401
        host, port = exports["E2B_SANDBOX_URL"].removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=60) as conn:  # a target that is a URL, not a path
            conn.sendall(f"GET http://127.0.0.1:9/x HTTP/1.1\r\nHost: {host}\r\nE2b-Sandbox-Id: "
                         f"{counting.sandbox_id}\r\nX-API-Key: {exports['E2B_API_KEY']}\r\n\r\n".encode())  # fmt: skip
            assert conn.recv(100).startswith(b"HTTP/1.1 400")  # never fetched by the door
    finally:
        for sbx in made:
            sbx.kill()
        os.killpg(served.pid, signal.SIGINT)
        served.wait(timeout=120)
    assert not set(nodes) & {s.id for s in Sandbox.list(client=fleet.client())}  # killed on their nodes


COUNTER = (
    "import os, secrets, time\n"
    "kept = secrets.token_hex(8)\n"  # only in this process's memory, and in /tmp/kept for the test
    "open('/tmp/kept', 'w').write(kept)\n"
    "i = 0\n"
    "while True:\n"
    "    i += 1\n"
    "    open('/tmp/count.new', 'w').write(f'{i} {kept}')\n"
    "    os.replace('/tmp/count.new', '/tmp/count')\n"
    "    time.sleep(0.1)\n"
)


def test_a_host_joins_and_leaves_losing_nothing(fleet: Fleet) -> None:
    """`stasis fleet join` makes this machine a third node (its own raylet in the fleet's cluster, an agent and a
    daemon); a sandbox placed on it counts on; `stasis fleet leave` hands it to the store and stops the join;
    the sandbox comes back on another node at its next request, its process counting on from its memory, and
    nothing of the third node is left running."""
    home = fleet.home.parent / f"{fleet.home.name}-n3"
    env = {**fleet.env, "RAY_AUTH_TOKEN_PATH": fleet.ray_token_path, "STASIS_IMAGE_DIR": str(IMAGE_DIR)}
    owner = fleet.client()
    teams.create_team("joiners", client=owner, max_running=3)  # made before n3 joins: it gets them as it joins
    key, revoked = (teams.create_key("joiners", ["read", "write"], client=owner) for _ in range(2))
    teams.revoke_key(revoked.id, client=owner)
    joined = subprocess.Popen(
        [sys.executable, "-m", "stasis", "fleet", "join", "--address", fleet.ray_address, "--name", "n3",
         "--home", str(home), "--cpus", "1", "--store", f"file://{fleet.home / 'store'}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    again: subprocess.Popen[str] | None = None
    try:
        assert joined.stdout is not None
        line = joined.stdout.readline()
        assert "node n3 joined" in line, joined.stderr.read() if joined.stderr else ""
        described = json.loads(fleet.cli("fleet", "nodes", "--json").stdout)
        assert {n["name"]: n["state"] for n in described} == {"n1": "up", "n2": "up", "n3": "up"}
        with Client(url=next(n["url"] for n in described if n["name"] == "n3"), token=key.key) as on_n3:
            assert teams.whoami(client=on_n3)["team"] == "joiners"  # the team and its key reached the new node
            assert [t.quotas.max_running for t in teams.list_teams(client=Client(url=on_n3.url, token=fleet.token))
                    if t.name == "joiners"] == [3]  # fmt: skip
        with pytest.raises(Unauthorized), Client(url=on_n3.url, token=revoked.key) as gone:
            teams.whoami(client=gone)  # and so did a revocation
        sbx = Sandbox.create("joiner", memory_mb=256, backend="gvisor", node="n3", client=fleet.client())
        sbx.start_process(["python3", "-c", COUNTER])
        wait_until(lambda: sbx.run("test -s /tmp/count").exit_code == 0)
        kept = sbx.read_file("/tmp/kept").decode()
        refused = fleet.cli("fleet", "kill-node", "n3")  # a host of its own: not the local fleet's to kill (was a 500)
        assert refused.returncode != 0 and "joined from elsewhere" in refused.stderr, refused.stderr
        left = fleet.cli("fleet", "leave", "n3")
        assert left.returncode == 0 and "joiner" in left.stdout, left.stderr
        assert joined.wait(timeout=STARTUP) == 0, joined.stderr.read() if joined.stderr else ""
        states = {n["name"]: n["state"] for n in json.loads(fleet.cli("fleet", "nodes", "--json").stdout)}
        assert states == {"n1": "up", "n2": "up", "n3": "left"}
        count, still = sbx.run("cat /tmp/count").stdout.split()  # back from the store, on n1 or n2
        assert sbx.info().node in ("n1", "n2") and still == kept
        wait_until(lambda: int(sbx.run("cat /tmp/count").stdout.split()[0]) > int(count))
        sbx.terminate()
        assert processes_with(f"STASIS_HOME={home}\0") == []  # its daemon and all it started
        assert [pid for pid in processes_with(fleet.marker) if "stasis-node-n3" in cmdline(pid)] == []  # its raylet
        paths = Paths(home, IMAGE_DIR)
        assert not mountns.pinned(paths.mount_pin) and list(paths.sandboxes.glob("*")) == []
        teams.remove_team("joiners", client=owner)
        again = subprocess.Popen(
            [sys.executable, "-m", "stasis", "fleet", "join", "--address", fleet.ray_address, "--name", "n4",
             "--home", f"{home}-n4", "--cpus", "1", "--store", f"file://{fleet.home / 'store'}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        assert again.stdout is not None and "node n4 joined" in again.stdout.readline()
        again.send_signal(signal.SIGTERM)  # as docs/fleet.md says: SIGTERM leaves (Ray's own handler ran first)
        assert again.wait(timeout=STARTUP) == 0 and "left the fleet" in again.stdout.read()
        states = {n["name"]: n["state"] for n in json.loads(fleet.cli("fleet", "nodes", "--json").stdout)}
        assert states.get("n4", "left") == "left"  # (the door never looked while it was up: it may not list it)
        assert processes_with(f"STASIS_HOME={home}-n4\0") == []  # it stopped all it started
    finally:
        for process in (joined, again):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=STARTUP)


def test_a_lost_node_takes_its_running_sandboxes_and_the_store_gives_back_its_idle_ones(fleet: Fleet) -> None:
    """A host's loss (`stasis fleet kill-node`: its raylet, agent, daemon and sandboxes killed): a sandbox that went
    idle before (suspended, and on to the fleet's store) comes back on a live node at its next request, its
    process counting on from its memory; one that was running, with nothing saved, is reported lost."""
    client = fleet.client()
    idle = Sandbox.create("idler", memory_mb=256, backend="gvisor", timeout_secs=2, node="n2", client=client)
    idle.start_process(["python3", "-c", COUNTER])
    wait_until(lambda: idle.run("test -s /tmp/count").exit_code == 0)
    kept = idle.read_file("/tmp/kept").decode()
    busy = Sandbox.create("busy", memory_mb=256, backend="gvisor", node="n2", client=client)
    wait_until(lambda: (fleet.home / "store" / "sandboxes" / f"{idle.id}.json").exists(), timeout=240)

    def idler_row() -> list[str]:
        return {line.split()[0]: line.split() for line in fleet.cli("ls").stdout.splitlines()[1:]}["idler"]

    wait_until(lambda: idler_row()[-1] == "store")  # no node holds it (once its node let go): the store does
    assert idler_row()[2] == "suspended"
    killed = fleet.cli("fleet", "kill-node", "n2")
    assert killed.returncode == 0, killed.stderr
    states = {n["name"]: n["state"] for n in json.loads(fleet.cli("fleet", "nodes", "--json").stdout)}
    assert (states["n1"], states["n2"]) == ("up", "lost")
    count, still = idle.run("cat /tmp/count").stdout.split()  # it comes back from the store, on n1
    assert idle.info().node == "n1" and still == kept
    wait_until(lambda: int(idle.run("cat /tmp/count").stdout.split()[0]) > int(count))
    with pytest.raises(StasisError, match=rf"'{busy.id}' was on node n2, which was lost.*nothing of it was saved"):
        busy.run("true")
    idle.terminate()


def test_stopping_the_fleet_leaves_nothing(fleet: Fleet) -> None:
    """Last in this module (pytest runs its tests in order): SIGTERM removes every sandbox, stops every daemon,
    agent and raylet."""
    survivor = Sandbox.create("left-running", memory_mb=256, backend="gvisor", client=fleet.client())
    assert survivor.info().status.value == "running"
    fleet.process.send_signal(signal.SIGTERM)
    assert fleet.process.wait(timeout=STARTUP) == 0
    assert processes_with(fleet.marker) == []
    for node in ("n1", "n2"):  # n2 was lost: its files stay, as a dead host's disk would
        paths = Paths(fleet.home / "nodes" / node, IMAGE_DIR)
        assert not mountns.pinned(paths.mount_pin)
        assert node == "n2" or list(paths.sandboxes.glob("*")) == []
