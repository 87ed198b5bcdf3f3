"""Secrets that never enter a sandbox: the egress proxy puts them into HTTPS requests to their hosts.

The HTTPS test host (tests/network/testhosts.py) has a certificate of the suite's own CA for
api.secret.test and echo.secret.test; the daemon trusts that CA through STASIS_UPSTREAM_CA, the sandbox
does not. The host logs what it received (headers, body) on the host's side and never echoes a header,
so what the sandbox reads back cannot carry a value.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stasis import CheckpointType, Client, NotFound, Sandbox, Secret
from stasis.errors import InvalidRequest
from stasis.sdk import team as teams
from tests.conftest import Daemon, new_home, terminate_all
from tests.network.testhosts import TestHost, TestTls
from tests.remote import conftest as remote
from tests.remote.conftest import S3

s3 = remote.s3  # the remote tests' S3 server (moto's, on loopback), as a fixture here: for the move

# Run in a sandbox: an HTTPS (or HTTP) request; $NAME in a header or the body is the sandbox's own variable.
REQUEST = r"""
import json, os, ssl, sys, urllib.request
method, url, headers, body, verify = sys.argv[1:6]
headers = {k: os.path.expandvars(v) for k, v in json.loads(headers).items()}
data = os.path.expandvars(body).encode() if body else None
context = ssl.create_default_context() if verify == "1" else ssl._create_unverified_context()
request = urllib.request.Request(url, data=data, headers=headers, method=method)
try:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    with opener.open(request, timeout=20) as answer:
        print(json.dumps({"status": answer.status, "body": answer.read().decode()}))
except Exception as exc:
    reason = exc.reason if isinstance(getattr(exc, "reason", None), BaseException) else exc
    print(json.dumps({"error": type(reason).__name__, "text": str(reason)}))
"""


def request(sbx: Sandbox, url: str, headers: dict[str, str] | None = None, body: str = "", verify: bool = True) -> dict:
    method = "POST" if body else "GET"
    argv = ["python3", "-c", REQUEST, method, url, json.dumps(headers or {}), body, "1" if verify else "0"]
    result = sbx.run(argv, timeout=90)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def received(tls: TestTls, path: str) -> list[dict]:
    """What the HTTPS host got on ``path`` (each test asks on a path of its own)."""
    return [r for r in tls.requests() if r["path"] == path]


def header(entry: dict, name: str) -> str | None:
    return next((v for k, v in entry["headers"] if k.lower() == name.lower()), None)


@pytest.fixture
def tls(hosts: dict[str, TestHost]) -> TestTls:
    assert hosts["web"].tls is not None
    return hosts["web"].tls


@pytest.fixture
def secret(net_client: Client) -> Iterator:
    """Add secrets with unique names (the daemon is shared); each is removed after the test."""
    added: list[str] = []

    def add(hosts: list[str], value: str | None = None, **options: object) -> tuple[str, str]:
        name, value = f"TOKEN_{secrets.token_hex(4)}", value or "real-" + secrets.token_hex(16)
        Secret.add(name, value, hosts=hosts, client=net_client, **options)  # type: ignore[arg-type]
        added.append(name)
        return name, value

    yield add
    for name in added:
        with contextlib.suppress(NotFound):
            Secret.remove(name, client=net_client)


@pytest.fixture
def make(net_client: Client) -> Iterator:
    made: list[Sandbox] = []

    def create(secrets_: list[str], backend: str = "gvisor", **options: object) -> Sandbox:
        made.append(Sandbox.create(client=net_client, backend=backend, memory_mb=512, network=True,
                                   secrets=secrets_, **options))  # type: ignore[arg-type]  # fmt: skip
        return made[-1]

    yield create
    for sbx in made:
        sbx.terminate()


def test_the_bound_host_gets_the_value_and_the_sandbox_only_a_placeholder(
    make, secret, tls: TestTls, net_client: Client, net_daemon: Daemon, backend: str
) -> None:
    name, value = secret(["api.secret.test"])
    sbx = make([name], backend)
    placeholder = sbx.info().spec.secrets[name]
    assert placeholder.startswith("stasis-secret-") and value not in placeholder

    path = f"/whoami/{secrets.token_hex(4)}"
    answer = request(sbx, f"https://api.secret.test{path}", {"Authorization": f"Bearer ${name}"})
    assert answer == {"status": 200, "body": f"ok GET {path}"}, answer  # the sandbox trusted the proxy's certificate
    (got,) = received(tls, path)
    assert header(got, "Authorization") == f"Bearer {value}"

    # Nowhere in the sandbox: its environment, its files and memory (read on the host: a grep in the sandbox
    # would put the value there), a MEMORY checkpoint
    env = sbx.run(["env"]).stdout
    assert f"{name}={placeholder}" in env and value not in env
    sbx.start_process(["sleep", "3600"])  # holds the environment (the placeholder) in its memory
    checkpoint = sbx.checkpoint(type=CheckpointType.MEMORY)
    try:
        home = net_daemon.paths.home
        kept = [home / "checkpoints" / checkpoint.id, home / "sandboxes" / sbx.id]
        files = [p for directory in kept for p in directory.rglob("*") if p.is_file() and not p.is_symlink()]
        assert any(_contains(p, placeholder.encode()) for p in files), "the search would not have seen it"
        assert [p for p in files if _contains(p, value.encode())] == []
    finally:
        net_client.request("DELETE", f"/v1/checkpoints/{checkpoint.id}")

    # Nor anywhere a person reads: the API, the console's page of the sandbox, the daemon's log
    assert value not in json.dumps([s.model_dump() for s in Secret.list(client=net_client)])
    assert value not in net_client.request("GET", f"/v1/secrets/{name}").text
    token = net_client.request("POST", "/v1/console/tokens").json()["token"]
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(net_daemon.paths.home / "stasis.sock"))) as console:
        console.post("http://stasis/ui/login", data={"token": token})
        for page in (f"/ui/sandboxes/{sbx.id}", "/ui/"):
            shown = console.get(f"http://stasis{page}")
            assert shown.status_code == 200 and sbx.id in shown.text and value not in shown.text
        assert name in console.get(f"http://stasis/ui/sandboxes/{sbx.id}").text  # its egress table names it
    assert value not in (net_daemon.paths.home / "daemon-test.log").read_text(errors="replace")  # at DEBUG

    # The audit says which secret went out, never its value
    lines = [line for line in sbx.egress_log() if line.get("name") == "api.secret.test"]
    assert lines and lines[-1]["intercepted"] is True and lines[-1]["secrets"] == [name]
    assert value not in json.dumps(lines)


def _contains(path: Path, needle: bytes) -> bool:
    overlap = len(needle) - 1
    tail = b""
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            if needle in tail + chunk:
                return True
            tail = chunk[-overlap:]
    return False


def test_an_unbound_host_gets_the_placeholder_and_plain_http_to_a_bound_host_is_refused(
    make, secret, tls: TestTls
) -> None:
    name, _ = secret(["api.secret.test"])
    sbx = make([name])
    placeholder = sbx.info().spec.secrets[name]

    # echo.secret.test is not bound: not intercepted (the sandbox sees the host's own certificate, which it
    # does not trust: so it skips verifying), and the placeholder goes as it is
    path = f"/unbound/{secrets.token_hex(4)}"
    answer = request(sbx, f"https://echo.secret.test{path}", {"Authorization": f"Bearer ${name}"}, verify=False)
    assert answer["status"] == 200, answer
    (got,) = received(tls, path)
    assert header(got, "Authorization") == f"Bearer {placeholder}"
    assert request(sbx, f"https://echo.secret.test{path}")["error"] == "SSLCertVerificationError"  # not the proxy's

    # plain HTTP to the bound host: refused before it connects (the web host answers HTTP on port 80)
    refused = request(sbx, f"http://api.secret.test/plain/{secrets.token_hex(4)}", {"Authorization": f"${name}"})
    assert refused.get("error") in ("ConnectionResetError", "RemoteDisconnected"), refused
    denied = [line for line in sbx.egress_log() if line["verdict"] == "denied" and line["port"] == 80]
    assert denied and "plain HTTP is refused" in denied[-1]["rule"]


def test_rotation_counts_from_the_next_request_and_removal_makes_the_placeholder_inert(
    make, secret, tls: TestTls, net_client: Client
) -> None:
    name, first = secret(["api.secret.test"])
    sbx = make([name])
    placeholder = sbx.info().spec.secrets[name]

    def sent(verify: bool = True) -> str | None:
        path = f"/rotate/{secrets.token_hex(4)}"
        answer = request(sbx, f"https://api.secret.test{path}", {"X-Api-Key": f"${name}"}, verify=verify)
        assert answer.get("status") == 200, answer
        return header(received(tls, path)[0], "X-Api-Key")

    assert sent() == first
    second = "rotated-" + secrets.token_hex(16)
    info = Secret.add(name, second, hosts=["api.secret.test"], client=net_client)
    assert info.version == 2
    assert sent() == second  # the same sandbox, not restarted
    Secret.remove(name, client=net_client)
    # inert: the host is not intercepted any more (the sandbox meets the test host's own certificate, which it does
    # not trust, so it skips verifying), and nothing puts a value in the placeholder's place
    assert sent(verify=False) == placeholder


def test_a_header_a_basic_password_and_a_body_get_the_value(make, secret, tls: TestTls) -> None:
    by_header, header_value = secret(["api.secret.test"], header="X-Api-Token", format="token {value}")
    in_body, body_value = secret(["api.secret.test"], body=True)
    sbx = make([by_header, in_body])

    path = f"/header/{secrets.token_hex(4)}"
    assert request(sbx, f"https://api.secret.test{path}")["status"] == 200  # the sandbox sent no such header
    assert header(received(tls, path)[0], "X-Api-Token") == f"token {header_value}"

    path = f"/body/{secrets.token_hex(4)}"
    answer = request(sbx, f"https://api.secret.test{path}", {"Content-Type": "application/json",
                     "Expect": "100-continue"}, body=f'{{"key": "${in_body}", "again": "${in_body}"}}')  # fmt: skip
    assert answer["status"] == 200, answer
    got = received(tls, path)[0]
    assert json.loads(got["body"]) == {"key": body_value, "again": body_value}

    # git sends a token as the password of Basic auth: base64 of user:password
    script = (f'import base64, os; print(base64.b64encode(("x-access-token:" + os.environ["{in_body}"])'
              '.encode()).decode())')  # fmt: skip
    basic = sbx.run(["python3", "-c", script]).stdout.strip()
    path = f"/basic/{secrets.token_hex(4)}"
    assert request(sbx, f"https://api.secret.test{path}", {"Authorization": f"Basic {basic}"})["status"] == 200
    sent = header(received(tls, path)[0], "Authorization")
    assert sent is not None and sent.startswith("Basic ")
    assert base64.b64decode(sent[6:]).decode() == f"x-access-token:{body_value}"


def test_a_bound_host_whose_certificate_fails_is_refused(make, secret, tls: TestTls) -> None:
    """mismatch.secret.test resolves to the HTTPS host, whose certificate does not name it."""
    name, _ = secret(["mismatch.secret.test"])
    sbx = make([name])
    path = f"/mismatch/{secrets.token_hex(4)}"
    answer = request(sbx, f"https://mismatch.secret.test{path}", {"Authorization": f"${name}"})
    assert "error" in answer, answer
    assert received(tls, path) == []
    line = [entry for entry in sbx.egress_log() if entry.get("name") == "mismatch.secret.test"][-1]
    assert "certificate failed verification" in line["error"]


def test_secrets_survive_suspend_resume_and_a_fork(make, secret, tls: TestTls, net_client: Client) -> None:
    name, value = secret(["api.secret.test"])
    sbx = make([name])
    sbx.suspend()
    sbx.resume()
    path = f"/resumed/{secrets.token_hex(4)}"
    assert request(sbx, f"https://api.secret.test{path}", {"Authorization": f"${name}"})["status"] == 200
    assert header(received(tls, path)[0], "Authorization") == value

    checkpoint = sbx.checkpoint(type=CheckpointType.MEMORY)
    fork = Sandbox.create(client=net_client, snapshot_id=checkpoint.id)
    try:
        assert fork.info().spec.secrets == sbx.info().spec.secrets  # its memory holds the same placeholder
        path = f"/fork/{secrets.token_hex(4)}"
        assert request(fork, f"https://api.secret.test{path}", {"Authorization": f"${name}"})["status"] == 200
        assert header(received(tls, path)[0], "Authorization") == value
    finally:
        fork.terminate()
        net_client.request("DELETE", f"/v1/checkpoints/{checkpoint.id}")


def test_bad_secret_requests_are_refused_with_what_to_do(net_client: Client, secret) -> None:
    with pytest.raises(NotFound, match="add it first with `stasis secret add"):
        Sandbox.create(client=net_client, network=True, secrets=["NO_SUCH_SECRET"])
    name, _ = secret(["api.secret.test"])
    with pytest.raises(InvalidRequest, match="give the sandbox a network"):
        Sandbox.create(client=net_client, secrets=[name])
    with pytest.raises(InvalidRequest, match="hostnames"):
        Secret.add("BAD_HOST", "x", hosts=["10.0.0.1"], client=net_client)
    with pytest.raises(InvalidRequest, match="control characters"):
        Secret.add("BAD_VALUE", "a\r\nX-Evil: 1", hosts=["api.secret.test"], client=net_client)
    with pytest.raises(InvalidRequest, match="invalid secret name"):
        Secret.add("../etc", "x", hosts=["api.secret.test"], client=net_client)


def test_the_cli_reads_a_value_from_stdin_and_never_shows_it(net_daemon: Daemon, net_client: Client) -> None:
    name, value = f"CLI_{secrets.token_hex(4)}", "cli-" + secrets.token_hex(16)

    def stasis(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stasis", *args], input=stdin, capture_output=True, text=True,
                              env=net_daemon.env, timeout=120)  # fmt: skip

    try:
        added = stasis("secret", "add", name, "--host", "api.secret.test", "--header", "Authorization",
                       "--format", "Bearer {value}", stdin=value + "\n")  # fmt: skip
        assert added.returncode == 0, added.stderr
        assert f"secret {name} added, bound to api.secret.test" in added.stdout and value not in added.stdout
        assert Secret.get(name, client=net_client).format == "Bearer {value}"
        listed = stasis("secret", "ls")
        assert name in listed.stdout and "Authorization: Bearer {value}" in listed.stdout and value not in listed.stdout
        rotated = stasis("secret", "add", name, "--host", "api.secret.test", stdin="second-" + value)
        assert "rotated (version 2)" in rotated.stdout
        empty = stasis("secret", "add", name, "--host", "api.secret.test", stdin="\n")
        assert empty.returncode != 0 and "the value is empty" in empty.stderr
        assert stasis("secret", "rm", name).returncode == 0
        assert name not in stasis("secret", "ls").stdout
    finally:
        with contextlib.suppress(NotFound):
            Secret.remove(name, client=net_client)


def test_a_sandbox_moved_to_another_node_authenticates_with_that_nodes_secret(
    s3: S3, hosts: dict[str, TestHost], tls: TestTls
) -> None:
    """Secrets are each node's own: the sandbox carries its placeholder, node B puts in B's value, and B (which
    never saw A's CA) makes the sandbox trust a CA of its own when it resumes there."""
    name = f"MOVED_{secrets.token_hex(4)}"
    values = {"node-a": "a-" + secrets.token_hex(16), "node-b": "b-" + secrets.token_hex(16)}
    nodes = {node: Daemon(new_home(f"secret-{node}")) for node in values}
    for node, daemon in nodes.items():
        daemon.sticky_env.update(s3.env, STASIS_NODE=node, STASIS_DNS_UPSTREAM=hosts["web"].address,
                                 STASIS_UPSTREAM_CA=str(tls.ca))  # fmt: skip
        daemon.start()
    try:
        with nodes["node-a"].client() as a, nodes["node-b"].client() as b:
            for node, client in (("node-a", a), ("node-b", b)):
                Secret.add(name, values[node], hosts=["api.secret.test"], client=client)
            sbx = Sandbox.create(f"mover-{name.lower()}", client=a, memory_mb=512, network=True, secrets=[name])
            path = f"/on-a/{secrets.token_hex(4)}"
            assert request(sbx, f"https://api.secret.test{path}", {"Authorization": f"${name}"})["status"] == 200
            assert header(received(tls, path)[0], "Authorization") == values["node-a"]
            sbx.push()
            Sandbox.pull(sbx.id, client=b)
            moved = Sandbox.connect(sbx.id, client=b)
            moved.resume()
            path = f"/on-b/{secrets.token_hex(4)}"
            answer = request(moved, f"https://api.secret.test{path}", {"Authorization": f"${name}"})
            assert answer.get("status") == 200, answer  # the sandbox trusts node B's CA now
            assert header(received(tls, path)[0], "Authorization") == values["node-b"]
    finally:
        for daemon in nodes.values():
            terminate_all(daemon)
            daemon.stop()


def test_e2bs_secrets_api_and_network_rules_put_the_value_in(
    net_daemon: Daemon, net_client: Client, tls: TestTls
) -> None:
    """The official e2b SDK, unchanged: Secret.create, a sandbox whose network rule sets a header from
    ${e2b.secrets.NAME}, Secret.update (a new version, sent from the next request), Secret.destroy."""
    import e2b

    from tests.e2b.test_python_sdk import Listener, opts

    listener = Listener(net_daemon, "gvisor", memory_mb=512)
    name, value = f"e2b-key-{secrets.token_hex(4)}", "e2b-" + secrets.token_hex(16)
    sbx = None
    try:
        o = opts(listener)
        created = e2b.Secret.create(name, value, metadata={"team": "tests"}, **o)
        assert (created.name, created.version, created.metadata) == (name, 1, {"team": "tests"})
        assert name in [s.name for s in e2b.Secret.list(**o).next_items()]
        rule = {"transform": {"headers": {"Authorization": f"Bearer {e2b.Secret.fill(name)}"}}}
        sbx = e2b.Sandbox.create(allow_internet_access=True, network={"rules": {"api.secret.test": [rule]}}, **o)
        inside = Sandbox.connect(sbx.sandbox_id, client=net_client)

        def sent() -> str | None:
            path = f"/e2b/{secrets.token_hex(4)}"
            answer = request(inside, f"https://api.secret.test{path}")
            assert answer.get("status") == 200, answer
            return header(received(tls, path)[0], "Authorization")

        assert sent() == f"Bearer {value}"
        assert value not in sbx.commands.run("env").stdout
        updated = e2b.Secret.update(created.secret_id, "v2-" + value, **o)
        assert updated.version == 2
        assert sent() == f"Bearer v2-{value}"
        assert e2b.Secret.destroy(name, **o)
        assert sent() is None  # a rule naming a removed secret is dropped, never sent with the reference in it
    finally:
        if sbx is not None:
            sbx.kill()
        with contextlib.suppress(NotFound):
            Secret.remove(name, client=net_client)
        listener.close()


def test_a_killed_daemon_comes_back_with_its_secrets_and_the_sandbox_authenticates(
    hosts: dict[str, TestHost], tls: TestTls
) -> None:
    """The store and the CAs are files of the daemon's home: a SIGKILL loses neither, so a sandbox that ran on
    through the crash (its trust store holding the same CA) authenticates at once, and after a suspend."""
    daemon = Daemon(new_home("secret-restart"))
    daemon.sticky_env.update(STASIS_DNS_UPSTREAM=hosts["web"].address, STASIS_UPSTREAM_CA=str(tls.ca))
    daemon.start()
    name, value = f"KEPT_{secrets.token_hex(4)}", "kept-" + secrets.token_hex(16)
    try:
        with daemon.client() as client:
            Secret.add(name, value, hosts=["api.secret.test"], client=client)
            sbx_id = Sandbox.create(client=client, memory_mb=512, network=True, secrets=[name]).id
        daemon.kill()
        daemon.start()
        with daemon.client() as client:
            sbx = Sandbox.connect(sbx_id, client=client)
            for when in ("after-restart", "after-resume"):
                path = f"/{when}/{secrets.token_hex(4)}"
                answer = request(sbx, f"https://api.secret.test{path}", {"Authorization": f"${name}"})
                assert answer.get("status") == 200, (when, answer)
                assert header(received(tls, path)[0], "Authorization") == value
                sbx.suspend()
                sbx.resume()
    finally:
        terminate_all(daemon)
        daemon.stop()


def test_a_teams_secrets_are_its_own_and_reach_its_sandboxes_alone(net_daemon: Daemon, net_client: Client,
                                                                   tls: TestTls) -> None:  # fmt: skip
    """A team's key adds secrets to its team's own store: its sandboxes get them on the wire, another team's
    cannot name them, and neither can reach the owner's."""
    suffix = secrets.token_hex(3)
    keys = {}
    for team in ("red", "blue"):
        teams.create_team(f"{team}-{suffix}", client=net_client)
        keys[team] = teams.create_key(f"{team}-{suffix}", ["read", "write", "exec"], client=net_client).key
    owners = f"OWNER_{suffix}".upper()
    Secret.add(owners, "owner-value", hosts=["api.secret.test"], client=net_client)
    name, value = f"RED_{suffix}".upper(), "red-" + secrets.token_hex(16)
    with Client(net_daemon.paths, token=keys["red"]) as red, Client(net_daemon.paths, token=keys["blue"]) as blue:
        Secret.add(name, value, hosts=["api.secret.test"], client=red)
        assert [s.name for s in Secret.list(client=red)] == [name] and Secret.list(client=blue) == []
        assert name not in {s.name for s in Secret.list(client=net_client)}  # not the owner's store either
        with pytest.raises(NotFound, match=f"no secret named {name}"):
            Sandbox.create(network=True, secrets=[name], memory_mb=512, client=blue)
        with pytest.raises(NotFound, match=f"no secret named {owners}"):
            Sandbox.create(network=True, secrets=[owners], memory_mb=512, client=red)
        sbx = Sandbox.create(network=True, secrets=[name], memory_mb=512, client=red)
        try:
            path = f"/team/{secrets.token_hex(4)}"
            answer = request(sbx, f"https://api.secret.test{path}", {"Authorization": f"Bearer ${name}"})
            assert answer["status"] == 200, answer
            (got,) = received(tls, path)
            assert header(got, "Authorization") == f"Bearer {value}"  # the team's own value, put in on the wire
        finally:
            sbx.terminate()
        Secret.remove(name, client=red)
    Secret.remove(owners, client=net_client)
    for team in ("red", "blue"):
        teams.remove_team(f"{team}-{suffix}", client=net_client)
