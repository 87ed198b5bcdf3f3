"""`stasis code NAME 'expr'`: code in a Jupyter kernel of the sandbox, the kernel kept for the next call."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ..sdk import Result, Sandbox
from ._common import Name, app, client, err


@app.command("code")
def code(
    name: Name,
    source: Annotated[str, typer.Argument(help="The code; - reads it from stdin.")],
    language: Annotated[str | None, typer.Option(help="python (the default) or bash.")] = None,
    context: Annotated[str | None, typer.Option(help="A context's id (a kernel of its own).")] = None,
    timeout: Annotated[float | None, typer.Option(help="Interrupt the kernel after this many seconds.")] = None,
    images: Annotated[Path, typer.Option(help="Where plots and other images are saved.")] = Path("."),
) -> None:
    """Run code in a Jupyter kernel of the sandbox (the code-interpreter image): output as it comes, the last
    expression's value, images saved to files. The kernel keeps its variables for the next `stasis code`, across
    suspends and restarts. Exits 1 when the code raised (its traceback on stderr)."""
    sbx = Sandbox.connect(name, client=client())
    text = sys.stdin.read() if source == "-" else source
    stamp = time.strftime("%Y%m%d-%H%M%S")
    saved: list[Path] = []

    def shown(result: Result) -> None:
        if (image := result.image()) is not None:
            images.mkdir(parents=True, exist_ok=True)
            path = images / f"{sbx.name or sbx.id}-{stamp}-{len(saved) + 1}.{image[0]}"
            path.write_bytes(image[1])
            saved.append(path)
            err.print(f"[dim]image saved to {path}[/dim]", highlight=False)
        elif not result.is_main_result and result.text is not None:
            print(result.text, flush=True)

    execution = sbx.run_code(
        text, language, context, timeout=timeout, on_result=shown,
        on_stdout=lambda part: print(part, end="", flush=True),
        on_stderr=lambda part: print(part, end="", file=sys.stderr, flush=True),
    )  # fmt: skip
    if execution.text is not None:
        print(execution.text)
    if execution.error is not None:
        err.print(execution.error.traceback or f"{execution.error.name}: {execution.error.value}", highlight=False)
        raise typer.Exit(1)
