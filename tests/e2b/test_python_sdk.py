"""The official `e2b` Python SDK (pinned, from PyPI), unchanged, against `stasis e2b serve`.

One listener per backend, started through the CLI as a user would; the three exported variables are what the
SDK gets. A sandbox is shared where its state is not the subject; what the face alone decides runs on gVisor alone
(``FACE_ONLY``), what the backend changes on both.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import CommandExitException, NotFoundException, PtySize, Sandbox, SandboxException, SandboxQuery
from e2b.exceptions import (
    AuthenticationException,
    InvalidArgumentException,
    SandboxNotRunningException,
    TimeoutException,
)

from stasis import Client
from stasis import Sandbox as StasisSandbox
from tests.conftest import Daemon, wait_until

E2B_VARS = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_VOLUME_API_URL", "E2B_API_KEY")
DOMAIN = "e2b.test"  # routed by the Host header alone: the test never resolves it


class Listener:
    def __init__(self, daemon: Daemon, backend: str, memory_mb: int = 256) -> None:
        self.backend = backend
        self.daemon = daemon
        self.env = daemon.env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stasis", "e2b", "serve", "--listen", "127.0.0.1:0", "--backend", backend,
             "--memory-mb", str(memory_mb), "--domain", DOMAIN],
            env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.exports: dict[str, str] = {}
        while len(self.exports) < len(E2B_VARS):
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"`stasis e2b serve` ended: {self.proc.stderr.read() if self.proc.stderr else ''}")
            name, _, value = line.strip().removeprefix("export ").partition("=")
            self.exports[name] = value

    def close(self) -> None:
        """The listener stopped. The warm template of code-interpreter-v1 it made stays for the next listener on
        the same daemon (`stasis e2b serve` makes it once per daemon, as for a user): 20-50 s each otherwise."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def one_listener(backend: str) -> Any:
    """A module's `listener` fixture on one backend alone (its `e2b` fixture, imported from here, exports it)."""

    @pytest.fixture(scope="module")
    def listener(daemon: Daemon) -> Iterator[Listener]:
        served = Listener(daemon, backend)
        yield served
        served.close()

    return listener


# What the face alone decides (its routes, errors, listings, lifetimes, envd's file and command semantics over the
# agent) runs on gVisor; what the backend changes (users and sudo, pauses, forks, ports, the network, inotify, file
# metadata, metrics read inside) runs on both: a microVM on TCG costs ten times as much for the same face code.
FACE_ONLY = pytest.mark.parametrize("listener", ["gvisor"], indirect=True)


@pytest.fixture(scope="module", params=["gvisor", "microvm"])
def listener(request: pytest.FixtureRequest, daemon: Daemon) -> Iterator[Listener]:
    served = Listener(daemon, request.param)
    yield served
    served.close()


@pytest.fixture
def e2b(listener: Listener, monkeypatch: pytest.MonkeyPatch) -> Listener:
    for name, value in listener.exports.items():
        monkeypatch.setenv(name, value)
    return listener


@pytest.fixture(scope="module")
def shared(listener: Listener) -> Iterator[Sandbox]:
    sbx = Sandbox.create(timeout=1800, metadata={"suite": "e2b"}, **opts(listener))
    yield sbx
    sbx.kill()


def opts(listener: Listener) -> dict[str, str]:
    return {
        "api_key": listener.exports["E2B_API_KEY"],
        "api_url": listener.exports["E2B_API_URL"],
        "sandbox_url": listener.exports["E2B_SANDBOX_URL"],
    }


def test_the_serve_command_prints_the_three_exports(e2b: Listener) -> None:
    assert set(e2b.exports) == set(E2B_VARS)
    assert e2b.exports["E2B_API_URL"].startswith("http://127.0.0.1:")


def test_a_command_runs_as_the_base_templates_user_in_its_home(e2b: Listener, shared: Sandbox) -> None:
    result = shared.commands.run("whoami; pwd; echo to-stderr >&2")
    assert result.stdout == "user\n/home/user\n" and result.stderr == "to-stderr\n" and result.exit_code == 0
    assert shared.commands.run("whoami", user="root").stdout == "root\n"
    # E2B's user has passwordless sudo: the real one on a microVM, the agent's where setuid cannot work (gVisor)
    assert shared.commands.run("sudo -n whoami; sudo -u user whoami; sudo -i pwd").stdout == "root\nuser\n/root\n"
    piped = shared.commands.run("echo through stdin | sudo sh -c 'cat > /root/owned; stat -c %U /root/owned'")
    assert piped.stdout == "root\n"
    with pytest.raises(CommandExitException) as refused:
        shared.commands.run("sudo sh -c 'echo to-stderr >&2; exit 3'")
    assert (refused.value.exit_code, refused.value.stderr) == (3, "to-stderr\n")
    with pytest.raises(CommandExitException) as missing:
        shared.commands.run("sudo no-such-command")
    assert "no-such-command" in missing.value.stderr
    interrupted = shared.commands.run("timeout -s INT 2 sudo sleep 60; sleep 1; pgrep -x sleep || echo gone")
    assert interrupted.stdout == "gone\n"  # Ctrl-C reaches the command sudo runs
    # a user the image does not name gets no root: neither through sudo nor by asking the agent's socket itself
    outsider = shared.commands.run("runuser -u nobody -- sudo -n whoami; echo rc=$?", user="root")
    assert "root" not in outsider.stdout and "rc=0" not in outsider.stdout, outsider
    knock = "import socket; socket.socket(socket.AF_UNIX).connect('/dev/stasis-sudo/user')"
    asked = shared.commands.run(f'runuser -u nobody -- python3 -c "{knock}" 2>&1; echo rc=$?', user="root")
    assert "rc=1" in asked.stdout and ("PermissionError" in asked.stdout or "FileNotFoundError" in asked.stdout)
    streamed: list[str] = []
    shared.commands.run("for i in 1 2 3; do echo line-$i; done", on_stdout=streamed.append)
    assert "".join(streamed) == "line-1\nline-2\nline-3\n"
    assert shared.commands.run("echo $GREETING; pwd", envs={"GREETING": "hi"}, cwd="/tmp").stdout == "hi\n/tmp\n"


@FACE_ONLY
def test_a_failing_command_raises_the_sdks_own_exception(e2b: Listener, shared: Sandbox) -> None:
    with pytest.raises(CommandExitException) as failed:
        shared.commands.run("echo partial; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stdout == "partial\n"


@FACE_ONLY
def test_background_commands_are_listed_fed_and_killed_by_pid(e2b: Listener, shared: Sandbox) -> None:
    handle = shared.commands.run("cat", background=True, stdin=True)
    assert handle.pid in [p.pid for p in shared.commands.list()]
    shared.commands.send_stdin(handle.pid, "fed through stdin\n")
    shared.commands.close_stdin(handle.pid)
    result = handle.wait()
    assert result.stdout == "fed through stdin\n"
    sleeper = shared.commands.run("sleep 600", background=True)
    assert shared.commands.kill(sleeper.pid) is True
    assert sleeper.pid not in [p.pid for p in shared.commands.list()]
    assert shared.commands.kill(sleeper.pid) is False  # gone: the SDK's NOT_FOUND


@FACE_ONLY
def test_files_are_written_read_listed_moved_and_removed(e2b: Listener, shared: Sandbox) -> None:
    info = shared.files.write("notes/today.txt", "relative to the user's home")
    assert info.path == "/home/user/notes/today.txt"
    assert shared.files.read("/home/user/notes/today.txt") == "relative to the user's home"
    assert shared.files.read("notes/today.txt", format="bytes") == b"relative to the user's home"
    assert shared.commands.run("stat -c %U notes/today.txt notes").stdout == "user\nuser\n"  # theirs, as in E2B
    shared.files.write_files([{"path": "/tmp/many/a", "data": "A"}, {"path": "/tmp/many/b", "data": b"B"}])
    assert sorted(e.name for e in shared.files.list("/tmp/many")) == ["a", "b"]
    assert shared.files.exists("/tmp/many/a") and not shared.files.exists("/tmp/many/nope")
    entry = shared.files.get_info("/tmp/many/a")
    assert (entry.name, entry.size, entry.type.value) == ("a", 1, "file")
    assert shared.files.make_dir("/tmp/many/sub") is True and shared.files.make_dir("/tmp/many/sub") is False
    shared.files.write("/tmp/many/sub/deep", "x")
    assert {e.path for e in shared.files.list("/tmp/many", depth=2)} >= {"/tmp/many/sub/deep"}
    moved = shared.files.rename("/tmp/many/a", "/tmp/many/c")
    assert moved.path == "/tmp/many/c" and not shared.files.exists("/tmp/many/a")
    shared.files.remove("/tmp/many")
    assert not shared.files.exists("/tmp/many")
    with pytest.raises(NotFoundException):
        shared.files.read("/tmp/many/c")


@FACE_ONLY
def test_a_sandbox_is_listed_with_its_metadata_and_a_stasis_sandbox_too(
    e2b: Listener, shared: Sandbox, client: Client
) -> None:
    found = {s.sandbox_id: s for s in Sandbox.list(query=None).next_items()}
    assert found[shared.sandbox_id].metadata == {"suite": "e2b"} and found[shared.sandbox_id].state.value == "running"
    info = shared.get_info()
    assert info.template_id == "base" and info.metadata == {"suite": "e2b"}
    assert StasisSandbox.connect(shared.sandbox_id, client=client).run("whoami").stdout == "user\n"


COUNTER = """import itertools, time
for i in itertools.count():
    open("/tmp/count", "w").write(str(i))
    time.sleep(0.2)
"""


def start_counter(sbx: Sandbox) -> int:
    """A process that counts in its memory and writes each number down; the number it reached."""
    sbx.files.write("/tmp/counter.py", COUNTER)
    sbx.commands.run("python3 /tmp/counter.py", background=True)
    wait_until(lambda: count(sbx) > 0, timeout=60)
    return count(sbx)


def count(sbx: Sandbox) -> int:
    written = sbx.commands.run("cat /tmp/count 2>/dev/null || true").stdout.strip()
    return int(written) if written.isdigit() else 0


def test_pause_then_connect_finds_a_background_process_still_counting(e2b: Listener) -> None:
    sbx = Sandbox.create(timeout=600)
    try:
        start_counter(sbx)
        sbx.pause()
        assert sbx.commands.run("echo woken").stdout == "woken\n"  # any envd call resumes a paused sandbox
        before = count(sbx)
        sbx.pause()
        assert sbx.is_running() is False  # E2B's: a paused sandbox is not running (asking wakes nothing)
        states = {s.sandbox_id: s.state.value for s in Sandbox.list(query=None).next_items()}
        assert states[sbx.sandbox_id] == "paused"
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.is_running() is True
        wait_until(lambda: count(again) > before, timeout=60)
        assert before < count(again) < before + 10_000  # counting on from where it was in memory, not from 0
    finally:
        sbx.kill()


@FACE_ONLY
def test_files_and_commands_behave_as_envd_does(e2b: Listener, shared: Sandbox) -> None:
    """What agent code meets first: removing a missing path is no error, a relative cwd starts at the user's
    home, and a listing with depth walks the tree (each directory followed by what is in it)."""
    shared.files.remove("/tmp/never-was-here")
    shared.files.make_dir("/home/user/sub")
    assert shared.commands.run("pwd", cwd="sub").stdout == "/home/user/sub\n"
    shared.commands.run("rm -rf /tmp/tree && mkdir -p /tmp/tree/a/deep /tmp/tree/b && touch /tmp/tree/a/x /tmp/tree/c")
    walked = [e.path.removeprefix("/tmp/tree/") for e in shared.files.list("/tmp/tree", depth=2)]
    assert walked == ["a", "a/deep", "a/x", "b", "c"]
    # envd 0.5.7's octet-stream upload: chunks streamed as they are made, and a gzip body
    shared.files.write("/tmp/streamed.bin", (bytes([n]) * 300_000 for n in range(4)))
    assert shared.commands.run("wc -c < /tmp/streamed.bin; md5sum < /tmp/streamed.bin").stdout.split()[:2] == [
        "1200000", hashlib.md5(b"".join(bytes([n]) * 300_000 for n in range(4))).hexdigest()]  # fmt: skip
    text = "compressed on the way " * 5_000
    assert shared.files.write("/home/user/zipped.txt", text, gzip=True).path == "/home/user/zipped.txt"
    assert shared.files.read("zipped.txt") == text


@FACE_ONLY
def test_signed_file_urls_work_from_a_plain_http_client(e2b: Listener, shared: Sandbox) -> None:
    """download_url / upload_url of a secure sandbox (the SDK's default): a browser or curl needs no header."""
    shared.files.write("/home/user/report.txt", "signed for")
    download = shared.download_url("report.txt", use_signature_expiration=600)
    assert httpx.get(download, timeout=60).text == "signed for"
    upload = shared.upload_url("/home/user/uploaded.txt")
    assert httpx.post(upload, files={"file": ("uploaded.txt", b"from a form")}, timeout=60).is_success
    assert shared.files.read("/home/user/uploaded.txt") == "from a form"
    assert shared.commands.run("stat -c %U /home/user/uploaded.txt").stdout == "user\n"
    assert httpx.post(download, files={"file": ("x", b"x")}, timeout=60).status_code == 401  # a read's, not a write's
    forged = download.replace("report.txt", "..%2F..%2Fetc%2Fshadow")
    assert httpx.get(forged, timeout=60).status_code == 401


def test_a_sandbox_killed_under_a_running_command_is_e2bs_sandbox_not_running(e2b: Listener) -> None:
    sbx = Sandbox.create(timeout=300)
    handle = sbx.commands.run("sleep 600", background=True)
    killer = threading.Timer(1.0, sbx.kill)
    killer.start()
    try:
        with pytest.raises(SandboxNotRunningException):
            handle.wait()  # E2B's: the sandbox went away under the stream
        with pytest.raises(SandboxNotRunningException):
            sbx.commands.run("true")
    finally:
        killer.join()


@FACE_ONLY
def test_the_listing_pages_newest_first_and_filters_as_e2b_does(e2b: Listener, shared: Sandbox) -> None:
    later = Sandbox.create(timeout=300, metadata={"suite": "e2b-order"})
    try:
        mine = {shared.sandbox_id, later.sandbox_id}
        newest = [s.sandbox_id for s in Sandbox.list(query=None).next_items() if s.sandbox_id in mine]
        oldest = [s.sandbox_id for s in Sandbox.list(query=None, order="asc").next_items() if s.sandbox_id in mine]
        assert newest == [later.sandbox_id, shared.sandbox_id] and oldest == newest[::-1]
        in_base = {s.sandbox_id for s in Sandbox.list(query=SandboxQuery(template="base")).next_items()}
        assert mine <= in_base
        assert Sandbox.list(query=SandboxQuery(template="no-such-template")).next_items() == []
        after = shared.get_info().started_at
        since = {s.sandbox_id for s in Sandbox.list(query=SandboxQuery(started_after=after)).next_items()}
        assert later.sandbox_id in since and shared.sandbox_id not in since
    finally:
        later.kill()


@FACE_ONLY
def test_set_timeout_extends_and_a_lifetime_that_ends_kills_the_sandbox(e2b: Listener) -> None:
    sbx = Sandbox.create(timeout=600)
    sbx.set_timeout(2)
    wait_until(lambda: not sbx.is_running(), timeout=120)
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id)


@FACE_ONLY
def test_a_wrong_or_missing_api_key_is_refused(e2b: Listener, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_KEY", "e2b_wrong")
    with pytest.raises(AuthenticationException):
        Sandbox.create()
    with pytest.raises(AuthenticationException):
        Sandbox.list(query=None).next_items()


@FACE_ONLY
def test_an_unknown_template_is_a_404_naming_stasis_images(e2b: Listener) -> None:
    with pytest.raises(SandboxException, match=r"404: template 'no-such-template' not found.*stasis image ls"):
        Sandbox.create("no-such-template")


@FACE_ONLY
def test_time_left_is_reported(e2b: Listener, shared: Sandbox) -> None:
    info = shared.get_info()
    assert info.end_at.timestamp() > time.time()


def test_a_fork_and_a_snapshot_restored_twice_keep_a_running_process_and_its_memory(e2b: Listener) -> None:
    sbx = Sandbox.create(timeout=600)
    made: list[Sandbox] = []
    try:
        reached = start_counter(sbx)
        sbx.commands.run("echo on-disk > state.txt")
        forks = sbx.fork(count=1)
        assert len(forks) == 1 and isinstance(forks[0], Sandbox)
        made.append(forks[0])
        snapshot = sbx.create_snapshot()
        made += [Sandbox.create(snapshot.snapshot_id, timeout=600) for _ in range(2)]
        assert len({s.sandbox_id for s in [sbx, *made]}) == 4  # each one its own sandbox
        for child in made:
            assert child.commands.run("cat state.txt").stdout == "on-disk\n"
            wait_until(lambda child=child: count(child) > reached, timeout=60)  # the same process, counting on
            child.commands.run("echo diverged > state.txt")
        assert sbx.commands.run("cat state.txt").stdout == "on-disk\n"  # a child's write stays its own
        listed = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()
        assert snapshot.snapshot_id in [s.snapshot_id for s in listed]
        by_name = Sandbox.list_snapshots(name=snapshot.snapshot_id).next_items()
        assert [s.snapshot_id for s in by_name] == [snapshot.snapshot_id]
        assert Sandbox.list_snapshots(name="no-such-snapshot").next_items() == []
        assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
        assert snapshot.snapshot_id not in [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
    finally:
        for child in [*made, sbx]:
            child.kill()


def test_metrics_are_a_sample_measured_inside_the_sandbox(e2b: Listener, shared: Sandbox) -> None:
    [sample] = shared.get_metrics()
    assert 200 << 20 < sample.mem_total <= 300 << 20  # the 256 MiB it was given, less what its kernel keeps
    assert 0 < sample.mem_used < sample.mem_total and 0 < sample.disk_used < sample.disk_total
    assert sample.cpu_count >= 1 and 0 <= sample.cpu_used_pct <= 100 * sample.cpu_count
    hour_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    assert shared.get_metrics(start=hour_ago - datetime.timedelta(hours=1), end=hour_ago) == []  # the range asked
    assert len(shared.get_metrics(start=hour_ago)) == 1


def test_a_sandbox_port_is_reached_by_headers_or_by_host_and_needs_its_token(e2b: Listener, shared: Sandbox) -> None:
    shared.files.write("/tmp/site/index.html", "served from the sandbox")
    shared.commands.run("cd /tmp/site && exec python3 -m http.server 8000", background=True)
    url = e2b.exports["E2B_SANDBOX_URL"]
    by_headers = {"E2b-Sandbox-Id": shared.sandbox_id, "E2b-Sandbox-Port": "8000"}
    token = {"e2b-traffic-access-token": shared.traffic_access_token or ""}

    def page(headers: dict[str, str]) -> httpx.Response:
        return httpx.get(f"{url}/index.html", headers=headers, timeout=60)

    wait_until(lambda: page({**by_headers, **token}).status_code == 200, timeout=60)
    assert page({**by_headers, **token}).text == "served from the sandbox"
    host = shared.get_host(8000)
    assert host == f"8000-{shared.sandbox_id}.{DOMAIN}"
    assert page({"Host": host, **token}).text == "served from the sandbox"
    assert page(by_headers).status_code == 401  # no token: never the sandbox's answer
    assert page({**by_headers, "e2b-traffic-access-token": "wrong"}).status_code == 401
    envd = {"E2b-Sandbox-Id": shared.sandbox_id, **token}  # the traffic token never opens envd
    assert httpx.get(f"{url}/files", params={"path": "/etc/shadow"}, headers=envd, timeout=60).status_code == 401
    baker = ("from http.server import *\nclass H(BaseHTTPRequestHandler):\n  def do_GET(self):\n"
             "    self.send_response(200); self.send_header('Set-Cookie', 'stasis_console=evil; Path=/')\n"
             "    self.send_header('Set-Cookie', 'app=kept'); self.send_header('Content-Length', '0')\n"
             "    self.end_headers()\nHTTPServer(('', 8001), H).serve_forever()\n")  # fmt: skip
    shared.files.write("/tmp/baker.py", baker)
    shared.commands.run("exec python3 /tmp/baker.py", background=True)
    cookies = {**by_headers, "E2b-Sandbox-Port": "8001", **token}
    wait_until(lambda: page(cookies).status_code == 200, timeout=60)
    assert page(cookies).headers.get_list("set-cookie") == ["app=kept"]  # never one of stasis' own cookies
    shared.pause()
    assert page({**by_headers, **token}).text == "served from the sandbox"  # a request wakes it, the server lives
    assert shared.get_info().state.value == "running"


@FACE_ONLY
def test_a_pty_is_an_interactive_shell_of_the_user_that_can_be_resized(e2b: Listener, shared: Sandbox) -> None:
    terminal = shared.pty.create(PtySize(rows=24, cols=80))
    assert terminal.pid in [p.pid for p in shared.commands.list()]
    shared.pty.resize(terminal.pid, PtySize(rows=30, cols=100))
    shared.pty.send_stdin(terminal.pid, b"stty size; whoami; tty; exit\n")
    screen = bytearray()
    terminal.wait(on_pty=screen.extend)
    text = screen.decode(errors="replace")
    assert "30 100" in text and "user" in text and "/dev/pts/" in text, text


def test_watch_dir_reports_changes_below_a_directory_recursively(e2b: Listener, shared: Sandbox) -> None:
    shared.files.make_dir("/tmp/watched/deep")
    watcher = shared.files.watch_dir("/tmp/watched", recursive=True)
    try:
        shared.files.write("/tmp/watched/deep/new.txt", "x")
        shared.commands.run("rm /tmp/watched/deep/new.txt")
        seen: list[tuple[str, str]] = []
        wait_until(lambda: seen.extend((e.name, e.type.value) for e in watcher.get_new_events())
                   or ("deep/new.txt", "remove") in seen, timeout=60)  # fmt: skip
        assert ("deep/new.txt", "write") in seen, seen  # as envd writes a file: in place
        assert not [name for name, _ in seen if ".stasis-" in name], seen  # stasis' temporary is never seen
    finally:
        watcher.stop()


def test_envd_0_6_file_metadata_and_watch_entries(e2b: Listener, shared: Sandbox) -> None:
    """File metadata lives in the file's user.e2b.* extended attributes: a microVM's file system keeps them,
    gVisor's keeps none, and a write that asks for them there is refused before anything is written."""
    labels = {"Owner": "agent", "run": "7"}
    if e2b.backend == "gvisor":
        with pytest.raises(InvalidArgumentException, match="microVM"):
            shared.files.write("/tmp/labelled.txt", "x", metadata=labels)
        assert not shared.files.exists("/tmp/labelled.txt")
    else:
        lowered = {"owner": "agent", "run": "7"}  # envd lowercases the keys
        assert shared.files.write("/tmp/labelled.txt", "x", metadata=labels).metadata == lowered
        assert shared.files.get_info("/tmp/labelled.txt").metadata == lowered
        assert [e.metadata for e in shared.files.list("/tmp") if e.name == "labelled.txt"] == [lowered]
        set_out_of_band = "import os; os.setxattr('/tmp/labelled.txt', 'user.e2b.later', b'yes')"
        shared.commands.run(f'python3 -c "{set_out_of_band}"', user="root")
        assert shared.files.get_info("/tmp/labelled.txt").metadata == {**lowered, "later": "yes"}
        assert shared.files.write("/tmp/plain.txt", "x").metadata is None
    shared.files.make_dir("/tmp/entries")
    watcher = shared.files.watch_dir("/tmp/entries", include_entry=True)
    try:
        shared.files.write("/tmp/entries/seen.txt", "12345")
        seen: list = []
        wait_until(lambda: seen.extend(watcher.get_new_events()) or any(e.entry for e in seen), timeout=60)
        [written] = [e for e in seen if e.entry is not None]
        assert (written.name, written.entry.path, written.entry.size) == ("seen.txt", "/tmp/entries/seen.txt", 5)
    finally:
        watcher.stop()


def test_a_daemon_killed_mid_call_keeps_the_sandbox_and_its_e2b_record(own_daemon: Daemon) -> None:
    served = Listener(own_daemon.start(), "gvisor")
    try:
        sbx = Sandbox.create(timeout=900, metadata={"owner": "me"}, **opts(served))
        end_at = sbx.get_info().end_at

        def run_until_cut() -> None:
            with contextlib.suppress(Exception):  # the daemon goes away under it
                sbx.commands.run("sleep 3; echo finished > /tmp/done", timeout=120)

        cut = threading.Thread(target=run_until_cut)
        cut.start()
        wait_until(lambda: any(p.cmd == "/bin/bash" for p in sbx.commands.list()), timeout=60)
        own_daemon.kill()
        cut.join(timeout=120)
        assert not cut.is_alive()  # the SDK's call ended with an error, it did not hang
        assert served.proc.wait(timeout=60) != 0
        assert "run `stasis e2b serve` again" in (served.proc.stderr.read() if served.proc.stderr else "")
    finally:
        served.close()
    own_daemon.start()
    again = Listener(own_daemon, "gvisor")
    try:
        assert again.exports["E2B_API_KEY"] == served.exports["E2B_API_KEY"]  # the same key after a restart
        back = Sandbox.connect(sbx.sandbox_id, **opts(again))
        wait_until(lambda: back.commands.run("cat /tmp/done 2>/dev/null || true").stdout == "finished\n", timeout=60)
        info = back.get_info()
        assert info.metadata == {"owner": "me"} and info.end_at >= end_at
        back.kill()
    finally:
        again.close()


@FACE_ONLY
def test_logs_are_the_sandboxs_lifecycle_journal(e2b: Listener, shared: Sandbox) -> None:
    answer = httpx.get(f"{e2b.exports['E2B_API_URL']}/v2/sandboxes/{shared.sandbox_id}/logs",
                       headers={"X-API-KEY": e2b.exports["E2B_API_KEY"]}, timeout=60)  # fmt: skip
    assert answer.status_code == 200
    messages = [entry["message"] for entry in answer.json()["logs"]]
    assert any("-> running" in m for m in messages), messages


@FACE_ONLY
def test_the_rest_of_the_surface(e2b: Listener, shared: Sandbox) -> None:
    """Create-time envs, a running command joined by pid, a command's deadline, reading as a stream, pages."""
    other = Sandbox.create(timeout=600, envs={"FROM_CREATE": "yes"}, metadata={"page": "1"})
    try:
        assert other.commands.run("echo $FROM_CREATE").stdout == "yes\n"
        started = other.commands.run("sleep 2; echo joined", background=True)
        assert other.commands.connect(started.pid).wait().stdout == "joined\n"
        with pytest.raises(TimeoutException):
            other.commands.run("sleep 30", timeout=2)
        other.files.write("/tmp/streamed", b"s" * 3_000_000)
        assert b"".join(other.files.read("/tmp/streamed", format="stream")) == b"s" * 3_000_000
        pages = Sandbox.list(limit=1)
        ids: list[str] = []
        while pages.has_next:
            ids += [s.sandbox_id for s in pages.next_items()]
        assert {shared.sandbox_id, other.sandbox_id} <= set(ids) and len(ids) == len(set(ids))
    finally:
        other.kill()


def test_a_lifetime_that_ends_pauses_a_sandbox_made_with_auto_pause(e2b: Listener) -> None:
    sbx = Sandbox.create(timeout=600, lifecycle={"on_timeout": "pause"})
    try:
        sbx.files.write("/tmp/kept", "across the pause")
        sbx.set_timeout(1)
        wait_until(lambda: sbx.get_info().state.value == "paused", timeout=120)
        back = Sandbox.connect(sbx.sandbox_id, timeout=600)
        assert back.files.read("/tmp/kept") == "across the pause"
    finally:
        sbx.kill()


def test_a_filesystem_only_pause_keeps_the_files_and_boots_them_again(e2b: Listener) -> None:
    """E2B's mode="filesystem": asked for, or as a lifetime's end; a resume is a cold boot with the files."""
    sbx = Sandbox.create(timeout=600, lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}})
    try:
        sbx.files.write("/home/user/kept", "across the pause")
        sbx.commands.run("sleep 600", background=True)
        sbx.set_timeout(1)
        wait_until(lambda: sbx.get_info().state.value == "paused", timeout=120)
        back = Sandbox.connect(sbx.sandbox_id, timeout=600)
        assert back.files.read("kept") == "across the pause"
        assert back.commands.run("pgrep -x sleep || echo none").stdout == "none\n"  # booted again: no process kept
        back.commands.run("sleep 600", background=True)
        back.pause(mode="filesystem")
        again = Sandbox.connect(sbx.sandbox_id, timeout=600)
        assert again.commands.run("pgrep -x sleep || echo none").stdout == "none\n"
        assert again.files.read("kept") == "across the pause"
    finally:
        sbx.kill()


def test_a_networked_sandboxs_egress_is_updated_live(e2b: Listener, client: Client) -> None:
    sbx = Sandbox.create(timeout=600, network={"deny_out": ["0.0.0.0/0"], "allow_out": ["10.99.0.1"]})
    try:
        assert sbx.get_info().network is not None
        sbx.update_network({"allow_out": ["10.99.0.2"], "deny_out": ["0.0.0.0/0"]})
        stasis_view = StasisSandbox.connect(sbx.sandbox_id, client=client).info().spec.network
        assert stasis_view is not None and stasis_view.allow_out == ["10.99.0.2"]
    finally:
        sbx.kill()
