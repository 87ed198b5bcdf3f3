"""Making a sandbox trust its CA: the system's store, and the variables Python, Node, curl, git and pip read.

Written through the guest agent's file operations (no process started, no shell needed in the image):

    /etc/stasis/ca.crt                                  the CA alone (NODE_EXTRA_CA_CERTS adds it to Node's)
    /etc/stasis/ca-bundle.crt                           the system's bundle and the CA (SSL_CERT_FILE, ...)
    /usr/local/share/ca-certificates/stasis-sandbox.crt so a later update-ca-certificates keeps it
    /etc/ssl/certs/ca-certificates.crt                  the system bundle, with the CA in a marked block
    /etc/profile.d/stasis-secrets.sh                    the variables, and the placeholders, for login shells

Done again (idempotent: the marked block is replaced) whenever the CA the daemon holds for the sandbox is
not the one it last installed there.
"""

from __future__ import annotations

import base64
import secrets
import shlex

from ..errors import FileNotFound
from ..guest import protocol as P
from ..guest.client import GuestChannel

CA_FILE = "/etc/stasis/ca.crt"
BUNDLE = "/etc/stasis/ca-bundle.crt"
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
OTHER_BUNDLES = ("/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")  # Fedora/RHEL, Alpine: read, not changed
LOCAL_CA = "/usr/local/share/ca-certificates/stasis-sandbox.crt"
PROFILE = "/etc/profile.d/stasis-secrets.sh"
BEGIN, END = b"# BEGIN stasis sandbox CA\n", b"# END stasis sandbox CA\n"

TRUST_ENV = {
    "SSL_CERT_FILE": BUNDLE,  # Python's ssl, OpenSSL-based tools
    "REQUESTS_CA_BUNDLE": BUNDLE,
    "CURL_CA_BUNDLE": BUNDLE,
    "GIT_SSL_CAINFO": BUNDLE,
    "PIP_CERT": BUNDLE,
    "NODE_EXTRA_CA_CERTS": CA_FILE,
}


def sandbox_env(placeholders: dict[str, str]) -> dict[str, str]:
    """What every command in a sandbox with secrets runs with: the trust variables and the placeholders."""
    return {**TRUST_ENV, **placeholders}


def without_block(bundle: bytes) -> bytes:
    start = bundle.find(BEGIN)
    if start < 0:
        return bundle
    end = bundle.find(END, start)
    return bundle[:start] + (bundle[end + len(END) :] if end >= 0 else b"")


async def install(channel: GuestChannel, ca_pem: bytes, placeholders: dict[str, str]) -> None:
    """An image without any system bundle gets one holding the CA alone: install ca-certificates in it to
    verify other hosts through the variables above."""
    system = await _read(channel, SYSTEM_BUNDLE)
    base = without_block(system) if system is not None else b""
    for other in OTHER_BUNDLES if system is None else ():
        if (found := await _read(channel, other)) is not None:
            base = without_block(found)
            break
    block = BEGIN + ca_pem + END
    await _write(channel, CA_FILE, ca_pem)
    await _write(channel, LOCAL_CA, ca_pem)
    await _write(channel, BUNDLE, base.rstrip(b"\n") + b"\n" + block if base else block)
    if system is not None:
        await _write(channel, SYSTEM_BUNDLE, base.rstrip(b"\n") + b"\n" + block)
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(sandbox_env(placeholders).items()))
    header = "# made by stasis: the sandbox's CA and its secrets' placeholders\n"
    await _write(channel, PROFILE, (header + exports).encode())


async def _read(channel: GuestChannel, path: str) -> bytes | None:
    data, offset = b"", 0
    try:
        while True:
            chunk = await channel.call(P.ReadFile(path=path, offset=offset))
            data += base64.b64decode(chunk.data)
            offset = len(data)
            if chunk.eof:
                return data
    except FileNotFound:
        return None


async def _write(channel: GuestChannel, path: str, data: bytes) -> None:
    upload = secrets.token_hex(8)
    await channel.call(P.WriteFile(path=path, data=base64.b64encode(data).decode(), upload_id=upload, mode=0o644))
