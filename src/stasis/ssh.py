"""The client side of SSH into sandboxes: an OpenSSH config block, its ProxyCommand and KnownHostsCommand.

``ssh stasis-NAME`` runs ``stasis ssh-proxy stasis-NAME`` as the connection: it authorises your
public keys in the sandbox, writes the sandbox's host key (as stasis reports it) into stasis's own
known_hosts file, then carries the SSH byte stream over a WebSocket to the daemon, which hands it
to ``sshd -i`` inside (see :mod:`stasis.daemon.rooms.ssh`). So a host key is never trusted on first use,
and a fork (a new key) is never a "host key changed" alarm. No network in the sandbox needed.
(The key is written by the proxy rather than given by a KnownHostsCommand: that would be a second
Python process per connection, ~0.6 s.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import shlex
import shutil
import sys
import threading
import urllib.parse
from pathlib import Path

from websockets.exceptions import ConnectionClosed

from .errors import InvalidRequest
from .fsutil import atomic_write
from .paths import Paths
from .wsclient import open_websocket

HOST_PREFIX = "stasis-"
BEGIN, END = "# >>> stasis ssh >>>", "# <<< stasis ssh <<<"
ENVIRONMENT = ("STASIS_HOME", "STASIS_IMAGE_DIR", "STASIS_URL")  # where the daemon is; never the token


def sandbox_ref(host: str) -> str:
    """``stasis-NAME`` (what ssh was asked for) → ``NAME``."""
    name = host.split("@")[-1].removeprefix(HOST_PREFIX)
    if not name or name == host.split("@")[-1]:
        raise ValueError(f"{host!r} is not a stasis host; use {HOST_PREFIX}NAME")
    return name


def stasis_command() -> str:
    """How ssh runs this CLI: its absolute path, with the environment that finds this daemon."""
    found = shutil.which("stasis")
    exe = shlex.quote(found) if found else f"{shlex.quote(sys.executable)} -m stasis"
    env = [f"{key}={shlex.quote(os.environ[key])}" for key in ENVIRONMENT if os.environ.get(key)]
    return " ".join(["/usr/bin/env", *env, exe] if env else [exe])  # KnownHostsCommand wants an absolute path


def known_hosts_file(paths: Paths) -> Path:
    return paths.home / "ssh" / "known_hosts"


def config_block(paths: Paths, command: str | None = None) -> str:
    cmd = command or stasis_command()
    return "\n".join(
        [
            BEGIN,
            "# ssh, scp, rsync -e ssh and editors' Remote-SSH reach sandbox NAME as host stasis-NAME, through stasis.",
            f"Host {HOST_PREFIX}*",
            "    User root",
            f"    ProxyCommand {cmd} ssh-proxy %n",
            f"    UserKnownHostsFile {known_hosts_file(paths)}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    ServerAliveInterval 30",
            "    LogLevel ERROR",
            END,
            "",
        ]
    )


def write_config(paths: Paths) -> Path:
    """The block as a file of its own, for ``ssh -F``."""
    path = paths.home / "ssh_config"
    paths.home.mkdir(parents=True, exist_ok=True)
    atomic_write(path, config_block(paths).encode(), mode=0o600)
    return path


def install_config(paths: Paths, config: Path) -> bool:
    """Add the block at the top of an ssh config file (or replace it where it is); False if unchanged."""
    block = config_block(paths)
    text = config.read_text() if config.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        new = head + block.rstrip("\n") + rest.split(END, 1)[1]
    else:  # first: ssh takes the first value it finds, so a later `Host *` must not override ours
        new = block + ("\n" + text if text else "")
    if new == text:
        return False
    config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(config, new.encode(), mode=0o600)
    return True


def user_public_keys(home: Path | None = None) -> list[str]:
    """The lines of ``~/.ssh/*.pub``: what ssh will offer."""
    directory = (home or Path.home()) / ".ssh"
    keys = []
    for pub in sorted(directory.glob("*.pub")):
        keys += [line.strip() for line in pub.read_text().splitlines() if line.strip()]
    return keys


HOST_KEY = re.compile(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/]+={0,2}")
KNOWN_HOST = re.compile(r"stasis-[A-Za-z0-9_.-]+")


def remember_host_key(paths: Paths, host: str, public_key: str) -> None:
    """Make ``public_key`` the one known host key of ``host`` in stasis's known_hosts file.

    The file is stasis's alone: a line that is not one plain host and its key (a marker such as
    ``@revoked`` or ``@cert-authority``, a pattern) is dropped, whoever wrote it."""
    if not HOST_KEY.fullmatch(public_key) or not KNOWN_HOST.fullmatch(host):
        raise InvalidRequest(f"refusing to trust {public_key[:60]!r} as the host key of {host[:60]!r}")
    path = known_hosts_file(paths)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    line = f"{host} {public_key}\n"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent proxies each keep the others' lines
        lines = []
        with contextlib.suppress(FileNotFoundError):
            lines = path.read_text().splitlines(keepends=True)
        new = [entry for entry in lines if _plain_entry(entry) and entry.split(" ", 1)[0] != host] + [line]
        if sorted(new) != sorted(lines):
            atomic_write(path, "".join(new).encode(), mode=0o600)


def _plain_entry(line: str) -> bool:
    fields = line.split()
    if len(fields) != 3:
        return False
    return KNOWN_HOST.fullmatch(fields[0]) is not None and HOST_KEY.fullmatch(" ".join(fields[1:])) is not None


def proxy(paths: Paths, ref: str) -> str | None:
    """Carry stdin/stdout (ssh's connection) to the sandbox's SSH server until either side ends.

    Returns why the daemon ended it, if it did with an error."""
    ws = open_websocket(paths, f"/v1/sandboxes/{urllib.parse.quote(ref)}/ssh")
    done = threading.Event()
    failure: list[str] = []

    def downstream() -> None:
        try:
            for message in ws:
                if isinstance(message, bytes):
                    _write_all(1, message)
        except ConnectionClosed as closed:
            if closed.rcvd is not None and closed.rcvd.code not in (1000, 1001):
                failure.append(closed.rcvd.reason or f"closed with code {closed.rcvd.code}")
        except OSError:  # ssh went away
            pass
        finally:
            done.set()

    threading.Thread(target=downstream, name="ssh-downstream", daemon=True).start()
    try:
        while not done.is_set():
            if not select.select([0], [], [], 0.2)[0]:
                continue
            data = os.read(0, 1 << 16)
            if not data:
                break
            ws.send(data)
    except (ConnectionClosed, OSError):
        pass
    finally:
        ws.close()
        done.wait(5)
    return failure[0] if failure else None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
