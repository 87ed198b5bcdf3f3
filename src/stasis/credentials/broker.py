"""The egress proxy's part in secrets: which hosts a sandbox's secrets are bound to, and the interception.

For HTTPS to a bound host the proxy is the server the sandbox talks to (a certificate for the host, signed
by the sandbox's own CA) and a client of the real host (verified against the system's trust store, plus
``STASIS_UPSTREAM_CA``: a host whose certificate fails is refused). Between the two it reads the sandbox's
requests one at a time and puts the secrets in (:mod:`.inject`); responses go back as they come.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import ssl
from collections.abc import Callable, Iterator
from typing import Any

from ..models import SandboxSpec
from ..netpolicy import IPAddress, name_matches
from ..network.http1 import BadRequest, chunk_size, copy_exactly, field_line, parse_strictly
from ..network.relay import abort, pipe
from .authority import Authorities
from .inject import Bound, Injection, header_rules, replace_body, rewrite_head
from .store import SecretStore
from .tls import TlsServerStream

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
HANDSHAKE_TIMEOUT = 30.0  # the sandbox's side, on a loaded machine
BODY_LIMIT = 16 << 20  # a Content-Length body is read whole to put secrets in; a larger one goes as it is
HELD_LIMIT = 64 << 20  # bodies one sandbox may have the proxy hold at once, over all its connections


def upstream_context() -> ssl.SSLContext:
    """How the proxy verifies the real host: the system's trust store, and ``STASIS_UPSTREAM_CA`` if set."""
    context = ssl.create_default_context()
    if extra := os.environ.get("STASIS_UPSTREAM_CA"):
        context.load_verify_locations(cafile=extra)
    context.set_alpn_protocols(["http/1.1"])
    return context


class SecretBroker:
    def __init__(
        self,
        store_of: Callable[[str | None], SecretStore],
        authorities: Authorities,
        spec_of: Callable[[str], SandboxSpec | None],
    ) -> None:
        self.store_of = store_of  # a team's store for its sandboxes, the owner's for the owner's
        self.authorities = authorities
        self._spec_of = spec_of  # the sandbox's spec as stored
        self._specs: dict[str, SandboxSpec] = {}  # what secrets a sandbox has is fixed when it is made: read once
        self.upstream = upstream_context()
        self.held: dict[str, int] = {}  # bytes of bodies read whole, by sandbox, right now

    @contextlib.contextmanager
    def holding(self, sandbox_id: str, size: int) -> Iterator[None]:
        """Room for a body of ``size`` read whole; a sandbox past ``HELD_LIMIT`` at once is refused (a 400)."""
        if self.held.get(sandbox_id, 0) + size > HELD_LIMIT:
            raise BadRequest(f"the sandbox has the proxy hold {HELD_LIMIT >> 20} MiB of bodies at once already")
        self.held[sandbox_id] = self.held.get(sandbox_id, 0) + size
        try:
            yield
        finally:
            self.held[sandbox_id] -= size
            if not self.held[sandbox_id]:
                del self.held[sandbox_id]

    def spec_of(self, sandbox_id: str) -> SandboxSpec | None:
        if (spec := self._specs.get(sandbox_id)) is None and (spec := self._spec_of(sandbox_id)) is not None:
            self._specs[sandbox_id] = spec
        return spec

    def forget(self, sandbox_id: str) -> None:
        self._specs.pop(sandbox_id, None)

    # ------------------------------------------------------------ which secrets apply

    def bound(self, sandbox_id: str, host: str) -> bool:
        """Whether a secret of the sandbox (one that still exists) or one of its header rules is bound to ``host``."""
        spec = self.spec_of(sandbox_id)
        if spec is None or spec.ca_lineage is None:
            return False
        if any(name_matches(rule, host) for rule in spec.egress_headers):
            return True
        for name in spec.secrets:
            secret = self.store_of(spec.team).get(name)
            if secret is not None and any(name_matches(rule, host) for rule in secret.info.hosts):
                return True
        return False

    def injection(self, sandbox_id: str, names: set[str]) -> Injection:
        """What goes into a request naming ``names`` (the connection's TLS name, the request's Host and target):
        the secrets and header rules bound to every one of them, a rule's secret too if it is bound to hosts. The
        secrets as they are now: a rotation counts from the next request, a removal makes a placeholder inert."""
        spec = self.spec_of(sandbox_id)
        if spec is None or not names:
            return Injection([])

        def bound_to_all(rules: list[str]) -> bool:
            return all(any(name_matches(rule, name) for rule in rules) for name in names)

        store = self.store_of(spec.team)

        def rule_value(name: str) -> str | None:  # a secret bound to no host (E2B's) goes where its rules say
            secret = store.get(name)
            return secret.value if secret and (not secret.info.hosts or bound_to_all(secret.info.hosts)) else None

        bound = []
        for name, placeholder in spec.secrets.items():
            secret = store.get(name)
            if secret is None or not bound_to_all(secret.info.hosts):
                continue
            value, info = secret.value.encode(), secret.info
            header = info.header.encode() if info.header else None
            formatted = info.format.replace("{value}", secret.value).encode() if header else None
            bound.append(Bound(name, placeholder.encode(), value, header, formatted, info.body))
        headers: dict[bytes, tuple[bytes, list[str]]] = {}
        for rule, rules in spec.egress_headers.items():
            if bound_to_all([rule]):
                headers |= header_rules(rules, rule_value)
        return Injection(bound, headers)

    # ------------------------------------------------------------ the interception

    async def intercept(
        self,
        sandbox_id: str,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        first: bytes,
        destination: tuple[IPAddress, int],
        host: str,
        on_data: Callable[[], None],
    ) -> dict[str, Any]:
        """Serve one HTTPS connection to a bound host; what the audit line adds (bytes, secrets used, an error)."""
        reader, writer = client
        spec = self.spec_of(sandbox_id)
        assert spec is not None and spec.ca_lineage is not None
        authority = self.authorities.get(spec.ca_lineage)
        context = authority.made_context(host) or await asyncio.to_thread(authority.server_context, host)
        ip, port = destination
        tls = TlsServerStream(reader, writer, context, first)
        # Both handshakes at once; nothing the sandbox sends goes anywhere until the host's certificate passed.
        upstream, handshake = await asyncio.gather(
            asyncio.wait_for(asyncio.open_connection(str(ip), port, ssl=self.upstream, server_hostname=host),
                             CONNECT_TIMEOUT),
            asyncio.wait_for(tls.handshake(), HANDSHAKE_TIMEOUT),
            return_exceptions=True,
        )  # fmt: skip
        if isinstance(upstream, BaseException) or isinstance(handshake, BaseException):
            abort(writer)
            if not isinstance(upstream, BaseException):
                upstream[1].close()
            if isinstance(upstream, ssl.SSLCertVerificationError):
                return {"error": f"refused: {host}'s certificate failed verification ({upstream.verify_message})"}
            if isinstance(upstream, BaseException):
                return {"error": f"{host} unreachable over TLS from the host: {upstream or type(upstream).__name__}"}
            why = handshake or type(handshake).__name__
            return {"error": f"the sandbox's TLS handshake with the proxy failed (does it trust its CA?): {why}"}
        up_reader, up_writer = upstream
        used: set[str] = set()
        try:
            (sent, refused), received = await asyncio.gather(
                self._requests(tls, up_writer, sandbox_id, host, used, on_data), pipe(up_reader, tls, on_data)
            )
        finally:
            writer.close()
            up_writer.close()
        extra: dict[str, Any] = {"intercepted": True, "secrets": sorted(used), "bytes_out": sent, "bytes_in": received}
        if refused:
            log.info("%s: refused a request to %s (400): %s", sandbox_id, host, refused)
            extra["error"] = f"refused a request (400): {refused}"
        return extra

    async def _requests(
        self,
        client: TlsServerStream,
        upstream: asyncio.StreamWriter,
        sandbox_id: str,
        host: str,
        used: set[str],
        on_data: Callable[[], None],
    ) -> tuple[int, str | None]:
        """Forward the sandbox's requests with the secrets put in, until it is done; the bytes sent, and why a
        request was refused (the sandbox had a 400 and the connection ends)."""
        sent = 0
        try:
            while True:
                try:
                    head = await client.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return sent, None  # the sandbox is done
                on_data()
                request = parse_strictly(head)
                # Each request by the names it gives: one connection may name another host each time.
                injection = self.injection(sandbox_id, {host, *request.hosts}) if request.hosts else Injection([])
                head, names = rewrite_head(head, injection)
                used |= names
                body = request.body
                if body == "raw":  # an upgrade (a WebSocket): the rest is another protocol's
                    upstream.write(head)
                    return sent + len(head) + await pipe(client, upstream, on_data), None  # type: ignore[arg-type]
                if body == "chunked":
                    upstream.write(head)
                    hold = functools.partial(self.holding, sandbox_id)
                    sent += len(head) + await _copy_chunked(client, upstream, injection, used, hold)
                elif injection.body and 0 < int(body) <= BODY_LIMIT:  # a GET gains no Content-Length
                    head, expects = _buffered(head)
                    if expects:  # the host is not asked before the body is read: the proxy answers for it
                        client.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    with self.holding(sandbox_id, int(body)):
                        data = replace_body(await client.readexactly(int(body)), injection, used)
                    head = _with_length(head, len(data))
                    upstream.write(head + data)
                    sent += len(head) + len(data)
                else:
                    upstream.write(head)
                    sent += len(head) + await copy_exactly(client, upstream, int(body))
                await upstream.drain()
        except BadRequest as exc:
            with contextlib.suppress(ssl.SSLError, OSError):
                client.write(_refusal(str(exc)))
            return sent, str(exc)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError, ssl.SSLError):
            return sent, None
        finally:
            with contextlib.suppress(Exception):
                upstream.close()  # the sandbox is done: the host's answer to nothing is not awaited


def _refusal(why: str) -> bytes:
    text = f"stasis' egress proxy refused this request, which a host could read another way: {why}\n".encode()
    return (
        b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
        % (len(text), text)
    )


def _buffered(head: bytes) -> tuple[bytes, bool]:
    """A head whose body the proxy reads whole before sending it: without ``Expect: 100-continue`` (the client
    would wait for the host's 100 and the host never see the head), and whether it had one."""
    lines = head[:-4].split(b"\r\n")
    kept = [line for line in lines if not line.lower().startswith(b"expect:")]
    return b"\r\n".join(kept) + b"\r\n\r\n", len(kept) != len(lines)


def _with_length(head: bytes, length: int) -> bytes:
    lines = [line for line in head[:-4].split(b"\r\n") if not line.lower().startswith(b"content-length:")]
    return b"\r\n".join([*lines, b"Content-Length: %d" % length]) + b"\r\n\r\n"


async def _copy_chunked(
    client: TlsServerStream, upstream: asyncio.StreamWriter, injection: Injection, used: set[str],
    hold: Callable[[int], contextlib.AbstractContextManager[None]],
) -> int:  # fmt: skip
    """Chunk by chunk; with a body secret, each chunk has the placeholders in it replaced (and its size redone)."""
    sent = 0
    while True:
        line = await client.readuntil(b"\r\n")
        if (size := chunk_size(line)) == 0:
            upstream.write(line)
            sent += len(line)
            while (trailer := await client.readuntil(b"\r\n")) != b"\r\n":
                field_line(trailer[:-2])
                upstream.write(trailer)
                sent += len(trailer)
            upstream.write(b"\r\n")
            return sent + 2
        if not injection.body:  # passed on as it comes: a sandbox's chunk size never becomes the daemon's memory
            upstream.write(line)
            sent += len(line) + await copy_exactly(client, upstream, size)
            if await client.readexactly(2) != b"\r\n":
                raise BadRequest("a chunk's data not followed by CRLF")
            upstream.write(b"\r\n")
            sent += 2
            await upstream.drain()
            continue
        if size > BODY_LIMIT:
            raise BadRequest(f"a chunk of {size} bytes where a secret may be in the body (at most {BODY_LIMIT})")
        with hold(size + 2):
            chunk = await client.readexactly(size + 2)
        if not chunk.endswith(b"\r\n"):
            raise BadRequest("a chunk's data not followed by CRLF")
        chunk = replace_body(chunk[:-2], injection, used)
        framed = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
        upstream.write(framed)
        sent += len(framed)
        await upstream.drain()
