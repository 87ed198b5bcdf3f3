"""`stasis ui`: the web console in a browser."""

from __future__ import annotations

import socket
import sys
import webbrowser
from typing import Annotated

import typer

from ._common import app, client


@app.command()
def ui(
    port: Annotated[int, typer.Option("--port", help="Port on 127.0.0.1 (0: a free one).")] = 0,
    browser: Annotated[bool, typer.Option("--browser/--no-browser", help="Open it in a browser.")] = True,
) -> None:
    """The web console on 127.0.0.1: prints its URL and a login token, opens a browser, serves until Ctrl-C."""
    import uvicorn

    from ..sdk._host import console_token_call
    from .ui_proxy import proxy_app

    c = client()
    token = c.call(console_token_call())  # starts the daemon if it does not run
    if c.url:  # a daemon served over TCP serves the console itself
        url = c.url.rstrip("/") + "/ui/"
        _show(url, token, browser)
        return
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/ui/"
    _show(url, token, browser)
    config = uvicorn.Config(proxy_app(c.paths), log_level="warning", lifespan="on")
    try:
        uvicorn.Server(config).run(sockets=[listener])
    finally:
        listener.close()


def _show(url: str, token: str, browser: bool) -> None:
    sys.stdout.write(url + "\n")  # plain lines, never wrapped: scripts read them
    sys.stdout.flush()
    sys.stderr.write(f"log in with the token {token} (valid for 12 hours); Ctrl-C stops this\n")
    sys.stderr.flush()
    if browser:
        webbrowser.open(f"{url}login#token={token}")  # the fragment never reaches a server; the page drops it
