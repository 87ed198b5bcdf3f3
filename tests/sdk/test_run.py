"""`run`: exit codes, streams, env, cwd, timeouts that leave no survivors, bounded output."""

from __future__ import annotations

import pytest

from stasis import InvalidRequest, Sandbox
from tests.conftest import wait_until


@pytest.fixture
def sandbox(shared_sandbox: Sandbox) -> Sandbox:
    """One sandbox per backend for the module: its subject is commands, not a sandbox's life."""
    return shared_sandbox


def test_exit_code_and_streams_kept_apart(sandbox: Sandbox) -> None:
    result = sandbox.run("echo out; echo err >&2; exit 7")
    assert result.exit_code == 7
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"
    assert not result.timed_out and not result.truncated


def test_argv_form_runs_without_a_shell(sandbox: Sandbox) -> None:
    result = sandbox.run("echo", ["$HOME", "a b"])
    assert result.stdout == "$HOME a b\n"


def test_env_and_working_dir_are_honoured(sandbox: Sandbox) -> None:
    sandbox.run("mkdir -p /srv/app")
    result = sandbox.run("echo $GREETING; pwd", env={"GREETING": "hello"}, working_dir="/srv/app")
    assert result.stdout == "hello\n/srv/app\n"


def test_default_environment_is_a_login_like_root_shell(sandbox: Sandbox) -> None:
    result = sandbox.run("echo $HOME; pwd; id -u")
    assert result.stdout == "/root\n/root\n0\n"


def test_localhost_resolves_in_a_sandbox_without_network(sandbox: Sandbox) -> None:
    """The images have no /etc/hosts (debootstrap makes none): the agent writes one, so a server on localhost is
    reached by its name, as on any machine (websockify, noVNC's proxy, connects to localhost:5900 so)."""
    code = "import socket; print(socket.getaddrinfo('localhost', 80, socket.AF_INET)[0][4][0])"
    assert sandbox.run(["python3", "-c", code]).stdout == "127.0.0.1\n"
    own = "import socket; print(socket.getaddrinfo(socket.gethostname(), 80, socket.AF_INET)[0][4][0])"
    assert sandbox.run(["python3", "-c", own]).stdout == "127.0.1.1\n"  # its own name too (sudo asks for it)


def test_missing_working_dir_and_command_are_clear_errors(sandbox: Sandbox) -> None:
    with pytest.raises(InvalidRequest, match="does not exist"):
        sandbox.run("true", working_dir="/nope")
    with pytest.raises(InvalidRequest, match="command not found"):
        sandbox.run("definitely-not-a-command", [])


def test_timeout_kills_the_whole_process_tree(sandbox: Sandbox) -> None:
    # A child, a grandchild in its own session, and a detached daemon-like process.
    script = "sleep 1001 & setsid sleep 1002 & (setsid sh -c 'sleep 1003' &) ; sleep 1004"
    result = sandbox.run(script, timeout=1.5)
    assert result.timed_out
    assert result.exit_code == -9
    survivors = sandbox.run("ps -eo args | grep '[s]leep 100' || true").stdout
    assert survivors == ""


def test_stdin_is_fed_to_the_command(sandbox: Sandbox) -> None:
    assert sandbox.run("wc -c", stdin=b"12345").stdout.strip() == "5"


def test_oversized_output_is_truncated_and_flagged(sandbox: Sandbox) -> None:
    result = sandbox.run("head -c 3000000 /dev/zero | tr '\\0' x; echo END", max_output=100_000)
    assert result.stdout_truncated
    assert len(result.stdout_bytes) == 100_000
    assert result.stdout.endswith("xEND\n")  # the tail is kept: where errors and results are
    assert not result.stderr_truncated


def test_binary_output_is_exact(sandbox: Sandbox) -> None:
    result = sandbox.run("python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256)))'")
    assert result.stdout_bytes == bytes(range(256))


def test_exec_id_reattaches_instead_of_running_twice(sandbox: Sandbox) -> None:
    first = sandbox.run("echo run >> /root/runs; cat /root/runs | wc -l", exec_id="job-1")
    again = sandbox.run("echo run >> /root/runs; cat /root/runs | wc -l", exec_id="job-1")
    assert first.stdout == again.stdout == "1\n"
    assert sandbox.read_file("/root/runs") == b"run\n"


def test_background_process_output_is_kept(sandbox: Sandbox) -> None:
    proc = sandbox.start_process("for i in 1 2 3; do echo line$i; done; echo oops >&2")
    info = wait_until(lambda: (found := sandbox.get_process(proc.id)).status == "exited" and found)
    assert info.exit_code == 0
    out = sandbox.process_output(proc.id)
    assert out.eof
    import base64

    assert base64.b64decode(out.data_b64) == b"line1\nline2\nline3\n"
    assert base64.b64decode(sandbox.process_output(proc.id, stream="stderr").data_b64) == b"oops\n"
    assert proc.id in {p.id for p in sandbox.list_processes()}
