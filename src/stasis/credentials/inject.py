"""Putting secrets into a request on its way out: its head (always) and its body (where a secret says so).

In a header's value, each placeholder of a secret bound to the host becomes the secret's value, also inside
``Authorization: Basic`` (base64 of user:password, as git sends a token). A secret with a ``header`` sets that
header on every request to its hosts (replacing the sandbox's), and a sandbox's ``egress_headers`` rules
(E2B's network transforms) set theirs. The request line (the URL) is never rewritten: a server that echoes a
path in an error would hand the value back to the sandbox.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass, field

from ..secretnames import REFERENCE

BASIC = (b"authorization", b"proxy-authorization")


@dataclass(frozen=True)
class Bound:
    """One secret as the proxy applies it to one request: read at the request, so a rotation counts at once."""

    name: str
    placeholder: bytes | None  # None: the sandbox holds no placeholder (an E2B header rule names it)
    value: bytes
    header: bytes | None = None
    formatted: bytes | None = None
    body: bool = False


@dataclass
class Injection:
    """What to do to the requests of one connection, read anew for each request."""

    secrets: list[Bound]
    headers: dict[bytes, tuple[bytes, list[str]]] = field(default_factory=dict)  # lower name -> (line, secrets)

    @property
    def body(self) -> bool:
        return any(s.body and s.placeholder for s in self.secrets)


def header_rules(rules: dict[str, str], value_of: Callable[[str], str | None]) -> dict[bytes, tuple[bytes, list[str]]]:
    """A sandbox's header rules with ``${secrets.NAME}`` resolved; a rule naming a removed secret is dropped (it
    must not go out with a literal reference in it)."""
    out: dict[bytes, tuple[bytes, list[str]]] = {}
    for header, template in rules.items():
        names = REFERENCE.findall(template)
        values = {name: value_of(name) for name in names}
        if any(v is None for v in values.values()):
            continue
        text = REFERENCE.sub(lambda m, values=values: values[m.group(1)] or "", template)
        out[header.lower().encode()] = (f"{header}: {text}".encode(), names)
    return out


def rewrite_head(head: bytes, injection: Injection) -> tuple[bytes, set[str]]:
    """The request head with the secrets put in, and the names of those it used."""
    lines = head[:-4].split(b"\r\n") if head.endswith(b"\r\n\r\n") else head.split(b"\r\n")
    set_here = dict(injection.headers)
    for s in injection.secrets:
        if s.header is not None and s.formatted is not None:
            set_here[s.header.lower()] = (s.header + b": " + s.formatted, [s.name])
    used: set[str] = set()
    out = [lines[0]]
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        key = name.strip().lower()
        if colon and key in set_here:
            continue  # replaced below
        if colon:
            value = _replace(value, injection.secrets, used, basic=key in BASIC)
        out.append(name + colon + value)
    for line, names in set_here.values():
        out.append(line)
        used.update(names)
    return b"\r\n".join(out) + b"\r\n\r\n", used


def replace_body(data: bytes, injection: Injection, used: set[str]) -> bytes:
    for s in injection.secrets:
        if s.body and s.placeholder and s.placeholder in data:
            data = data.replace(s.placeholder, s.value)
            used.add(s.name)
    return data


def _replace(value: bytes, secrets: list[Bound], used: set[str], basic: bool) -> bytes:
    for s in secrets:
        if s.placeholder and s.placeholder in value:
            value = value.replace(s.placeholder, s.value)
            used.add(s.name)
    if basic and (stripped := value.strip()).lower().startswith(b"basic "):
        try:
            decoded = base64.b64decode(stripped[6:], validate=True)
        except (binascii.Error, ValueError):
            return value
        replaced = _replace(decoded, secrets, used, basic=False)
        if replaced != decoded:
            return b" Basic " + base64.b64encode(replaced)
    return value
