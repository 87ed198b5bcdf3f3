"""`stasis secret add|ls|rm`: credentials a sandbox uses without ever holding them.

A value is read from stdin or a file, never from the command line (argv is visible to every process on the
host, and lands in shell history).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..sdk import Secret
from ._common import Json, app, client, out

secret_app = typer.Typer(
    help="Secrets: a sandbox holds a placeholder; the egress proxy puts the value into HTTPS requests to its hosts.",
    no_args_is_help=True,
)
app.add_typer(secret_app, name="secret")

SecretName = Annotated[str, typer.Argument(help="The secret's name: also the environment variable sandboxes see.")]


def _read_value(from_file: Path | None) -> str:
    if from_file is not None:
        raw = from_file.read_text()
    elif sys.stdin.isatty():
        import getpass

        raw = getpass.getpass("value (not echoed): ")
    else:
        raw = sys.stdin.read()
    value = raw.rstrip("\r\n")  # `echo TOKEN |` and files end with a newline that is not part of the value
    if not value:
        raise typer.BadParameter("the value is empty: pipe it on stdin (`... | stasis secret add`) or pass --from-file")
    return value


@secret_app.command("add")
def secret_add(
    name: SecretName,
    hosts: Annotated[
        list[str], typer.Option("--host", help="A host it is bound to (api.example.com, *.example.com); repeatable.")
    ],
    header: Annotated[
        str | None, typer.Option("--header", help="Set this header on each request to the hosts.")
    ] = None,
    format_: Annotated[
        str, typer.Option("--format", help="The header's value; {value} is the secret (e.g. 'Bearer {value}').")
    ] = "{value}",
    body: Annotated[bool, typer.Option("--body", help="Replace the placeholder in request bodies too.")] = False,
    from_file: Annotated[Path | None, typer.Option("--from-file", help="Read the value from this file.")] = None,
) -> None:
    """Add a secret (its value from stdin or --from-file), or rotate it: in use, it counts from the next request."""
    value = _read_value(from_file)
    existed = any(s.name == name for s in Secret.list(client=client()))
    info = Secret.add(name, value, hosts=hosts, header=header, format=format_, body=body, client=client())
    verb = f"rotated (version {info.version})" if existed else "added"
    out.print(f"secret [bold]{info.name}[/bold] {verb}, bound to {', '.join(info.hosts)}")
    if not existed:
        out.print(f"use it: stasis create NAME --network --secret {info.name}")


@secret_app.command("ls")
def secret_ls(as_json: Json = False) -> None:
    """List secrets: their hosts and how they go out, never their values."""
    secrets = Secret.list(client=client())
    if as_json:
        sys.stdout.write(json.dumps([s.model_dump(mode="json") for s in secrets], indent=2) + "\n")
        return
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "HOSTS", "GOES AS", "VERSION", "UPDATED"):
        table.add_column(column)
    for s in secrets:
        goes = f"{s.header}: {s.format}" if s.header else "in place of its placeholder"
        if s.body:
            goes += ", bodies too"
        updated = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.updated_at))
        table.add_row(s.name, ", ".join(s.hosts) or "-", goes, str(s.version), updated)
    out.print(table if secrets else "no secrets; add one with `stasis secret add NAME --host HOST < value-file`")


@secret_app.command("rm")
def secret_rm(name: SecretName) -> None:
    """Remove a secret: the placeholders sandboxes hold become inert at once."""
    Secret.remove(name, client=client())
    out.print(f"removed secret [bold]{name}[/bold]")
