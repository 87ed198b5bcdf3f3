"""The CA a sandbox trusts for the hosts its secrets are bound to, and the certificates it signs.

One CA per lineage (a sandbox and its forks share it: a fork's processes trust what the parent's did). Its key
stays on the host (0600, in the daemon's home), never in a sandbox or a checkpoint; only its certificate goes
into the sandbox's trust stores. A host that lacks a lineage's CA (a sandbox moved here) makes a new one, and
the sandbox is given that one when it next starts here (:mod:`stasis.daemon.rooms.secrets`).
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import ssl
import tempfile
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..fsutil import atomic_write, private_dir
from ..secretnames import LINEAGE_PATTERN

log = logging.getLogger(__name__)

CA_YEARS = 10
LEAF_DAYS = 30  # a leaf is made again past half of this
MAX_LEAVES = 256  # per CA, kept in memory


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "stasis"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])  # fmt: skip


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Authority:
    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate, scratch: Path) -> None:
        self.key = key
        self.cert = cert
        self.scratch = scratch  # where a leaf's PEM files live for the moment ssl loads them
        self.cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        self.fingerprint = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()
        self._leaves: dict[str, tuple[ssl.SSLContext, datetime.datetime]] = {}
        self._lock = threading.Lock()

    @classmethod
    def create(cls, lineage: str, scratch: Path) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(f"stasis sandbox CA {lineage[:12]}"))
            .issuer_name(_name(f"stasis sandbox CA {lineage[:12]}"))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=365 * CA_YEARS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )  # fmt: skip
        return cls(key, cert, scratch)

    def made_context(self, host: str) -> ssl.SSLContext | None:
        """The context for ``host`` if it is made already (no key to generate: no need for a thread)."""
        kept = self._leaves.get(host)
        return kept[0] if kept is not None and kept[1] > _now() else None

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a certificate for ``host`` signed by this CA (made once, then kept)."""
        with self._lock:
            kept = self._leaves.get(host)
            if kept is not None and kept[1] > _now():
                return kept[0]
            context = self._make_context(host)
            if len(self._leaves) >= MAX_LEAVES:
                self._leaves.pop(next(iter(self._leaves)))
            self._leaves[host] = (context, _now() + datetime.timedelta(days=LEAF_DAYS // 2))
            return context

    def _make_context(self, host: str) -> ssl.SSLContext:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(host))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )  # fmt: skip
        pem = cert.public_bytes(serialization.Encoding.PEM) + self.cert_pem + _private_pem(key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])  # the proxy rewrites HTTP/1 requests: a client offering h2 falls back
        # ssl loads a chain only from a file: one that lives for this call, readable by the daemon alone
        with tempfile.NamedTemporaryFile(dir=self.scratch, suffix=".pem") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(pem)
            f.flush()
            context.load_cert_chain(f.name)
        return context


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())  # fmt: skip


class Authorities:
    """Every lineage's CA on this host: ``<directory>/<lineage>.pem`` (key and certificate, 0600)."""

    def __init__(self, directory: Path) -> None:
        self.directory = private_dir(directory)
        self._loaded: dict[str, Authority] = {}
        self._lock = threading.Lock()

    def get(self, lineage: str) -> Authority:
        """The lineage's CA: loaded, or made now (and kept) if this host has none."""
        if not LINEAGE_PATTERN.fullmatch(lineage):
            raise ValueError(f"not a CA lineage: {lineage[:80]!r}")
        with self._lock:
            if (authority := self._loaded.get(lineage)) is not None:
                return authority
            path = self.directory / f"{lineage}.pem"
            if path.exists():
                data = path.read_bytes()
                key = serialization.load_pem_private_key(data, password=None)
                assert isinstance(key, ec.EllipticCurvePrivateKey)
                authority = Authority(key, x509.load_pem_x509_certificate(data), self.directory)
            else:
                authority = Authority.create(lineage, self.directory)
                atomic_write(path, _private_pem(authority.key) + authority.cert_pem, mode=0o600)
                log.info("made the CA of lineage %s (%s)", lineage, authority.fingerprint[:16])
            self._loaded[lineage] = authority
            return authority
