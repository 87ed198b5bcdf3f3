"""`stasis serve`: one daemon per STASIS_HOME, on a unix socket only its user can open."""

from __future__ import annotations

import fcntl
import logging
import os
import resource
import socket
import sys
from pathlib import Path

import uvicorn

from .. import mountns
from ..e2b_models import E2bServeRequest
from ..errors import DaemonRunning, InvalidRequest
from ..fsutil import atomic_write
from ..paths import Paths
from .app import create_app

log = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s pid=%(process)d msg=%(message)s"


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr, force=True)
    logging.getLogger("qemu.qmp").setLevel(logging.WARNING)  # it logs every connection at INFO
    logging.getLogger("pyroute2").setLevel(logging.WARNING)  # it logs every netlink message at DEBUG


def _raise_fd_limit() -> None:
    """runsc's sentry inherits our file-descriptor limit, and each file open in a sandbox and each dentry
    its cache keeps holds one of its host descriptors: as root up to the kernel's maximum (fs.nr_open),
    otherwise the hard limit."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    try:
        most = int(Path("/proc/sys/fs/nr_open").read_text())
    except (OSError, ValueError):
        most = hard
    for limit in (max(most, hard), hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
            return
        except (OSError, ValueError):  # not root: no raising the hard limit
            continue


def _take_lock(paths: Paths) -> int:
    fd = os.open(paths.lockfile, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        pid = paths.pidfile.read_text().strip() if paths.pidfile.exists() else "?"
        raise DaemonRunning(f"a stasis daemon (pid {pid}) already serves {paths.home}") from None
    return fd


def _unix_socket(path: Path) -> socket.socket:
    path.unlink(missing_ok=True)  # we hold the lock: a socket file left here is stale
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # born 0600: no window in which others could connect
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(128)
    return sock


def _tcp_socket(address: str) -> socket.socket:
    if address.startswith("fd:") and address[3:].isdigit():  # a listening socket its parent made (a fleet's agent)
        sock = socket.socket(fileno=int(address[3:]))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidRequest(f"--tcp wants HOST:PORT, got {address!r}")
    sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepted sockets: no Nagle stalls
    sock.bind((host.strip("[]"), int(port)))
    sock.listen(128)
    return sock


def serve(
    paths: Paths, tcp: str | None = None, token: str | None = None, log_level: str = "INFO",
    e2b: E2bServeRequest | None = None,
) -> None:  # fmt: skip
    """Run the daemon in the foreground until SIGTERM/SIGINT."""
    configure_logging(log_level)
    _raise_fd_limit()
    if tcp and not token:
        raise InvalidRequest("serving on TCP needs a token: set STASIS_TOKEN (clients send it as a bearer token)")
    paths.ensure()
    lock_fd = _take_lock(paths)
    mountns.enter(paths.mount_pin, paths.home)  # before any thread: sandboxes' disks are mounted in it
    sockets = [_unix_socket(paths.socket)]
    if tcp:
        sockets.append(_tcp_socket(tcp))
    atomic_write(paths.pidfile, f"{os.getpid()}\n".encode())

    def remove_traces() -> None:
        # here, at the app's shutdown: uvicorn re-raises SIGTERM after it, and nothing after run() runs then
        mountns.release(paths.mount_pin, paths.sandboxes)
        paths.socket.unlink(missing_ok=True)
        paths.pidfile.unlink(missing_ok=True)  # last: its absence means the daemon is fully gone

    app = create_app(paths, token=token if tcp else None, on_shutdown=remove_traces, e2b=e2b)
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=5)
    log.info("stasis daemon pid %d serving %s%s", os.getpid(), paths.socket, f" and tcp {tcp}" if tcp else "")
    try:
        uvicorn.Server(config).run(sockets=sockets)
    finally:
        mountns.release(paths.mount_pin, paths.sandboxes)
        remove_traces()
        os.close(lock_fd)
