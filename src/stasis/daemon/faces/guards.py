"""Errors as every HTTP answer gives them: ``{type, message, details}`` (who may ask: :mod:`.tenancy`)."""

from __future__ import annotations

import logging
import sqlite3

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...errors import InvalidRequest, NoSpace, NotFound, StasisError
from ...fsutil import no_space
from ...paths import Paths
from ...validation import describe_validation_errors
from .tenancy import PRINCIPAL

log = logging.getLogger(__name__)


def error_response(exc: StasisError, status_code: int | None = None) -> JSONResponse:
    return JSONResponse(exc.to_payload(), status_code=status_code or exc.status_code)


def map_errors(app: FastAPI, paths: Paths) -> None:
    @app.exception_handler(StasisError)
    async def stasis_error(request: Request, exc: StasisError) -> JSONResponse:
        return error_response(exc)

    async def storage_error(request: Request, exc: Exception) -> JSONResponse:
        """A full disk on the host (an OSError, or the store's "database or disk is full") is said so, with
        what to free; anything else is a daemon bug."""
        full = no_space(exc, paths.home)
        principal = request.scope.get(PRINCIPAL)
        tenant = principal is not None and principal.team is not None  # a team's key: no host paths, no errno text
        if isinstance(full, StasisError):
            if tenant:
                return error_response(NoSpace("the host's disk is full; ask the daemon's owner to free space"))
            return error_response(full)
        log.exception("unexpected error serving %s %s", request.method, request.url.path)
        if tenant:
            return error_response(StasisError("the daemon hit an unexpected error; its owner finds it in its log"))
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
