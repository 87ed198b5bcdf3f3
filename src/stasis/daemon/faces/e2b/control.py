"""E2B's control plane (its OpenAPI spec, as the SDKs call it) over the E2B room: the app, its key check and
its errors; the routes are :mod:`.sandbox_routes` and :mod:`.snapshot_routes`.

Errors are E2B's: ``{"code": status, "message": ...}`` with the same status, which the SDKs turn into their own
exceptions (404 NotFoundException, 401 AuthenticationException, 400 InvalidArgumentException...).
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .... import tracing
from ....body_limits import BodyLimit, e2b_upload
from ....errors import StasisError, echo
from . import event_routes, sandbox_routes, secret_routes, snapshot_routes, template_routes, volume_routes
from .plane import ControlPlane, error
from .room import Defaults, E2bRoom
from .template_routes import signed_upload
from .tenancy import audited, principal_of_key, refused
from .volume_routes import CONTENT as VOLUME_CONTENT
from .volume_routes import UNAUTHORIZED as VOLUME_UNAUTHORIZED
from .volume_routes import token_holder


def create_control_app(room: E2bRoom, defaults: Defaults, domain: str | None = None) -> FastAPI:
    app = FastAPI(title="stasis: E2B's API", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.plane = ControlPlane(room, defaults, domain)

    @app.middleware("http")
    async def api_key(request: Request, call_next):  # type: ignore[no-untyped-def]
        query = dict(request.query_params)
        signed = request.method == "PUT" and signed_upload(room.keys.api_key, request.url.path, query)
        if request.url.path.startswith(VOLUME_CONTENT):  # the volume's own token, before any body is read
            if not token_holder(room, request.url.path, request.headers.get("authorization")):
                return error(401, VOLUME_UNAUTHORIZED)
            return await call_next(request)
        if signed:
            return await call_next(request)
        started = time.monotonic()
        principal = principal_of_key(room, request.headers.get("x-api-key"))
        if principal is None:
            answer = error(401, "Invalid API key: use the E2B_API_KEY that `stasis e2b serve` printed, or a team's key")
        elif (refusal := refused(room, request, principal)) is not None:
            answer = refusal
        else:
            with tracing.incoming(dict(request.headers)):  # a traceparent sent makes the spans the caller's
                answer = await call_next(request)
        audited(room, request, principal, answer.status_code, started)
        return answer

    @app.exception_handler(StasisError)
    async def stasis_error(request: Request, exc: StasisError) -> JSONResponse:
        return error(exc.status_code, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors()[:5])
        return error(400, f"invalid request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = "not part of E2B's API as stasis serves it" if exc.status_code == 404 else str(exc.detail)
        return error(exc.status_code, f"{request.method[:16]} {echo(request.url.path)}: {message}")

    app.add_middleware(BodyLimit, streamed=e2b_upload)  # a JSON body bounded before it is read, a key or not
    app.include_router(sandbox_routes.router)
    app.include_router(template_routes.router)
    app.include_router(volume_routes.router)  # before the snapshots': DELETE /templates/tags is not a template's id
    app.include_router(snapshot_routes.router)
    app.include_router(secret_routes.router)
    app.include_router(event_routes.router)
    return app
