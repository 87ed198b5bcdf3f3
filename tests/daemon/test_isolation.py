"""Security defaults: no network, limits enforced, the API only for its owner."""

from __future__ import annotations

import os
import socket
import stat
import threading

from stasis import Sandbox
from tests.conftest import Daemon


def test_no_network_by_default(sandbox: Sandbox) -> None:
    # A server on the host's loopback: reachable from any process that shares the host network.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True).start()
    probe = (
        "import socket\n"
        "s = socket.socket(); s.settimeout(3)\n"
        f"try:\n    s.connect(('127.0.0.1', {port})); print('connected')\n"
        "except OSError as e:\n    print('refused', e.errno)\n"
    )
    result = sandbox.run(["python3", "-c", probe])
    server.close()
    assert result.stdout.startswith("refused"), result.stdout
    assert accepted == []
    interfaces = sandbox.run("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").stdout.split()
    assert interfaces == ["lo"]


def test_memory_limit_is_what_the_sandbox_sees(client, backend: str) -> None:  # type: ignore[no-untyped-def]
    sbx = Sandbox.create(client=client, memory_mb=384, cpus=0.5, backend=backend)
    try:
        total_kib = int(sbx.run("head -n1 /proc/meminfo").stdout.split()[1])
        if backend == "gvisor":
            assert total_kib == 384 * 1024
        else:  # a real kernel keeps some of its RAM for itself
            assert 300 * 1024 < total_kib <= 384 * 1024
            assert sbx.run("nproc").stdout.strip() == "1"  # half a CPU is one vCPU
    finally:
        sbx.terminate()


def test_socket_is_private_and_pidfile_names_the_daemon(daemon: Daemon) -> None:
    mode = stat.S_IMODE(os.stat(daemon.paths.socket).st_mode)
    assert mode == 0o600
    assert stat.S_IMODE(os.stat(daemon.paths.home).st_mode) == 0o700
    assert daemon.proc is not None
    assert int(daemon.paths.pidfile.read_text()) == daemon.proc.pid


def test_a_second_daemon_on_the_same_home_refuses(daemon: Daemon) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "stasis", "serve"], env=daemon.env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "already serves" in result.stderr
    assert daemon.proc is not None and daemon.proc.poll() is None
