"""The stasis guest agent: the one process that runs *inside* every sandbox.

Standard library only: its directory (this file, ``protocol.py`` and the modules
named in ``AGENT_FILES``) is made visible inside the sandbox read-only at
``/opt/stasis`` and started by ``boot.py`` with the image's ``python3`` as the
sandbox's init (pid 1). It speaks the JSON-lines
protocol of :mod:`protocol` on stdin/stdout, which the host backs with FIFOs
(gVisor) or a virtio-serial port (microVM), and dispatches every request through
``protocol.OPERATIONS``.

The agent never exits when the host goes away: a reply written while nobody listens
waits in the pipe for the next client, and commands keep running with their output
kept under their id. Each boot has a random ``boot_id``; a request addressed to
another boot (left in a pipe across a reboot) is refused, never executed.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from . import protocol as P
from . import sudo
from .changes import pack_changes
from .commands import Commands
from .fence import Fence
from .fence import setup as setup_fence
from .files import Files, remove_interrupted_uploads, write_atomic
from .hostclock import host_seconds
from .processes import ProcessTable, RequestError, start_thread, write_all
from .terminals import Terminals
from .watches import Watches

RNDADDENTROPY = 0x40085203  # _IOW('R', 0x03, int[2])
RNDRESEEDCRNG = 0x5207  # _IO('R', 0x07)
BEFORE_IDENTITY = frozenset({"health", "identity"})  # need not wait for the identity files to be written
NO_SPACE_ERRNOS = (28, 122)  # ENOSPC, EDQUOT
OS_ERROR_KINDS = {
    FileNotFoundError: P.ErrorKind.FILE_NOT_FOUND,
    IsADirectoryError: P.ErrorKind.IS_A_DIRECTORY,
    NotADirectoryError: P.ErrorKind.NOT_A_DIRECTORY,
    FileExistsError: P.ErrorKind.FILE_EXISTS,
    PermissionError: P.ErrorKind.PERMISSION,
}


def late(expires: float) -> bool:
    """Whether the host's ``expires`` has passed. gVisor's clock is the host's; a microVM's is set on each resume,
    but lags after its QEMU was stopped or starved, so there the host's clock is asked (its RTC) before a request
    that looks in time runs."""
    if time.time() > expires:
        return True
    host = host_seconds()
    return host is not None and host > expires


def read_batches(fd: int) -> Iterator[list[bytes]]:
    """The whole lines of a byte stream (maybe non-blocking, never ending), a batch at a time: each
    batch holds all that had arrived, so that a cancel line is seen together with the request it names."""
    pending = b""
    while True:
        chunk = read_some(fd, wait=1.0)
        if not chunk:  # FIFOs: never EOF (held open); a virtio-serial port: while no host is connected
            time.sleep(0.02)
            continue
        pending += chunk
        while more := read_some(fd, wait=0):
            pending += more
        *lines, pending = pending.split(b"\n")
        if lines:
            yield lines


def read_some(fd: int, wait: float) -> bytes:
    if not select.select([fd], [], [], wait)[0]:
        return b""
    try:
        return os.read(fd, 1 << 20)
    except BlockingIOError:
        return b""


def without_cancelled(lines: list[bytes]) -> list[bytes]:
    """The requests of a batch, less those a cancel line in the same batch names (and the cancel lines)."""
    cancels = [line for line in lines if line.startswith(P.CANCEL_PREFIX)]
    if not cancels:
        return lines
    cancelled = {message_field(line, "cancel") for line in cancels}
    kept = []
    for line in lines:
        if line.startswith(P.CANCEL_PREFIX):
            continue
        if (req_id := message_field(line, "id")) in cancelled:
            print(f"stasis agent: request {req_id} was cancelled before it ran", file=sys.stderr)
            continue
        kept.append(line)
    return kept


def message_field(line: bytes, key: str) -> Any:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message.get(key) if isinstance(message, dict) else None


def error_kind(exc: OSError) -> str:
    if exc.errno in NO_SPACE_ERRNOS:
        return P.ErrorKind.NO_SPACE
    for cls, kind in OS_ERROR_KINDS.items():
        if isinstance(exc, cls):
            return kind
    return P.ErrorKind.OS_ERROR


class Agent:
    def __init__(self, reader_fd: int, writer_fd: int, fence: Fence | None = None) -> None:
        self.reader_fd = reader_fd
        self.writer_fd = writer_fd
        self.write_lock = threading.Lock()
        self.procs = ProcessTable(fence)
        self.started_at = time.time()
        self.boot_id = os.urandom(8).hex()  # not `secrets`: its import (OpenSSL) costs a boot ~10-40 ms
        self.identity_written = threading.Event()  # commands see the new identity's files, never the old ones
        self.identity_written.set()
        commands, terminals, files = Commands(self.procs), Terminals(self.procs), Files()
        watches = Watches()
        self.handlers: dict[type[P.Operation[Any]], Callable[[Any], Any]] = {
            P.Health: self.health,
            P.Sync: self.sync,
            P.SetIdentity: self.identity,
            P.Exec: commands.exec,
            P.ExecStatus: commands.exec_status,
            P.StartProcess: commands.start,
            P.ConnectPort: commands.connect,
            P.ListProcesses: commands.list,
            P.GetProcess: commands.get,
            P.ReadStreams: commands.read_streams,
            P.ReadOutput: commands.read_output,
            P.SignalProcess: commands.signal,
            P.WriteStdin: commands.write_stdin,
            P.OpenPty: terminals.open,
            P.WritePty: terminals.write,
            P.ResizePty: terminals.resize,
            P.ClosePty: terminals.close,
            P.ReadFile: files.read,
            P.WriteFile: files.write,
            P.ListDir: files.list,
            P.StatFile: files.stat,
            P.DeleteFile: files.delete,
            P.MakeDir: files.mkdir,
            P.ExtractTar: files.extract,
            P.PackTar: files.pack,
            P.ListFifos: files.fifos,
            P.PackChanges: pack_changes,
            P.StartWatch: watches.start,
            P.ReadWatch: watches.read,
            P.StopWatch: watches.stop,
        }
        assert set(self.handlers) == set(P.OPERATIONS.values()), "every operation has a handler"

    # -- plumbing

    def serve(self) -> None:
        self.procs.start_reaping()
        for batch in read_batches(self.reader_fd):
            for line in without_cancelled(batch):
                if not line.strip():
                    continue
                try:
                    start_thread(self.handle, line)
                except RequestError:  # out of threads: still answer, from this thread
                    self.handle(line)

    def handle(self, line: bytes) -> None:
        req_id: Any = None
        try:
            request = json.loads(line)
            req_id = request.get("id")
            reply = {"id": req_id, "ok": True, "result": P.encode(self.dispatch(request), keep_none=True)}
        except RequestError as exc:
            reply = {"id": req_id, "ok": False, "error": {"type": exc.kind, "message": str(exc)}}
        except OSError as exc:
            message = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
            reply = {"id": req_id, "ok": False, "error": {"type": error_kind(exc), "message": message}}
        except Exception as exc:  # an agent bug must not kill the sandbox's init
            import traceback

            traceback.print_exc(file=sys.stderr)
            reply = {"id": req_id, "ok": False, "error": {"type": P.ErrorKind.AGENT_BUG, "message": repr(exc)}}
        data = json.dumps(reply, separators=(",", ":")).encode() + b"\n"
        with self.write_lock:
            write_all(self.writer_fd, data)

    def dispatch(self, request: dict[str, Any]) -> Any:
        name = request.get("op")
        op = P.OPERATIONS.get(str(name))
        if op is None:
            raise RequestError(P.ErrorKind.UNKNOWN_OPERATION, f"unknown operation {name!r} (agent version {P.VERSION})")
        boot = request.get("boot")
        if boot and boot != self.boot_id:
            raise RequestError(P.ErrorKind.STALE, f"request for boot {boot} reached boot {self.boot_id}: not executed")
        try:
            args = P.decode(op, request.get("args") or {})
        except TypeError as exc:
            raise RequestError(P.ErrorKind.INVALID, f"bad arguments for {name!r}: {exc}") from exc
        if op.op not in BEFORE_IDENTITY:
            self.identity_written.wait(10)
            expires = request.get("expires")
            if isinstance(expires, int | float) and late(expires):
                # The host gave up on it (the agent was stopped or starved): an error was reported, so it
                # must never run.
                raise RequestError(P.ErrorKind.EXPIRED, f"{name!r} reached the agent after the host stopped waiting")
        return self.handlers[op](args)

    # -- the agent itself

    def health(self, req: P.Health) -> P.HealthInfo:
        return P.HealthInfo(P.VERSION, os.getpid(), time.time() - self.started_at, self.boot_id)

    def sync(self, req: P.Sync) -> P.Empty:
        os.sync()
        return P.Empty()

    def identity(self, req: P.SetIdentity) -> P.IdentityInfo:
        """Make a machine restored from a shared memory image its own: wall clock, hostname,
        machine id, and a kernel RNG reseeded with fresh host entropy (its state was copied too)."""
        if req.time is not None:
            time.clock_settime(time.CLOCK_REALTIME, float(req.time))
        files: dict[str, tuple[bytes, int]] = {}
        if req.hostname:
            socket.sethostname(str(req.hostname))
            files["/etc/hostname"] = ((str(req.hostname) + "\n").encode(), 0o644)
            if (hosts := hosts_naming(str(req.hostname))) is not None:  # its own name resolves (sudo asks)
                files["/etc/hosts"] = (hosts, 0o644)
        if req.machine_id:
            files["/etc/machine-id"] = ((str(req.machine_id) + "\n").encode(), 0o444)
        if files:  # written (and fsynced) while the host goes on: this is on the path to a new sandbox's first exec
            self.identity_written.clear()
            start_thread(self._write_identity, files)
        if req.entropy:
            seed = base64.b64decode(req.entropy)
            with open("/dev/urandom", "wb") as rng:
                # struct rand_pool_info {int entropy_count; int buf_size; u32 buf[];}, credited in bits
                fcntl.ioctl(rng, RNDADDENTROPY, struct.pack("ii", len(seed) * 8, len(seed)) + seed)
                fcntl.ioctl(rng, RNDRESEEDCRNG)
        return P.IdentityInfo(hostname=socket.gethostname(), time=time.time(), boot_id=self.boot_id)

    def _write_identity(self, files: dict[str, tuple[bytes, int]]) -> None:
        try:
            for path, (data, mode) in files.items():
                try:
                    write_atomic(path, data, mode)
                except OSError as exc:
                    print(f"stasis agent: cannot write {path}: {exc}", file=sys.stderr)
        finally:
            self.identity_written.set()


HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{name}\n"


def hosts_naming(name: str) -> bytes | None:
    """/etc/hosts with its 127.0.1.1 line naming ``name`` (added if it has none); None if it already does or
    cannot be read."""
    if os.path.islink("/etc/hosts"):  # the image's own arrangement: left alone
        return None
    try:
        with open("/etc/hosts") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    own = f"127.0.1.1\t{name}"
    kept = [line for line in lines if line.split()[:1] != ["127.0.1.1"]]
    if own in lines and len(kept) == len(lines) - 1:
        return None
    return ("\n".join([*kept, own]) + "\n").encode()


def ensure_hosts() -> None:
    """An /etc/hosts where the image has none (debootstrap's and many OCI images' have none): without it
    `localhost` resolves nowhere in a sandbox without network. Written once, then the sandbox's own file.
    Only as a sandbox's init."""
    if os.getpid() != 1 or os.path.lexists("/etc/hosts"):
        return
    try:  # no fsync: a file lost to a crash is written again at the next boot
        with open("/etc/hosts.stasis-tmp", "w") as f:
            f.write(HOSTS.format(name=socket.gethostname()))
        os.replace("/etc/hosts.stasis-tmp", "/etc/hosts")
    except OSError as exc:
        print(f"stasis agent: cannot write /etc/hosts: {exc}", file=sys.stderr)


def sync_hostname() -> None:
    """/etc/hostname says the sandbox's name (the image's says where it was built), and /etc/hosts resolves it.
    Only as a sandbox's init."""
    if os.getpid() != 1:
        return
    name = socket.gethostname()
    if (hosts := hosts_naming(name)) is not None:
        try:
            write_atomic("/etc/hosts", hosts)
        except OSError as exc:
            print(f"stasis agent: cannot write /etc/hosts: {exc}", file=sys.stderr)
    try:
        with open("/etc/hostname") as f:
            if f.read().strip() == name:
                return
    except OSError:
        pass
    try:
        write_atomic("/etc/hostname", (name + "\n").encode())
    except OSError as exc:
        print(f"stasis agent: cannot write /etc/hostname: {exc}", file=sys.stderr)


def main() -> None:
    # Inherited descriptors above stdio would be captured by a checkpoint; drop them.
    os.closerange(3, 4096)
    # pid 1 stays up until the runtime stops the sandbox. A handler, not SIG_IGN: an ignored signal
    # would be inherited by every command, and `kill -TERM` or Ctrl-C would stop working in them.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    os.chdir("/")
    ensure_hosts()  # before the first command: it may ask for localhost at once
    agent = Agent(sys.stdin.fileno(), sys.stdout.fileno(), setup_fence() if os.getpid() == 1 else None)
    threading.Thread(target=remove_interrupted_uploads, daemon=True).start()
    threading.Thread(target=sync_hostname, daemon=True).start()
    sudo.start(agent.procs)  # where the backend asks (gVisor: no setuid) and the image names its sudo users
    agent.serve()


if __name__ == "__main__":
    main()
