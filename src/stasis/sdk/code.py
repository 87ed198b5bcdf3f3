"""``run_code``'s results, as E2B's code interpreter shapes them: an ``Execution`` of logs, rich results and an error.

The kernel lives in the sandbox, so it is suspended, resumed, checkpointed and forked with it: what it loaded is
still loaded. Results keep Jupyter's MIME bundle under E2B's names (``text``, ``html``, ``png`` as base64, ...).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..code_models import CodeContextRequest, CodeRequest
from ._base import Call

FORMATS = ("text", "html", "markdown", "png", "jpeg", "svg", "pdf", "latex", "json", "javascript", "data", "chart")


@dataclass
class Result:
    """One rich result: the last expression's value (``is_main_result``) or a display (a plot, a table)."""

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    png: str | None = None  # base64, as Jupyter and E2B carry it; ``image()`` decodes
    jpeg: str | None = None
    svg: str | None = None
    pdf: str | None = None
    latex: str | None = None
    json: Any = None
    javascript: str | None = None
    data: dict[str, list[Any]] | None = None  # a DataFrame's columns (E2B's ``result.data``)
    chart: Any = None  # E2B's chart data, where the kernel's formatter makes it
    is_main_result: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def formats(self) -> list[str]:
        return [name for name in FORMATS if getattr(self, name) is not None] + list(self.extra)

    def image(self) -> tuple[str, bytes] | None:
        """(extension, bytes) of the result's image, if it is one: PNG, JPEG or SVG."""
        for kind in ("png", "jpeg"):
            if (data := getattr(self, kind)) is not None:
                return kind, base64.b64decode(data)
        return ("svg", self.svg.encode()) if self.svg is not None else None


@dataclass
class ExecutionError:
    name: str
    value: str
    traceback: str


@dataclass
class Logs:
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass
class Execution:
    results: list[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: ExecutionError | None = None  # the code's exception (or a timeout), never raised
    execution_count: int | None = None

    @property
    def text(self) -> str | None:
        """The last expression's value as text (what a notebook cell shows as Out[n])."""
        return next((r.text for r in self.results if r.is_main_result), None)


@dataclass(frozen=True)
class CodeContext:
    """A kernel of its own (``create_code_context``): its own variables, language and working directory."""

    id: str
    language: str
    cwd: str


OnText = Callable[[str], Any]
OnResult = Callable[[Result], Any]


class ExecutionBuilder:
    """Lines of an execution into an ``Execution``, each handed to its callback as it arrives."""

    def __init__(self, on_stdout: OnText | None, on_stderr: OnText | None, on_result: OnResult | None) -> None:
        self.execution = Execution()
        self.on_stdout, self.on_stderr, self.on_result = on_stdout, on_stderr, on_result

    def feed(self, line: dict[str, Any]) -> Any:
        """The callback's return value (awaitable, for the async twin's async callbacks), or None."""
        kind = line.get("type")
        if kind == "stdout":
            self.execution.logs.stdout.append(line["text"])
            return self.on_stdout(line["text"]) if self.on_stdout else None
        if kind == "stderr":
            self.execution.logs.stderr.append(line["text"])
            return self.on_stderr(line["text"]) if self.on_stderr else None
        if kind == "result":
            known = {k: line[k] for k in (*FORMATS, "is_main_result", "extra") if k in line}
            result = Result(**known)
            self.execution.results.append(result)
            return self.on_result(result) if self.on_result else None
        if kind == "error":
            self.execution.error = ExecutionError(line["name"], line["value"], line.get("traceback", ""))
        elif kind == "number_of_executions":
            self.execution.execution_count = line["execution_count"]
        return None


class CodeRecipes:
    """The calls of the code interpreter; the twins add their I/O."""

    _url: str

    def _code_execute_call(
        self, code: str, language: str | None, context: CodeContext | str | None, envs: dict[str, str] | None,
        timeout: float | None,
    ) -> Call:  # fmt: skip
        context_id = context.id if isinstance(context, CodeContext) else context
        request = CodeRequest(code=code, language=None if context_id else language, context_id=context_id,
                              env_vars=envs, timeout=timeout)  # fmt: skip
        return Call("POST", f"{self._url}/code/execute", json=request.model_dump(exclude_none=True))

    def _code_context_call(self, cwd: str | None, language: str | None) -> Call:
        body = CodeContextRequest(cwd=cwd, language=language).model_dump(exclude_none=True)
        return Call("POST", f"{self._url}/code/contexts", lambda r: _context(r.json()), json=body)

    def _code_contexts_call(self) -> Call:
        return Call("GET", f"{self._url}/code/contexts", lambda r: [_context(item) for item in r.json()])

    def _code_context_action_call(self, context: CodeContext | str, action: str) -> Call:
        context_id = context.id if isinstance(context, CodeContext) else context
        if action == "remove":
            return Call("DELETE", f"{self._url}/code/contexts/{context_id}")
        return Call("POST", f"{self._url}/code/contexts/{context_id}/restart")


def _context(data: dict[str, Any]) -> CodeContext:
    return CodeContext(id=data["id"], language=data["language"], cwd=data["cwd"])
