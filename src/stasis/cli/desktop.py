"""`stasis desktop screenshot|click|type|press|open`: a desktop sandbox from the command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ..sdk import Sandbox
from ._common import Name, app, client, err, out

desktop_app = typer.Typer(help="A desktop sandbox (image `desktop`): its screen, mouse, keyboard and browser.",
                          no_args_is_help=True)  # fmt: skip
app.add_typer(desktop_app, name="desktop")


@desktop_app.command("screenshot")
def screenshot(
    name: Name,
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the PNG ('-': stdout).")],
) -> None:
    """Save the screen as PNG."""
    with err.status(f"taking a screenshot of {name}..."):
        png = Sandbox.connect(name, client=client()).screenshot()
    if str(output) == "-":
        sys.stdout.buffer.write(png)
        return
    output.write_bytes(png)
    out.print(f"wrote {output} ({len(png)} bytes)")


@desktop_app.command("click")
def click(
    name: Name,
    x: Annotated[int, typer.Argument(help="Pixels from the left.")],
    y: Annotated[int, typer.Argument(help="Pixels from the top.")],
    button: Annotated[str, typer.Option(help="left, middle or right.")] = "left",
    double: Annotated[bool, typer.Option("--double", help="A double click.")] = False,
) -> None:
    """Click at X, Y."""
    mouse = Sandbox.connect(name, client=client()).mouse
    mouse.double_click(x, y) if double else mouse.click(x, y, button=button)


@desktop_app.command("type")
def type_text(name: Name, text: Annotated[str, typer.Argument(help="What to type, as keystrokes.")]) -> None:
    """Type TEXT into the focused window."""
    Sandbox.connect(name, client=client()).keyboard.type(text)


@desktop_app.command("press")
def press(name: Name, keys: Annotated[list[str], typer.Argument(help="Key combinations: ctrl+l Return.")]) -> None:
    """Press keys, in turn."""
    Sandbox.connect(name, client=client()).keyboard.press(*keys)


@desktop_app.command("open")
def open_url(name: Name, url: Annotated[str, typer.Argument(help="http(s)://, file:/ or about:.")]) -> None:
    """Open URL in the desktop's browser."""
    Sandbox.connect(name, client=client()).open(url)
