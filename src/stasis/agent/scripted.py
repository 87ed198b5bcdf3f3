"""A real OpenAI-compatible chat-completions server that answers from a script.

The answer is chosen by how many assistant messages the request already holds, so
a harness that asks again after being killed gets the same answer. Tests and
benchmarks use it so that everything on the path is real (HTTP, the openai client)
except the model's judgement.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

Step = dict[str, Any]


def call(name: str, raw_arguments: str | None = None, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": raw_arguments if raw_arguments is not None else json.dumps(arguments)}


def tools(*calls: dict[str, Any]) -> Step:
    return {"tool_calls": list(calls)}


def final(text: str) -> Step:
    return {"content": text}


@dataclass
class ScriptedModel:
    script: list[Step] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)  # HTTP statuses to answer first, one per request
    delay: float = 0.0
    step_delays: dict[int, float] = field(default_factory=dict)  # seconds to "think" before answering step N
    received: threading.Event = field(default_factory=threading.Event)
    on_request: Callable[[dict[str, Any]], None] | None = None

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.requests.append(body)
        self.received.set()
        if self.failures:
            status = self.failures.pop(0)
            return status, {"error": {"message": f"scripted {status}", "type": "scripted"}}
        step = sum(1 for m in body["messages"] if m["role"] == "assistant")
        scripted = self.script[step] if step < len(self.script) else final("(script exhausted)")
        message: dict[str, Any] = {"role": "assistant", "content": scripted.get("content")}
        finish = "stop"
        if scripted.get("tool_calls"):
            message["tool_calls"] = [
                {"id": f"call_{step}_{i}", "type": "function", "function": c}
                for i, c in enumerate(scripted["tool_calls"])
            ]
            finish = "tool_calls"
        return 200, {
            "id": f"chatcmpl-{step}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def system_prompts(self) -> list[str]:
        return [r["messages"][0]["content"] for r in self.requests]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_scripted(scripted: ScriptedModel) -> Iterator[str]:
    """Serve ``scripted`` on a free loopback port; yields the base URL (…/v1)."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        status, payload = scripted.answer(body)
        step = sum(1 for m in body["messages"] if m["role"] == "assistant")
        deadline = time.monotonic() + scripted.delay + scripted.step_delays.get(step, 0.0)
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        headers = {"retry-after": "0"} if status == 429 else {}
        return JSONResponse(payload, status_code=status, headers=headers)

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
