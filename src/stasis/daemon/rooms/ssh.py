"""SSH into a sandbox without a network: OpenSSH's server in inetd mode, its byte stream carried over the
guest channel and a WebSocket to `stasis ssh-proxy`, which is the client's ProxyCommand.

Each session is one ``sshd -i`` process in the sandbox, started by the agent with its stdin and
stdout as the connection; while it runs, the sandbox is in use (never idle-suspended). A sandbox's
host key is the daemon's own record (``$STASIS_HOME/ssh-host-keys/<sandbox id>``), made on first use
and written into the sandbox for each session: nothing the sandbox writes ever becomes what a client
trusts. A fork or a restore is a new sandbox id and so gets its own. The client learns the key over
stasis itself (``GET .../ssh/host-key``), so there is nothing to accept on first contact.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path

from fastapi import WebSocket, WebSocketDisconnect

from ... import hostpath, procs
from ...errors import GuestDisconnected, InvalidRequest, StasisError, Unsupported
from ...guest import protocol as P
from ...guest.client import GuestChannel
from ..core.service import SandboxService

log = logging.getLogger(__name__)

KEY_DIR = "/run/stasis-ssh"  # in the sandbox: where each session's copy of the host key is written
SESSION_BUFFER = 16 << 20  # bytes of sshd output the agent holds for a reader that lags; more ends the session
NO_SSHD = 127
WRITE_BATCH = 1 << 20  # bytes of client frames sent to sshd in one write
# Session ids carry this daemon's own prefix: a running session with another prefix was started by a
# daemon that is gone, and nobody will ever read it.
SESSION_PREFIX = f"ssh-{secrets.token_hex(3)}-"
KEY_TYPES = r"ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp(256|384|521)|sk-\S+@openssh\.com"
PUBLIC_KEY = re.compile(rf"^({KEY_TYPES}) [A-Za-z0-9+/=]+( \S.*)?$")

_SERVE = """set -e
[ -x /usr/sbin/sshd ] || {{
  echo "stasis: this image has no OpenSSH server (/usr/sbin/sshd); install openssh-server in it" >&2; exit {missing}; }}
mkdir -p /run/sshd
exec /usr/sbin/sshd -i -e -h {key} -o UsePAM=no -o PasswordAuthentication=no \
-o KbdInteractiveAuthentication=no -o PermitRootLogin=prohibit-password -o AuthorizedKeysFile=.ssh/authorized_keys \
-o LogLevel=ERROR
"""
_AUTHORIZE = """set -e
mkdir -p /root/.ssh && chmod 700 /root/.ssh
f=/root/.ssh/authorized_keys
touch "$f" && chmod 600 "$f"
while IFS= read -r key; do grep -qxF "$key" "$f" || printf '%s\\n' "$key" >> "$f"; done
"""


class HostKeys:
    """Each sandbox's SSH host key pair, kept by the daemon (0600 under a 0700 directory)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    async def get(self, sandbox_id: str) -> tuple[bytes, str]:
        """(the private key file, the public key line), made now if the sandbox has none yet."""
        folder = hostpath.child(self.directory, sandbox_id, "sandbox id", hostpath.SANDBOX_ID)
        private = folder / "ssh_host_ed25519_key"
        if not private.exists():
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".new-", dir=self.directory))
            try:
                made = await procs.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"stasis-{sandbox_id}",
                                        "-f", str(staging / private.name)], timeout=60)  # fmt: skip
                if made.returncode != 0:
                    raise StasisError(f"ssh-keygen failed: {made.stderr.decode(errors='replace').strip()[-300:]}")
                with contextlib.suppress(OSError):  # two sessions at once: the first rename wins
                    os.rename(staging, folder)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        public = (folder / "ssh_host_ed25519_key.pub").read_text().split()
        return private.read_bytes(), f"{public[0]} {public[1]}"

    def forget(self, live_ids: set[str]) -> None:
        """Remove the keys of sandboxes that are gone."""
        for folder in self.directory.glob("sb-*") if self.directory.exists() else []:
            if folder.name not in live_ids:
                shutil.rmtree(folder, ignore_errors=True)


async def host_key(service: SandboxService, keys: HostKeys, ref: str) -> str:
    """The sandbox's SSH host public key, from the daemon's record (made now if it has none yet)."""
    info = service.get(ref)
    keys.forget({sandbox.id for sandbox in service.records()})
    return (await keys.get(info.id))[1]


async def authorize(service: SandboxService, ref: str, keys: list[str]) -> None:
    """Add public keys to root's authorized_keys in the sandbox (each once)."""
    for key in keys:
        if not PUBLIC_KEY.match(key) or "\n" in key:
            raise InvalidRequest(f"not an OpenSSH public key line: {key[:60]!r}; pass the contents of a .pub file")
    data = base64.b64encode("".join(k + "\n" for k in keys).encode()).decode()
    async with service.guest(ref) as channel:
        result = await channel.call(P.Exec(cmd=["/bin/sh", "-c", _AUTHORIZE], stdin=True, stdin_data=data, timeout=60))
    _check(result)


def _check(result: P.ExecResult) -> None:
    if result.exit_code == 0:
        return
    stderr = base64.b64decode(result.stderr).decode(errors="replace").strip()
    if result.exit_code == NO_SSHD:
        raise Unsupported(stderr)
    raise StasisError(f"preparing SSH in the sandbox failed (exit {result.exit_code}): {stderr[-500:]}")


async def serve_session(service: SandboxService, keys: HostKeys, websocket: WebSocket, ref: str) -> None:
    """One SSH connection: binary frames both ways are the SSH byte stream."""
    sandbox_id = service.get(ref).id
    session = SESSION_PREFIX + secrets.token_hex(6)
    private, _ = await keys.get(sandbox_id)
    key_path = f"{KEY_DIR}/ssh_host_ed25519_key"
    async with service.guest(ref) as channel:  # held in use (never idle-suspended) while connected
        await _end_orphans(channel)
        # Written anew for each session, over whatever the sandbox left there: a key it planted or changed
        # makes sshd answer with a key the client does not trust, and the client refuses to go on.
        await channel.call(P.WriteFile(path=key_path, data=base64.b64encode(private).decode(), mode=0o600))
        start = P.StartProcess(
            cmd=["/bin/sh", "-c", _SERVE.format(key=key_path, missing=NO_SSHD)],
            id=session,
            stdin=True,
            max_output=SESSION_BUFFER,
        )
        await channel.call(start)
        loop = asyncio.get_running_loop()
        pending: asyncio.Queue[bytes] = asyncio.Queue()
        downstream = loop.create_task(_to_client(channel, websocket, session))
        upstream = loop.create_task(_to_server(channel, pending, session))
        try:
            while not upstream.done():
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message.get("bytes"):
                    pending.put_nowait(message["bytes"])
        except (WebSocketDisconnect, GuestDisconnected):
            pass
        finally:
            for task in (downstream, upstream):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, StasisError):
                    await task
            await _hang_up(channel, session)


async def _hang_up(channel: GuestChannel, session: str) -> None:
    """End a session as a dropped connection would: sshd sees EOF and exits; what the user left running
    on purpose (a tmux server, nohup) lives on. Only a server that does not go is killed (itself alone).
    Each step goes on whatever the one before it said: a session whose input is already gone is still ended."""
    try:
        await channel.call(P.WriteStdin(id=session, close=True))
    except StasisError as exc:
        log.info("SSH session %s: closing its input: %s", session, exc)
    for _ in range(50):
        try:
            if (await channel.call(P.GetProcess(id=session))).status != "running":
                return
        except StasisError:
            return  # gone, or the sandbox is: nothing left to end
        await asyncio.sleep(0.1)
    log.warning("SSH session %s did not end on EOF within 5s; killing its server", session)
    try:
        await channel.call(P.SignalProcess(id=session, signal="SIGKILL", tree=False))
    except StasisError as exc:
        log.warning("SSH session %s: killing its server failed: %s", session, exc)


async def _end_orphans(channel: GuestChannel) -> None:
    """Hang up sessions of daemons that are gone (killed): nobody will ever read them."""
    listing = await channel.call(P.ListProcesses())
    for proc in listing.processes:
        orphan = proc.id.startswith("ssh-") and not proc.id.startswith(SESSION_PREFIX)
        if orphan and proc.status == "running":
            log.info("hanging up orphaned SSH session %s", proc.id)
            await _hang_up(channel, proc.id)


async def _to_server(channel: GuestChannel, pending: asyncio.Queue[bytes], session: str) -> None:
    """Write what the client sent to sshd's stdin; frames that queued up meanwhile go in one write."""
    while True:
        batch = [await pending.get()]
        size = len(batch[0])
        while size < WRITE_BATCH and not pending.empty():
            batch.append(pending.get_nowait())
            size += len(batch[-1])
        await channel.call(P.WriteStdin(id=session, data=base64.b64encode(b"".join(batch)).decode()))


async def _to_client(channel: GuestChannel, websocket: WebSocket, session: str) -> None:
    out = err = 0
    errors = b""
    try:
        while True:
            read = P.ReadStreams(id=session, stdout_offset=out, stderr_offset=err, max_bytes=1 << 20, wait=10)
            reply = await channel.call(read, timeout=60)
            if reply.stdout.lost:
                await websocket.close(code=1011, reason="the SSH client fell too far behind; reconnect")
                return
            if data := base64.b64decode(reply.stdout.data):
                await websocket.send_bytes(data)
            errors = (errors + base64.b64decode(reply.stderr.data))[-2000:]
            out, err = reply.stdout.next_offset, reply.stderr.next_offset
            if reply.exit_code is not None and reply.stdout.eof:
                text = errors.decode(errors="replace").strip()
                if text:
                    log.debug("sshd in session %s: %s", session, text)
                if reply.exit_code == NO_SSHD:
                    await websocket.close(code=4400, reason=text[-120:])
                else:
                    await websocket.close(code=1000, reason="the SSH session ended")
                return
    except (GuestDisconnected, WebSocketDisconnect, RuntimeError):
        with contextlib.suppress(Exception):
            await websocket.close(code=1011, reason="the sandbox went away")
