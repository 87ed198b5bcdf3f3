"""What every HTTP request passes: the API token over TCP, and errors as ``{type, message, details}``."""

from __future__ import annotations

import hmac
import logging
import sqlite3

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...errors import InvalidRequest, NotFound, StasisError
from ...fsutil import no_space
from ...paths import Paths
from ...validation import describe_validation_errors

log = logging.getLogger(__name__)


def error_response(exc: StasisError, status_code: int | None = None) -> JSONResponse:
    return JSONResponse(exc.to_payload(), status_code=status_code or exc.status_code)


def require_token(app: FastAPI, token: str) -> None:
    """Over TCP every request but the console's own login needs ``Authorization: Bearer <token>``; the unix
    socket's mode 0600 already guards it."""

    @app.middleware("http")
    async def check(request: Request, call_next):  # type: ignore[no-untyped-def]
        server = request.scope.get("server")
        if server is not None and server[1] is None:
            return await call_next(request)
        # the path routing uses (scope's), never one rebuilt from the Host header
        if request.scope["path"] == "/ui" or request.scope["path"].startswith("/ui/"):
            return await call_next(request)
        sent = request.headers.get("authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            refused = InvalidRequest("missing or wrong API token; send 'Authorization: Bearer $STASIS_TOKEN'")
            return error_response(refused, 401)
        return await call_next(request)


def map_errors(app: FastAPI, paths: Paths) -> None:
    @app.exception_handler(StasisError)
    async def stasis_error(request: Request, exc: StasisError) -> JSONResponse:
        return error_response(exc)

    async def storage_error(request: Request, exc: Exception) -> JSONResponse:
        """A full disk on the host (an OSError, or the store's "database or disk is full") is said so, with
        what to free; anything else is a daemon bug."""
        full = no_space(exc, paths.home)
        if isinstance(full, StasisError):
            return error_response(full)
        log.exception("unexpected error serving %s %s", request.method, request.url.path)
        return error_response(StasisError(f"the daemon hit an unexpected error: {exc}; see {paths.logfile}"))

    app.add_exception_handler(OSError, storage_error)
    app.add_exception_handler(sqlite3.OperationalError, storage_error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        cls = NotFound if exc.status_code == 404 else InvalidRequest
        message = f"no such route: {request.method} {request.url.path}" if exc.status_code == 404 else str(exc.detail)
        return error_response(cls(f"{message} (see /docs for the API)"), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(InvalidRequest(describe_validation_errors(list(exc.errors()))))
