"""The Typer app: every command of `stasis`, registered by one module per group of commands."""

from __future__ import annotations

import sys

from ..errors import StasisError

# isort: off
# Each module registers its commands; the order of these imports is the order of `stasis --help`.
from . import sandboxes, code, desktop, network, ssh, checkpoints, pools, secrets  # noqa: F401
from . import accounting, agent, host, console, remote, e2b, fleet, teams, verbs, volumes, webhooks  # noqa: F401

# isort: on
from ._common import app, err, shown
from .overview import apply

apply(app)

__all__ = ["app", "main"]


def main() -> None:
    try:
        app()
    except StasisError as exc:
        err.print(f"[red]error:[/red] {shown(exc.message, lines=True)}", highlight=False)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
