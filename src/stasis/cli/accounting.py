"""`stasis usage` and `stasis audit`: what each team used, and who did what."""

from __future__ import annotations

import csv
import json
import re
import sys
import time
from typing import Annotated

import typer
from rich.table import Table

from ..sdk import team as teams
from ._common import Json, app, client, out, printable

AGO = re.compile(r"^([0-9]+)([smhd])$")


def _since(text: str | None) -> float | None:
    """24h / 30m / 7d ago, or a unix time."""
    if text is None:
        return None
    if match := AGO.match(text):
        return time.time() - int(match[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]
    try:
        return float(text)
    except ValueError:
        raise typer.BadParameter(f"--since {text!r}: write 30m, 24h, 7d or a unix time") from None


@app.command(hidden=True)  # on the front page through `team`'s line (it fits one screen)
def usage(
    team: Annotated[str | None, typer.Option("--team", help="One team's.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="30m, 24h, 7d or a unix time (default 24h).")] = None,
    as_csv: Annotated[bool, typer.Option("--csv", help="One row per sandbox, as CSV.")] = False,
    as_json: Json = False,
) -> None:
    """Usage per team and per sandbox: running and suspended time, CPU burnt, memory, disk, checkpoints, egress."""
    report = teams.usage(client=client(), team=team, since=_since(since))
    if as_json:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
        return
    if as_csv:
        fields = list(type(report.sandboxes[0]).model_fields) if report.sandboxes else ["sandbox_id"]
        writer = csv.DictWriter(sys.stdout, fieldnames=fields)
        writer.writeheader()
        for row in report.sandboxes:
            writer.writerow(row.model_dump())
        return
    table = Table(box=None, header_style="bold")
    columns = ("TEAM", "SANDBOXES", "RUNNING", "SUSPENDED", "CPU-S", "MEM GIB-S", "DISK GIB-H", "CKPT GIB-H", "EGRESS")
    for column in columns:
        table.add_column(column)
    for t in report.teams:
        table.add_row(t.team or "(owner)", str(t.sandboxes), f"{t.running_seconds:.0f}s",
                      f"{t.suspended_seconds:.0f}s", f"{t.cpu_seconds:.1f}", f"{t.memory_gib_seconds:.0f}",
                      f"{t.disk_gib_hours:.2f}", f"{t.checkpoint_gib_hours:.3f}", _bytes(t.egress_bytes))  # fmt: skip
    out.print(table if report.teams else "no usage in that window")


def _bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


@app.command(hidden=True)  # on the front page through `team`'s line
def audit(
    team: Annotated[str | None, typer.Option("--team", help="One team's.")] = None,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new entries.")] = False,
    as_json: Json = False,
) -> None:
    """The audit log: who (the owner or a team's key) did what to which resource, when, from where."""
    after, c = 0, client()
    while True:
        entries = teams.audit(client=c, after=after, team=team)
        for e in entries:
            if as_json:
                print(json.dumps(e), flush=True)
            else:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at"]))
                who = f"{e['team']}/{e['key_id']}" if e["team"] else e["key_id"] or "owner"
                line = f"{when}  {who:24} {e['client'] or '-':21} {e['method']:6} {e['status']}  {e['path']}"
                out.print(printable(line), markup=False, highlight=False)  # a path is anyone's text
            after = e["seq"]
        if not follow:
            return
        time.sleep(1.0)
