"""What every CLI module shares: the app, its consoles, and how times and states are shown."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.status import Status

from ..models import SandboxInfo
from ..sdk import Client
from .quick import ago as ago  # shared with the quick path
from .quick import printable as printable

app = typer.Typer(
    help="Stateful sandboxes for AI agents: suspend one with its processes, resume it where it was.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Piped or redirected, lines are as long as they need to be (a table is never cut at 80 columns for a script).
out = Console(width=None if sys.stdout.isatty() else 400)
err = Console(stderr=True)

Json = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
Name = Annotated[str, typer.Argument(help="Sandbox name or id.")]
RULES = "an IP, a CIDR, a hostname, *.suffix or *; repeat the option for more"
AllowOut = Annotated[
    list[str] | None, typer.Option("--allow-out", help=f"Only these destinations (default deny): {RULES}.")
]
DenyOut = Annotated[list[str] | None, typer.Option("--deny-out", help=f"Never these (deny wins): {RULES}.")]


def client() -> Client:
    return Client()


def shown(value: object, *, lines: bool = False) -> str:
    """Text a sandbox (or anyone but this user) chose, for Rich: control characters escaped (:func:`printable`),
    and never read as markup."""
    return escape(printable(str(value), lines=lines))


def in_(ts: float) -> str:
    seconds = max(0, ts - time.time())
    return f"in {seconds:.0f}s" if seconds < 120 else f"in {seconds / 60:.0f}m"


STATUS_STYLE = {"running": "green", "suspended": "cyan", "failed": "red", "terminated": "dim"}


def status(info: SandboxInfo) -> str:
    style = STATUS_STYLE.get(info.status.value, "yellow")
    return f"[{style}]{info.status.value}[/{style}]"


class _ToStatus(logging.Handler):
    def __init__(self, status: Status) -> None:
        super().__init__(logging.INFO)
        self.status = status

    def emit(self, record: logging.LogRecord) -> None:
        self.status.update(escape(record.getMessage()[:110]))


@contextlib.contextmanager
def first_use_builds_shown(status: Status) -> Iterator[None]:
    """What the SDK logs while it builds a built-in image on its first use (minutes, once), shown on ``status``."""
    logger = logging.getLogger("stasis.sdk._sync")
    handler, level = _ToStatus(status), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
