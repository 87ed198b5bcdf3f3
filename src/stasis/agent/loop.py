"""The harness loop: ask the model, run its tool calls in the sandbox, repeat; survive being killed.

The journal is the loop's only state. Each pass replays it into the conversation
and does the one next thing that is missing: run a tool call that has no result,
finish if the model answered without tool calls, or ask the model. Killed at any
instant, ``resume`` continues from the journal: responses already received are
not asked for again, and a tool call's command (keyed by an exec id in the
sandbox) is reattached, never started twice.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import faults
from ..errors import Conflict, NotFound, StasisError
from ..sdk import CheckpointType, Client, Sandbox
from .journal import Event, Journal, RunRecord
from .models import ModelError, OpenAIModel
from .tools import TOOL_SCHEMAS, ToolContext, bound, execute

log = logging.getLogger(__name__)

SYSTEM_PROMPT = """You are a capable software agent working inside a Linux sandbox (Debian, root, {network}).
Use the tools to inspect and change the sandbox: read_file, write_file, run (a shell command).
Use remember to keep short notes that will help future runs on this sandbox.
When the task is done, answer with a short summary and no tool call."""

EventCallback = Callable[[str, dict[str, Any]], None]


@dataclass
class Replay:
    """The conversation as the journal tells it, and what is missing."""

    messages: list[dict[str, Any]]
    steps: int = 0
    last_reply: dict[str, Any] | None = None
    pending_calls: list[dict[str, Any]] = field(default_factory=list)


def replay(system: str, task: str, events: list[Event]) -> Replay:
    state = Replay(messages=[{"role": "system", "content": system}, {"role": "user", "content": task}])
    results: dict[str, str] = {e.key: e.payload["content"] for e in events if e.kind == "tool_result"}
    for event in events:
        if event.kind != "model_response":
            continue
        message = event.payload["message"]
        state.messages.append(message)
        state.steps += 1
        state.last_reply = message
        for call in message.get("tool_calls") or []:
            if call["id"] in results:
                state.messages.append({"role": "tool", "tool_call_id": call["id"], "content": results[call["id"]]})
    if state.last_reply is not None:
        state.pending_calls = [c for c in state.last_reply.get("tool_calls") or [] if c["id"] not in results]
    return state


def _normalise(message: dict[str, Any], step: int) -> dict[str, Any]:
    """Every tool call gets an id (some servers omit it) before the response is journalled."""
    calls = message.get("tool_calls") or []
    seen: set[str] = set()
    for index, call in enumerate(calls):
        if not call.get("id") or call["id"] in seen:
            call["id"] = f"call_{step}_{index}"
        seen.add(call["id"])
        call.setdefault("type", "function")
    if not calls:
        message.pop("tool_calls", None)
    return message


class AgentRunner:
    def __init__(
        self,
        journal: Journal,
        model: OpenAIModel,
        client: Client | None = None,
        on_event: EventCallback | None = None,
        checkpoint_at_end: bool = True,
    ) -> None:
        self.journal = journal
        self.model = model
        self.client = client or Client()
        self.on_event = on_event or (lambda kind, data: None)
        self.checkpoint_at_end = checkpoint_at_end

    # ------------------------------------------------------------ entry points

    def start(self, sandbox: str, task: str, max_steps: int = 30) -> RunRecord:
        sbx = Sandbox.connect(sandbox, client=self.client)
        run_id = "run-" + secrets.token_hex(6)
        self.journal.create_run(run_id, sandbox, sbx.id, self.model.model, task, max_steps)
        # The system prompt is journalled once: a resumed run must see the conversation it started with.
        self.journal.record(run_id, "system", "0", {"content": self._system_prompt(sbx, run_id)})
        log.info("agent run %s on sandbox %s started", run_id, sbx.id)
        return self._drive(run_id)

    def resume(self, run_id: str) -> RunRecord:
        record = self.journal.run(run_id)
        if record.status == "running":
            raise Conflict(f"agent run {run_id} is being driven by another process; resume it once that one is gone")
        if record.status != "interrupted":
            return record
        self.journal.claim(run_id)
        resumes = sum(e.kind == "resume" for e in self.journal.events(run_id))
        self.journal.record(run_id, "resume", str(resumes + 1), {})  # where it picked up again (the console shows it)
        log.info("agent run %s resumed", run_id)
        return self._drive(run_id)

    # ------------------------------------------------------------ the loop

    def _drive(self, run_id: str) -> RunRecord:
        record = self.journal.run(run_id)
        sbx = Sandbox.connect(record.sandbox_id, client=self.client)
        ctx = ToolContext(sbx, run_id, lambda key, note: self.journal.remember(sbx.id, run_id, key, note))
        try:
            while True:
                events = self.journal.events(run_id)
                system = next(e.payload["content"] for e in events if e.kind == "system")
                state = replay(system, record.task, events)
                if state.pending_calls:
                    for call in state.pending_calls:
                        self._tool_call(ctx, call)
                    continue
                if state.last_reply is not None and not state.last_reply.get("tool_calls"):
                    return self._finish(sbx, run_id, "completed", state.last_reply.get("content") or "")
                if state.steps >= record.max_steps:
                    return self._finish(sbx, run_id, "step_limit", f"stopped after {state.steps} model steps")
                self._ask_model(run_id, state)
        except ModelError as exc:
            self.journal.finish_run(run_id, "failed", error=str(exc))
            self.on_event("final", {"status": "failed", "text": str(exc)})
            return self.journal.run(run_id)

    def _ask_model(self, run_id: str, state: Replay) -> None:
        started = time.perf_counter()
        reply = self.model.complete(state.messages, TOOL_SCHEMAS)
        seconds = time.perf_counter() - started
        message = _normalise(reply.message, state.steps + 1)
        payload = {"message": message, "finish_reason": reply.finish_reason}
        self.journal.record(run_id, "model_response", str(state.steps + 1), payload, seconds)
        faults.point("agent.after_model_response")
        self.on_event("model", {"step": state.steps + 1, "message": message, "seconds": seconds})

    def _tool_call(self, ctx: ToolContext, call: dict[str, Any]) -> None:
        function = call.get("function") or {}
        name, arguments = function.get("name", ""), function.get("arguments")
        self.journal.record(ctx.run_id, "tool_call", call["id"], {"name": name, "arguments": arguments})
        faults.point("agent.after_tool_intent")
        self.on_event("tool_call", {"name": name, "arguments": arguments})
        started = time.perf_counter()
        result = execute(ctx, call["id"], name, arguments)
        seconds = time.perf_counter() - started
        self.journal.record(ctx.run_id, "tool_result", call["id"], {"content": result}, seconds)
        faults.point("agent.after_tool_result")
        self.on_event("tool_result", {"name": name, "content": result, "seconds": seconds})

    # ------------------------------------------------------------ memory

    def _system_prompt(self, sbx: Sandbox, run_id: str) -> str:
        notes = list(self.journal.notes(sbx.id))
        info = sbx.info()
        origin = info.from_checkpoint
        policy = info.spec.network
        prompt = SYSTEM_PROMPT.format(network=f"network: {policy.describe()}" if policy else "no network")
        if origin:
            try:
                checkpoint = Sandbox.get_checkpoint(origin, client=self.client)
                notes = [*checkpoint.metadata.get("notes", []), *notes]
                self.journal.add_checkpoint(run_id, origin)
            except NotFound:
                pass  # a fork's transient checkpoint, or one deleted since
        unique = list(dict.fromkeys(notes))
        if not unique:
            return prompt
        return prompt + "\n\nNotes learned in earlier runs on this sandbox:\n" + "\n".join(f"- {n}" for n in unique)

    def _finish(self, sbx: Sandbox, run_id: str, status: str, final: str) -> RunRecord:
        if self.checkpoint_at_end:
            self._checkpoint(sbx, run_id, final)
        self.journal.finish_run(run_id, status, final=final)
        self.on_event("final", {"status": status, "text": final})
        log.info("agent run %s finished: %s", run_id, status)
        return self.journal.run(run_id)

    def _checkpoint(self, sbx: Sandbox, run_id: str, final: str) -> None:
        """A MEMORY checkpoint carrying what was learned; its name makes a resumed finish reuse it."""
        name = f"{run_id}-end"
        try:
            checkpoint = Sandbox.get_checkpoint(name, client=self.client)
        except NotFound:
            notes = list(dict.fromkeys([*self._origin_notes(run_id), *self.journal.notes(sbx.id)]))
            metadata = {"notes": notes, "summary": bound(final, 500), "run_id": run_id}
            try:
                checkpoint = sbx.checkpoint(CheckpointType.MEMORY, name=name, metadata=metadata)
            except StasisError as exc:
                log.warning("end-of-run checkpoint of %s failed (%s); suspending instead", sbx.id, exc)
                sbx.suspend()
                return
        self.journal.add_checkpoint(run_id, checkpoint.id)

    def _origin_notes(self, run_id: str) -> list[str]:
        notes: list[str] = []
        for checkpoint_id in self.journal.run(run_id).checkpoints:
            try:
                notes += Sandbox.get_checkpoint(checkpoint_id, client=self.client).metadata.get("notes", [])
            except NotFound:
                continue
        return notes
