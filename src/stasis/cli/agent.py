"""`stasis agent run|resume|ls|log`: the agent harness from the command line."""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import typer
from rich.table import Table

from ..errors import InvalidRequest
from ..paths import Paths
from ._common import Json, ago, app, client, err, out, shown

TOOL_RESULT_LINES = 8  # of a tool's result shown as a run streams (the log shows them all)
agent_app = typer.Typer(help="The agent harness: a tool-calling loop that runs inside a sandbox.", no_args_is_help=True)
app.add_typer(agent_app, name="agent")


def _runner(model: str | None = None):  # type: ignore[no-untyped-def]
    from ..agent import AgentRunner, Journal, OpenAIModel

    _check_endpoint()
    journal = Journal(Paths.from_env().agent_journal)
    return AgentRunner(journal, OpenAIModel(model=model), client(), on_event=_show_agent_event), journal


def _check_endpoint() -> None:
    """OPENAI_BASE_URL is set and answers: never a silent fall back to api.openai.com, never 25 s of retries
    against an address that does not answer before anyone hears of it."""
    import httpx

    base = os.environ.get("OPENAI_BASE_URL", "").rstrip("/")
    if not base:
        raise InvalidRequest(
            "OPENAI_BASE_URL is not set: point it at an OpenAI-compatible endpoint (e.g. http://127.0.0.1:8000/v1, "
            "or https://api.openai.com/v1 to use OpenAI itself), with OPENAI_API_KEY if it needs one"
        )
    try:
        httpx.get(f"{base}/models", timeout=5.0)  # any answer will do: the address is reachable
    except httpx.HTTPError as exc:
        raise InvalidRequest(f"the model endpoint {base} (OPENAI_BASE_URL) does not answer: {exc}") from None


def _show_agent_event(kind: str, data: dict[str, Any], full: bool = False) -> None:
    if kind == "model":
        message = data["message"]
        if message.get("content"):
            out.print(
                f"[bold]assistant[/bold] ({data['seconds']:.1f}s): {shown(message['content'], lines=True)}",
                highlight=False,
            )
    elif kind == "tool_call":
        out.print(f"[cyan]→ {shown(data['name'])}[/cyan] {shown(str(data['arguments'])[:200])}", highlight=False)
    elif kind == "tool_result":
        lines = data["content"].splitlines() or [""]
        kept = lines if full else lines[:TOOL_RESULT_LINES]
        more = len(lines) - len(kept)
        rest = f"\n  [dim](+{more} more lines; `stasis agent log` has them all)[/dim]" if more else ""
        body = "\n  ".join(shown(line[:200]) for line in kept)
        out.print(f"[green]← {body}[/green] [dim]({data['seconds']:.2f}s)[/dim]{rest}", highlight=False)
    elif kind == "final":
        style = "green" if data["status"] == "completed" else "red"
        out.print(f"[{style}]■ {data['status']}[/{style}]: {shown(data['text'], lines=True)}", highlight=False)


def _show_run(record: Any) -> None:
    err.print(f"run [bold]{record.id}[/bold] on {record.sandbox}: {record.status}")
    if record.status == "running":
        raise typer.Exit(3)
    if record.status != "completed":
        raise typer.Exit(1)


@agent_app.command("run")
def agent_run(
    task: Annotated[str, typer.Argument(help="What the agent should do.")],
    sandbox: Annotated[str, typer.Option("--sandbox", "-s", help="Sandbox name or id.")],
    model: Annotated[str | None, typer.Option(help="Model name (default: $STASIS_MODEL).")] = None,
    max_steps: Annotated[int, typer.Option("--max-steps", help="Model calls at most.")] = 30,
) -> None:
    """Run the agent on a task, streaming its steps. Needs OPENAI_BASE_URL / OPENAI_API_KEY."""
    runner, journal = _runner(model)
    record = runner.start(sandbox, task, max_steps=max_steps)
    journal.close()
    _show_run(record)


@agent_app.command("resume")
def agent_resume(run_id: Annotated[str, typer.Argument(help="The run to continue.")]) -> None:
    """Continue a run that was interrupted (killed, crashed), without repeating any step."""
    runner, journal = _runner(None)
    record = journal.run(run_id)
    runner.model.model = record.model
    record = runner.resume(run_id)
    journal.close()
    _show_run(record)


@agent_app.command("ls")
def agent_ls(as_json: Json = False) -> None:
    """List agent runs."""
    from ..agent import Journal

    runs = Journal(Paths.from_env().agent_journal).runs()
    if as_json:
        print(json.dumps([r.as_dict() for r in runs], indent=2))
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "STATUS", "SANDBOX", "MODEL", "TASK", "STARTED"):
        table.add_column(column, no_wrap=column != "TASK")
    for r in runs:
        table.add_row(r.id, r.status, r.sandbox, r.model, r.task[:60], ago(r.created_at))
    out.print(table if runs else "no agent runs; start one with `stasis agent run --sandbox NAME TASK`")


@agent_app.command("log")
def agent_log(run_id: Annotated[str, typer.Argument(help="Run id.")]) -> None:
    """The transcript of a run."""
    from ..agent import Journal

    journal = Journal(Paths.from_env().agent_journal)
    record = journal.run(run_id)
    out.print(f"[bold]{record.id}[/bold] on {record.sandbox} ({record.model}): {record.status}")
    out.print(f"[bold]task[/bold]: {shown(record.task, lines=True)}", highlight=False)
    for event in journal.events(run_id):
        if event.kind == "model_response":
            _show_agent_event("model", {"message": event.payload["message"], "seconds": event.seconds or 0})
        elif event.kind == "tool_call":
            _show_agent_event("tool_call", event.payload)
        elif event.kind == "tool_result":
            _show_agent_event("tool_result", {**event.payload, "seconds": event.seconds or 0}, full=True)
    if record.final is not None or record.error:
        _show_agent_event("final", {"status": record.status, "text": record.final or record.error})
    if record.checkpoints:
        out.print(f"checkpoints: {', '.join(record.checkpoints)}")
