"""Whether a browser says it opened a connection from the page of this very host and port."""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.requests import HTTPConnection


def same_origin(connection: HTTPConnection) -> bool:
    """The browser's Origin names this very host and port (a page of another port is another origin,
    though the same site for cookies). A client that is not a browser sends none: it has no cookie to
    ride on either, and still needs the session and its CSRF token."""
    origin = connection.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc.lower() == connection.headers.get("host", "").lower()
