"""`stasis team create|ls|set|rm` and `stasis key create|ls|revoke`: tenants of one daemon and their keys."""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Annotated, Any

import typer
from rich.table import Table

from ..sdk import team as teams
from ..team_models import SCOPE_HELP
from ._common import Json, app, client, out

team_app = typer.Typer(help="Teams: tenants of this daemon, each with its quotas and keys.", no_args_is_help=True)
key_app = typer.Typer(help="Keys: a team's way in (STASIS_TOKEN=KEY with STASIS_URL).", no_args_is_help=True)
app.add_typer(team_app, name="team")
app.add_typer(key_app, name="key", hidden=True)  # on the front page through `team`'s line (it fits one screen)
TeamName = Annotated[str, typer.Argument(help="The team's name.")]
QUOTAS = {"max_running": int, "max_cpus": float, "max_memory_mb": int, "max_disk_mb": int, "max_lifetime_secs": int,
          "max_checkpoint_mb": int}  # fmt: skip
Limit = Annotated[str | None, typer.Option(help="A number, or 'none' for no limit.")]
DURATION = re.compile(r"^([0-9]+)([smhd]?)$")


def _limits(**given: str | None) -> dict[str, Any]:
    limits = {}
    for field, value in given.items():
        if value is not None:
            try:
                limits[field] = None if value.lower() == "none" else QUOTAS[field](value)
            except ValueError:
                raise typer.BadParameter(f"--{field.replace('_', '-')} {value!r}: give a number, or none") from None
    return limits


def _quota_text(quotas: Any) -> str:
    shown = [
        f"{k.removeprefix('max_').replace('_', '-')} {v:g}" for k, v in quotas.model_dump().items() if v is not None
    ]
    return ", ".join(shown) or "no limits"


@team_app.command("create")
def team_create(
    name: TeamName, max_running: Limit = None, max_cpus: Limit = None, max_memory_mb: Limit = None,
    max_disk_mb: Limit = None, max_lifetime_secs: Limit = None, max_checkpoint_mb: Limit = None,
) -> None:  # fmt: skip
    """Create a team (quotas: sandboxes running at once, their CPUs, memory and disks together, a sandbox's
    longest lifetime, its checkpoints' size)."""
    limits = _limits(max_running=max_running, max_cpus=max_cpus, max_memory_mb=max_memory_mb,
                     max_disk_mb=max_disk_mb, max_lifetime_secs=max_lifetime_secs,
                     max_checkpoint_mb=max_checkpoint_mb)  # fmt: skip
    info = teams.create_team(name, client=client(), **limits)
    out.print(f"created team [bold]{info.name}[/bold] ({_quota_text(info.quotas)}); make it a key with "
              f"`stasis key create --team {info.name}`")  # fmt: skip


@team_app.command("ls")
def team_ls(as_json: Json = False) -> None:
    """List the teams and their quotas."""
    found = teams.list_teams(client=client())
    if as_json:
        sys.stdout.write(json.dumps([t.model_dump(mode="json") for t in found], indent=2) + "\n")
        return
    for info in found:
        out.print(f"{info.name:20} {_quota_text(info.quotas)}", highlight=False)
    if not found:
        out.print("no teams; make one with `stasis team create NAME`")


@team_app.command("set")
def team_set(
    name: TeamName, max_running: Limit = None, max_cpus: Limit = None, max_memory_mb: Limit = None,
    max_disk_mb: Limit = None, max_lifetime_secs: Limit = None, max_checkpoint_mb: Limit = None,
) -> None:  # fmt: skip
    """Change a team's quotas (those not given are kept; 'none' removes one)."""
    limits = _limits(max_running=max_running, max_cpus=max_cpus, max_memory_mb=max_memory_mb,
                     max_disk_mb=max_disk_mb, max_lifetime_secs=max_lifetime_secs,
                     max_checkpoint_mb=max_checkpoint_mb)  # fmt: skip
    if not limits:
        raise typer.BadParameter("give at least one quota: " + ", ".join(f"--{q.replace('_', '-')}" for q in QUOTAS))
    info = teams.set_quotas(name, client=client(), **limits)
    out.print(f"team [bold]{info.name}[/bold]: {_quota_text(info.quotas)}")


@team_app.command("rm")
def team_rm(name: TeamName) -> None:
    """Remove a team (refused while it has sandboxes); its keys stop working."""
    teams.remove_team(name, client=client())
    out.print(f"removed team [bold]{name}[/bold]")


def _seconds(text: str) -> int:
    match = DURATION.match(text.strip())
    if match is None:
        raise typer.BadParameter(f"--expires {text!r}: write a duration such as 3600, 90m, 12h or 30d")
    return int(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]


@key_app.command("create")
def key_create(
    team: Annotated[str, typer.Option("--team", help="The team the key belongs to.")],
    scope: Annotated[list[str] | None, typer.Option("--scope", help=f"Repeatable. {SCOPE_HELP}.")] = None,
    expires: Annotated[str | None, typer.Option("--expires", help="It stops working after: 3600, 12h, 30d.")] = None,
    description: Annotated[str, typer.Option("--description", help="What it is for.")] = "",
    as_json: Json = False,
) -> None:
    """Make a key for a team; it is printed this once (only its hash is kept)."""
    seconds = _seconds(expires) if expires else None
    made = teams.create_key(team, scope or ["read", "write", "exec"], client=client(), expires_in_secs=seconds,
                            description=description)  # fmt: skip
    if as_json:
        shown = {"key": made.key, "id": made.id, "team": made.team, "scopes": made.scopes}
        sys.stdout.write(json.dumps(shown) + "\n")
        return
    out.print(f"key [bold]{made.id}[/bold] of team {made.team} ({', '.join(made.scopes)}); it is shown only now:")
    print(made.key)


@key_app.command("ls")
def key_ls(team: Annotated[str | None, typer.Option("--team")] = None, as_json: Json = False) -> None:
    """List keys (never the keys themselves): team, scopes, expiry, last use, and the key that made each."""
    found = teams.list_keys(client=client(), team=team)
    if as_json:
        sys.stdout.write(json.dumps([k.model_dump(mode="json") for k in found], indent=2) + "\n")
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "TEAM", "SCOPES", "EXPIRES", "STATE", "LAST USED", "MADE BY"):
        table.add_column(column)
    now = time.time()
    for k in found:
        state = "revoked" if k.revoked_at else "expired" if k.expires_at and k.expires_at <= now else "active"
        expires = time.strftime("%Y-%m-%d %H:%M", time.localtime(k.expires_at)) if k.expires_at else "never"
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(k.last_used_at)) if k.last_used_at else "-"
        table.add_row(k.id, k.team, ",".join(k.scopes), expires, state, used, k.made_by or "owner")
    out.print(table if found else "no keys; make one with `stasis key create --team TEAM`")


@key_app.command("revoke")
def key_revoke(key_id: Annotated[str, typer.Argument(help="The key's id (`stasis key ls`).")]) -> None:
    """Revoke a key: it, and every key it made (and theirs), stop working at once; their open terminals close."""
    teams.revoke_key(key_id, client=client())
    out.print(f"revoked key [bold]{key_id}[/bold] and the keys it made (`stasis key ls` shows each key's maker)")
