"""The agent's tools. They execute only inside the sandbox, through the SDK."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import StasisError
from ..sdk import Sandbox

OUTPUT_LIMIT = 16_000  # characters of one tool result the model sees
DEFAULT_RUN_TIMEOUT = 300.0

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file in the sandbox.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "absolute, or relative to /root"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Create or replace a file in the sandbox (parent directories are created).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command in the sandbox (/bin/sh -c, working directory /root).",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout": {"type": "number", "description": "seconds; the command is killed after it"},
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "remember",
            "description": "Keep a short note for future runs on this sandbox (a fact learned, a convention).",
            "parameters": {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]},
        },
    },
]
TOOL_NAMES = [schema["function"]["name"] for schema in TOOL_SCHEMAS]


def bound(text: str, limit: int = OUTPUT_LIMIT) -> str:
    """Keep the head and the tail, and say what was cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half:,} characters cut ...]\n{text[-half:]}"


def exec_id_for(run_id: str, call_id: str) -> str:
    """A stable id for a tool call's command, so a resumed harness reattaches instead of re-running."""
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", f"{run_id}:{call_id}")[:128]


@dataclass
class ToolContext:
    sandbox: Sandbox
    run_id: str
    remember: Callable[[str, str], None]  # (tool call id, note)


def parse_arguments(raw: str | None) -> dict[str, Any] | str:
    """The call's arguments, or an error message for the model."""
    try:
        args = json.loads(raw or "{}")
    except ValueError as exc:
        return f"error: the arguments are not valid JSON ({exc}); send a JSON object"
    if not isinstance(args, dict):
        return "error: the arguments must be a JSON object"
    return args


def execute(ctx: ToolContext, call_id: str, name: str, raw_arguments: str | None) -> str:
    """Run one tool call; every failure becomes a result the model can read and react to."""
    if name not in TOOL_NAMES:
        return f"error: unknown tool {name!r}; the tools are {', '.join(TOOL_NAMES)}"
    args = parse_arguments(raw_arguments)
    if isinstance(args, str):
        return args
    try:
        if name == "read_file":
            return bound(ctx.sandbox.read_file(_required(args, "path")).decode(errors="replace"))
        if name == "write_file":
            content = _required(args, "content")
            entry = ctx.sandbox.write_file(_required(args, "path"), content)
            return f"wrote {entry.size} bytes to {entry.path}"
        if name == "run":
            return _run(ctx, call_id, args)
        note = _required(args, "note")
        ctx.remember(call_id, note)
        return "noted"
    except (StasisError, KeyError, TypeError, ValueError) as exc:
        return f"error: {exc}"


def _required(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise ValueError(f"argument {key!r} (a string) is required")
    return value


def _run(ctx: ToolContext, call_id: str, args: dict[str, Any]) -> str:
    timeout = args.get("timeout", DEFAULT_RUN_TIMEOUT)
    if not isinstance(timeout, int | float) or timeout <= 0:
        timeout = DEFAULT_RUN_TIMEOUT
    result = ctx.sandbox.run(
        _required(args, "command"), timeout=float(timeout), exec_id=exec_id_for(ctx.run_id, call_id)
    )
    parts = [f"exit code: {result.exit_code}" + (f" (killed after {timeout:g}s)" if result.timed_out else "")]
    if result.limit:
        parts.append(f"limit: {result.limit}")
    if result.stdout:
        parts.append("stdout:\n" + result.stdout)
    if result.stderr:
        parts.append("stderr:\n" + result.stderr)
    return bound("\n".join(parts))
