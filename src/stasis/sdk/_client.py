"""HTTP clients for the daemon: ``Client`` and ``AsyncClient`` share everything but the I/O.

By default they talk to ``$STASIS_HOME/stasis.sock`` and start the daemon if it
is not running. ``STASIS_URL`` (with ``STASIS_TOKEN``) points them at a daemon
served over TCP instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from ..errors import DaemonUnavailable, error_from_payload
from ..paths import Paths
from ._base import Call
from ._daemon import start_daemon

DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=None, write=60.0, pool=None)
DAEMON_START_TIMEOUT = 30.0


class _BaseClient:
    def __init__(self, paths: Paths | None = None, url: str | None = None, token: str | None = None) -> None:
        self.paths = paths or Paths.from_env()
        self.url = url or os.environ.get("STASIS_FLEET") or os.environ.get("STASIS_URL")  # a fleet's door first
        self.token = token or os.environ.get("STASIS_TOKEN")
        self.autostart = self.url is None

    def _client_kwargs(self) -> dict[str, Any]:
        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        return {"base_url": self.url or "http://stasis", "headers": headers, "timeout": DEFAULT_TIMEOUT}

    @staticmethod
    def _check(response: httpx.Response) -> httpx.Response:
        if response.is_success:
            return response
        try:
            payload = response.json()
        except ValueError:
            payload = {"type": "StasisError", "message": response.text or response.reason_phrase}
        if not isinstance(payload, dict) or "message" not in payload:
            payload = {"type": "StasisError", "message": str(payload)}
        raise error_from_payload(payload, response.status_code)

    def _unavailable(self, exc: Exception) -> DaemonUnavailable:
        where = self.url or str(self.paths.socket)
        return DaemonUnavailable(
            f"cannot reach the stasis daemon at {where}: {exc}; start it with `stasis serve` "
            f"(its log: {self.paths.logfile})"
        )


class Client(_BaseClient):
    def __init__(self, paths: Paths | None = None, url: str | None = None, token: str | None = None) -> None:
        super().__init__(paths, url, token)
        transport = None if self.url else httpx.HTTPTransport(uds=str(self.paths.socket))
        self._http = httpx.Client(transport=transport, **self._client_kwargs())

    def _send(self, method: str, path: str, stream: bool = False, **kwargs: Any) -> httpx.Response:
        """Send once; if nothing listens and we may, start the daemon and send again."""
        request = self._http.build_request(method, path, **kwargs)
        try:
            return self._http.send(request, stream=stream)
        except httpx.ConnectError as exc:
            if not self.autostart:
                raise self._unavailable(exc) from exc
            self._start_daemon()
            try:
                return self._http.send(request, stream=stream)
            except httpx.TransportError as retry_exc:
                raise self._unavailable(retry_exc) from retry_exc
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from exc

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self._check(self._send(method, path, **kwargs))

    def _start_daemon(self) -> None:
        start_daemon(self.paths)
        deadline = time.monotonic() + DAEMON_START_TIMEOUT
        while True:
            try:
                self._http.get("/v1/health")
                return
            except httpx.TransportError as exc:
                if time.monotonic() > deadline:
                    raise self._unavailable(exc) from exc
                time.sleep(0.05)

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    def call(self, call: Call) -> Any:
        """Carry out a recipe: send it, check the answer, parse it."""
        return call.parse(self.request(call.method, call.path, **call.kwargs))

    def stream_lines(self, call: Call) -> Iterator[dict[str, Any]]:
        """JSON lines of a streaming response, as they arrive."""
        response = self._send(call.method, call.path, stream=True, **call.kwargs)
        try:
            if not response.is_success:
                response.read()
                self._check(response)
            for line in response.iter_lines():
                yield from _event(line)
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from exc
        finally:
            response.close()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_BaseClient):
    def __init__(self, paths: Paths | None = None, url: str | None = None, token: str | None = None) -> None:
        super().__init__(paths, url, token)
        transport = None if self.url else httpx.AsyncHTTPTransport(uds=str(self.paths.socket))
        self._http = httpx.AsyncClient(transport=transport, **self._client_kwargs())

    async def _send(self, method: str, path: str, stream: bool = False, **kwargs: Any) -> httpx.Response:
        request = self._http.build_request(method, path, **kwargs)
        try:
            return await self._http.send(request, stream=stream)
        except httpx.ConnectError as exc:
            if not self.autostart:
                raise self._unavailable(exc) from exc
            await self._start_daemon()
            try:
                return await self._http.send(request, stream=stream)
            except httpx.TransportError as retry_exc:
                raise self._unavailable(retry_exc) from retry_exc
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from exc

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self._check(await self._send(method, path, **kwargs))

    async def _start_daemon(self) -> None:
        await asyncio.to_thread(start_daemon, self.paths)
        deadline = time.monotonic() + DAEMON_START_TIMEOUT
        while True:
            try:
                await self._http.get("/v1/health")
                return
            except httpx.TransportError as exc:
                if time.monotonic() > deadline:
                    raise self._unavailable(exc) from exc
                await asyncio.sleep(0.05)

    async def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return (await self.request(method, path, **kwargs)).json()

    async def call(self, call: Call) -> Any:
        return call.parse(await self.request(call.method, call.path, **call.kwargs))

    async def stream_lines(self, call: Call) -> AsyncIterator[dict[str, Any]]:
        response = await self._send(call.method, call.path, stream=True, **call.kwargs)
        try:
            if not response.is_success:
                await response.aread()
                self._check(response)
            async for line in response.aiter_lines():
                for event in _event(line):
                    yield event
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from exc
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _event(line: str) -> list[dict[str, Any]]:
    """One JSON line of a stream; a line carrying an error raises it."""
    if not line:
        return []
    event = json.loads(line)
    if "error" in event:
        raise error_from_payload(event["error"], 500)
    return [event]


__all__ = ["AsyncClient", "Client"]
