"""The name a client asks for in its first bytes: TLS SNI (port 443) or the HTTP Host header (port 80)."""

from __future__ import annotations

import struct

PEEK_PORTS = {80: "http", 443: "tls"}
PEEK_BYTES = 16384


def tls_server_name(data: bytes) -> str | None:
    """The server_name of a TLS ClientHello, or None (not TLS, no SNI, or cut short)."""
    try:
        if len(data) < 5 or data[0] != 0x16:  # a handshake record
            return None
        pos = 5
        if data[pos] != 0x01:  # ClientHello
            return None
        pos += 4 + 2 + 32  # handshake header, version, random
        pos += 1 + data[pos]  # session id
        pos += 2 + struct.unpack_from("!H", data, pos)[0]  # cipher suites
        pos += 1 + data[pos]  # compression methods
        end = pos + 2 + struct.unpack_from("!H", data, pos)[0]
        pos += 2
        while pos + 4 <= end:
            kind, length = struct.unpack_from("!HH", data, pos)
            pos += 4
            if kind == 0:  # server_name: list length, type, name length, name
                name_length = struct.unpack_from("!H", data, pos + 3)[0]
                return data[pos + 5 : pos + 5 + name_length].decode("ascii").lower()
            pos += length
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return None


def http_host(data: bytes) -> str | None:
    """The Host header's name (without the port) of an HTTP/1 request head, or None."""
    head = data.split(b"\r\n\r\n", 1)[0]
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"host":
            host = value.strip().decode("ascii", "replace").lower()
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host.strip("[]")
    return None


def complete(kind: str, data: bytes) -> bool:
    """Whether ``data`` holds enough to find the name (a whole ClientHello record, a whole request head)."""
    if kind == "http":
        return b"\r\n\r\n" in data or len(data) >= PEEK_BYTES
    if len(data) < 5:
        return False
    return data[0] != 0x16 or len(data) >= 5 + struct.unpack_from("!H", data, 3)[0]


def claimed_name(kind: str, data: bytes) -> str | None:
    return http_host(data) if kind == "http" else tls_server_name(data)
