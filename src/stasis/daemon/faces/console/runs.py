"""The console's agent runs (each run of the harness step by step, from its journal) and usage."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from ....agent.journal import Journal
from ....errors import NotFound, RunNotFound
from ....paths import Paths
from ...rooms.accounting import usage
from ..deps import Rooms
from .render import RoomsDep, page, session_of, to_login, visible

router = APIRouter()


@router.get("/runs", response_class=HTMLResponse, response_model=None)
async def runs(request: Request, rooms: RoomsDep) -> Response:
    if (session := session_of(request)) is None:
        return to_login()
    with _journal(rooms.paths) as journal:
        found = sorted(journal.runs(), key=lambda r: -r.created_at)
    return page(request, "runs.html", session, runs=visible(session, found, lambda r: _team(rooms, r.sandbox_id)))


@router.get("/runs/{run_id}", response_class=HTMLResponse, response_model=None)
async def run(request: Request, run_id: str, rooms: RoomsDep) -> Response:
    if (session := session_of(request)) is None:
        return to_login()
    with _journal(rooms.paths) as journal:
        try:
            record = journal.run(run_id)
        except RunNotFound:
            record = None
        if record is None or not session.principal.sees(_team(rooms, record.sandbox_id)):
            return page(request, "runs.html", session, runs=[], error=f"no agent run {run_id[:80]!r}")
        steps, notes = steps_of(journal.events(run_id)), journal.run_notes(run_id)
    return page(request, "run.html", session, run=record, steps=steps, notes=notes)


def _team(rooms: Rooms, sandbox_id: str) -> str | None:
    """The team of a run's sandbox (a run's journal is the host's: a team sees the runs on its own sandboxes)."""
    try:
        return rooms.core.record(sandbox_id).spec.team
    except NotFound:
        return None


@router.get("/usage", response_class=HTMLResponse, response_model=None)
async def usage_page(request: Request, rooms: RoomsDep, hours: int = 24) -> Response:
    """What each team (a key's session: its own) and sandbox used in the last ``hours``."""
    if (session := session_of(request)) is None:
        return to_login()
    hours = min(max(hours, 1), 24 * 366)
    since, team = time.time() - hours * 3600, session.principal.team
    report = await asyncio.to_thread(usage, rooms.core, rooms.checkpoints, rooms.meter, since, team, team is not None)
    shown = time.strftime("%Y-%m-%d %H:%M", time.localtime(since))
    return page(request, "usage.html", session, report=report, since=shown, hours=hours)


@contextlib.contextmanager
def _journal(paths: Paths) -> Iterator[Journal]:
    """The harness's journal (written by `stasis agent`), open only while a page reads it."""
    journal = Journal(paths.agent_journal)
    try:
        yield journal
    finally:
        journal.close()


def steps_of(events: list[Any]) -> list[dict[str, Any]]:
    """The journal as steps: each model message with the tool calls it made and their results."""
    steps: list[dict[str, Any]] = []
    results = {e.key: e.payload.get("content") for e in events if e.kind == "tool_result"}
    for event in events:
        if event.kind == "model_response":
            message = event.payload.get("message") or {}
            calls = []
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                calls.append({"name": function.get("name"), "arguments": function.get("arguments"),
                              "result": results.get(call.get("id"))})  # fmt: skip
            steps.append({"kind": "model", "step": event.key, "content": message.get("content"), "calls": calls,
                          "seconds": event.seconds})  # fmt: skip
        elif event.kind == "resume":
            steps.append({"kind": "resume", "at": event.at})
    return steps
