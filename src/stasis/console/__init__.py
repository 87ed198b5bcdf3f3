"""The web console: every sandbox at a glance, its checkpoint tree, agent runs step by step, a terminal.

Served by the daemon under ``/ui``: server-rendered pages (Jinja2, everything from a sandbox escaped),
live status over Server-Sent Events, actions as form posts from the page's script, a terminal
(xterm.js, pinned and fetched from the npm registry by ``make setup``) on the daemon's PTY. Login is
the daemon's token typed into a form, then a cookie session; the token never appears in a URL.
"""

from __future__ import annotations

from .app import create_console

__all__ = ["create_console"]
