"""Test hosts: network namespaces this test session makes, each a host with servers on it.

Tests send traffic only to these (and to loopback): never to any other address. Each host is a
namespace joined to the host's own by a veth pair; addresses come from the documentation ranges
(203.0.113.0/24, 198.51.100.0/24) and from 10.77.0.0/16 (a private range), in a block (a slot)
that this session holds a lock on, so that two sessions (or xdist workers) on one machine never
share addresses.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SERVER = Path(__file__).with_name("testhost_server.py")
PREFIX = "stasis-testhost-"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass
class TestHost:
    __test__ = False

    name: str
    address: str  # the host's address inside its namespace
    peer: str  # the address on our side of the veth (one of this machine's own addresses)
    pids: list[int] = field(default_factory=list)
    tls: TestTls | None = None  # its HTTPS server's CA and request log, if it serves one

    @property
    def netns(self) -> str:
        return f"{PREFIX}{os.getpid()}-{self.name}"

    @property
    def outside(self) -> str:
        """Its link's end on this host."""
        return f"sth{os.getpid() % 100000}{self.name[:4]}"

    def up(self) -> TestHost:
        ns, outside = self.netns, self.outside
        _ip("netns", "add", ns)
        _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("addr", "add", f"{self.peer}/30", "dev", outside)
        _ip("link", "set", outside, "up")
        _ip("-n", ns, "addr", "add", f"{self.address}/30", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "route", "add", "default", "via", self.peer)
        return self

    def _serve(self, *args: str) -> None:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, sys.executable, str(SERVER), *args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.pids.append(proc.pid)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready", f"{args[0]} on {self.name}"

    def serve_http(self, port: int = 80) -> TestHost:
        self._serve("http", str(port), self.name)
        return self

    def serve_https(self, cert: Path, log: Path, port: int = 443) -> TestHost:
        self._serve("https", str(port), str(cert), str(log))
        return self

    def serve_dns(self, zone: dict[str, str], port: int = 53) -> TestHost:
        self._serve("dns", str(port), json.dumps(zone))
        return self

    def down(self) -> None:
        if self.tls is not None:
            shutil.rmtree(self.tls.directory, ignore_errors=True)
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self.pids.clear()
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)  # removes its veth too


@dataclass
class TestTls:
    """The suite's own CA (the daemon trusts it through STASIS_UPSTREAM_CA) and what the HTTPS server logged."""

    __test__ = False

    directory: Path
    names: tuple[str, ...]  # the names its certificate holds

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def chain(self) -> Path:
        return self.directory / "server.pem"

    @property
    def log(self) -> Path:
        return self.directory / "requests.jsonl"

    def requests(self) -> list[dict]:
        """Every request the HTTPS server received, as it received it."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def make(self) -> TestTls:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        def name(cn: str) -> x509.Name:
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

        now = datetime.datetime.now(datetime.UTC)
        ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        issuer = name("stasis test-host CA")
        ca = (x509.CertificateBuilder().subject_name(issuer).issuer_name(issuer)
              .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))  # fmt: skip
        leaf = (x509.CertificateBuilder().subject_name(name(self.names[0])).issuer_name(ca.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in self.names]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
                .sign(ca_key, hashes.SHA256()))  # fmt: skip
        pem = serialization.Encoding.PEM
        self.ca.write_bytes(ca.public_bytes(pem))
        self.chain.write_bytes(leaf.public_bytes(pem) + key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))  # fmt: skip
        return self


SLOTS = 60
_held_slot: tuple[int, int] | None = None  # (slot, the fd whose lock holds it) for the session


def _slot() -> int:
    global _held_slot
    if _held_slot is None:
        locks = Path("/run/lock") if Path("/run/lock").is_dir() else Path(tempfile.gettempdir())
        for i in range(SLOTS):
            slot = (os.getpid() + i) % SLOTS
            fd = os.open(locks / f"stasis-testhost-slot-{slot}", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            _held_slot = (slot, fd)
            break
        else:
            raise RuntimeError(f"all {SLOTS} test-host address slots are held by other test sessions")
    return _held_slot[0]


def blocks() -> tuple[str, str, str]:
    """Three /30 bases of this session: in 203.0.113/24, 198.51.100/24 and 10.77/16."""
    slot = _slot()
    return f"203.0.113.{slot * 4}", f"198.51.100.{slot * 4}", f"10.77.{slot}.0"


def _plus(base: str, n: int) -> str:
    head, last = base.rsplit(".", 1)
    return f"{head}.{int(last) + n}"


TLS_NAMES = ("api.secret.test", "echo.secret.test")


def make_hosts() -> dict[str, TestHost]:
    """``web`` (HTTP, HTTPS as the names of ``TLS_NAMES``, and DNS for the *.test zone), ``other`` (HTTP,
    another public range) and ``private`` (HTTP in 10.77/16)."""
    public, other, private = blocks()
    remove_stale(public, other, private)
    hosts = {
        "web": TestHost("web", _plus(public, 2), _plus(public, 1)),
        "other": TestHost("other", _plus(other, 2), _plus(other, 1)),
        "private": TestHost("private", _plus(private, 2), _plus(private, 1)),
    }
    web = hosts["web"]
    web.tls = TestTls(Path(tempfile.mkdtemp(prefix="stasis-testtls-")), TLS_NAMES).make()
    try:
        for host in hosts.values():
            host.up().serve_http()
        hosts["other"].serve_http(443)  # plain HTTP: a TLS client gets past the proxy only to fail here
        web.serve_https(web.tls.chain, web.tls.log)
        zone = {
            "allowed.test": hosts["web"].address,
            "www.allowed.test": hosts["web"].address,
            "denied.test": hosts["other"].address,
            "*.wild.test": hosts["other"].address,
            "private.test": hosts["private"].address,
            **{name: web.address for name in (*TLS_NAMES, "mismatch.secret.test")},  # not in its certificate
        }
        hosts["web"].serve_dns(zone)
    except BaseException:
        for host in hosts.values():
            host.down()
        raise
    return hosts


def remove_stale(*bases: str) -> None:
    """Undo what a session killed before its teardown left in the slot we now hold (its lock died with it):
    links on this host with the slot's addresses (their namespaces go with them), and the namespaces of
    sessions that are gone. Left in place, a stale link answers for our addresses and our hosts are unreachable."""
    ours = {_plus(base, 1) for base in bases}
    for line in subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout.splitlines():
        fields = line.split()
        device, address = fields[1].split("@")[0], fields[3].split("/")[0]
        if address in ours and device.startswith("sth"):
            subprocess.run(["ip", "link", "del", device], check=False)
    run = Path("/run/netns")
    for namespace in run.iterdir() if run.is_dir() else []:
        pid = namespace.name.removeprefix(PREFIX).split("-")[0]
        if namespace.name.startswith(PREFIX) and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            subprocess.run(["ip", "netns", "del", namespace.name], check=False)


def leftover_namespaces() -> list[str]:
    run = Path("/run/netns")
    return [p.name for p in run.iterdir() if p.name.startswith(f"{PREFIX}{os.getpid()}-")] if run.is_dir() else []
