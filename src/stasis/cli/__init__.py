"""`stasis`: the command line. A thin shell over the SDK, one module per group of commands.

`stasis ls` and `stasis run` in their plain forms go through `quick` (the standard library only, so they
answer in tens of milliseconds); everything else, and anything `quick` declines, through the Typer app in
`commands`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .commands import app

__all__ = ["app", "main"]


def main() -> None:
    from . import quick

    code = quick.main(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from .commands import main as typer_main

    typer_main()


def __getattr__(name: str) -> Any:
    if name == "app":
        from .commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
