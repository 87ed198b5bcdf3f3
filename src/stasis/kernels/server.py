"""The code interpreter's server, run inside a sandbox: Jupyter kernels behind E2B's code-interpreter HTTP API.

    POST   /execute                {code, context_id?, language?, env_vars?, timeout?}  -> JSON lines, as they come
    GET    /contexts               -> [{id, language, cwd}]
    POST   /contexts               {language?, cwd?} -> {id, language, cwd}: a kernel of its own
    DELETE /contexts/ID            POST /contexts/ID/restart            GET /health

Lines of an execution: ``stdout``/``stderr`` {text, timestamp}, ``result`` (a MIME bundle as E2B names its keys:
text, html, markdown, png, jpeg, svg, pdf, latex, json, javascript, the rest in ``extra``; ``is_main_result`` for
the last expression's value), ``error`` {name, value, traceback}, ``number_of_executions``, ``end_of_execution``.
A timed-out execution (or a client that hung up) interrupts the kernel, which stays usable.

The kernels are ordinary processes of the sandbox, so they are suspended, resumed, checkpointed and forked with
it: loaded data stays loaded. Standard library plus ``jupyter_client``; the daemon starts it with
:func:`stasis.kernels.bootstrap` (no file of it needs to be in the image).
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from jupyter_client.manager import KernelManager

PORT = 49999
KERNELS = {"python": "python3", "python3": "python3", "bash": "bash"}
MIME_KEYS = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/png": "png",
    "image/jpeg": "jpeg", "image/svg+xml": "svg", "application/pdf": "pdf", "text/latex": "latex",
    "application/json": "json", "application/javascript": "javascript", "e2b/data": "data", "e2b/chart": "chart",
}  # fmt: skip
# E2B's template's display formatters, registered in every Python kernel: a DataFrame shown is also its columns as
# lists (E2B's ``result.data``), a matplotlib figure also its chart as E2B's ``e2b_charts`` reads it (``result.chart``,
# where the image has e2b_charts). A function, called and deleted, so the user's namespace gets nothing.
E2B_FORMATTERS = """
def _stasis_formatters():
    import sys
    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict, str)

        def __call__(self, obj):
            pandas = sys.modules.get("pandas")
            if pandas is None or not isinstance(obj, pandas.DataFrame):
                return super().__call__(obj)
            stamp = pandas.Timestamp
            columns = obj.to_dict(orient="list")
            return {k: [v.isoformat() if isinstance(v, stamp) else v for v in vs] for k, vs in columns.items()}

    class ChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict, str)

        def __call__(self, obj):
            figure = getattr(sys.modules.get("matplotlib.figure"), "Figure", None)
            if figure is None or not isinstance(obj, figure):
                return super().__call__(obj)
            try:
                from e2b_charts import chart_figure_to_dict  # E2B's extractor, in the image's wheels
            except ImportError:
                return None
            return chart_figure_to_dict(obj)

    shell = get_ipython()
    if shell is not None:
        for kind, formatter in (("e2b/data", DataFormatter), ("e2b/chart", ChartFormatter)):
            shell.display_formatter.formatters[kind] = formatter(parent=shell.display_formatter)
            if kind not in shell.display_formatter.active_types:
                shell.display_formatter.active_types.append(kind)
_stasis_formatters()
del _stasis_formatters
"""
BODY_LIMIT = 64 << 20  # bytes of a request's body (code and its env), read whole before it runs
INTERRUPT_GRACE = 10.0  # seconds an interrupted kernel has to become idle before it is restarted
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ContextError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class KernelDied(Exception):
    """The kernel's process is gone (killed, out of memory, ``os._exit``): no idle status will ever come."""


class Context:
    """One kernel, one execution at a time."""

    def __init__(self, context_id: str, language: str, cwd: str) -> None:
        if language not in KERNELS:
            raise ContextError(400, f"no kernel for language {language!r}; known: {', '.join(sorted(KERNELS))}")
        if not os.path.isdir(cwd):
            raise ContextError(400, f"working directory {cwd!r} does not exist in the sandbox")
        self.id, self.language, self.cwd = context_id, language, cwd
        self.lock = threading.Lock()
        self.closed = False
        self.manager = KernelManager(kernel_name=KERNELS[language])
        try:
            self.manager.start_kernel(cwd=cwd)
        except Exception as exc:
            raise ContextError(400, f"cannot start a {language} kernel here: {exc}") from exc
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)
        self._prepared()

    def _prepared(self) -> None:
        if self.language.startswith("python"):
            self._quietly(E2B_FORMATTERS)

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def restart(self) -> None:
        with self.lock:
            self.manager.restart_kernel(now=True)
            self.client.wait_for_ready(timeout=120)
            self._prepared()

    def shutdown(self) -> None:
        self.closed = True  # an execution running now ends as its kernel goes: never restarted for a removed context
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)

    def execute(self, code: str, env: dict[str, str], timeout: float | None, send: Any) -> None:
        """Run ``code``; each message as a dict to ``send`` (which raises OSError when the client is gone)."""
        with self.lock:
            try:
                if env and self.language.startswith("python"):
                    self._quietly(f"import os as _stasis_os; _stasis_os.environ.update({json.dumps(env)})")
                try:
                    self._run(code, timeout, send)
                finally:
                    if env and self.language.startswith("python"):
                        names = json.dumps(sorted(env))
                        self._quietly(f"[_stasis_os.environ.pop(_k, None) for _k in {names}]; del _stasis_os")
            except KernelDied:
                send(self._after_death())

    def _after_death(self) -> dict[str, Any]:
        """A fresh kernel in place of one that died (unless the context was removed meanwhile), and the error
        line that says what happened."""
        said = "the kernel exited while it ran this code (killed, or out of memory?); it was restarted, so the "
        said += "context's variables are gone"
        if self.closed:
            said = "the context was removed while it ran this code"
        else:
            try:
                self.manager.restart_kernel(now=True)
                self.client.wait_for_ready(timeout=120)
                self._prepared()
            except Exception as exc:  # said to the client, whatever it was
                said = f"the kernel exited while it ran this code, and a new one did not start: {exc}"
        return {"type": "error", "name": "KernelDied", "traceback": "", "value": said}

    def _quietly(self, code: str) -> None:
        msg_id = self.client.execute(code, silent=True, store_history=False)
        self._until_idle(msg_id, time.monotonic() + 60, lambda message: None)

    def _run(self, code: str, timeout: float | None, send: Any) -> None:
        msg_id = self.client.execute(code, store_history=True, allow_stdin=False)
        deadline = time.monotonic() + timeout if timeout else None
        timed_out = False
        try:
            timed_out = not self._until_idle(msg_id, deadline, send)
        except OSError:  # the client hung up: stop its code, leave the kernel ready for the next
            self._interrupt(msg_id)
            raise
        if timed_out:
            self._interrupt(msg_id)
            send({"type": "error", "name": "TimeoutError", "traceback": "",
                  "value": f"the execution ran past its timeout of {timeout:g}s and was interrupted"})  # fmt: skip
        reply = self._reply(msg_id)
        if reply is not None and reply.get("execution_count") is not None:
            send({"type": "number_of_executions", "execution_count": reply["execution_count"]})

    def _until_idle(self, msg_id: str, deadline: float | None, send: Any) -> bool:
        """Relay the execution's messages until its kernel is idle (True), or the deadline passed (False)."""
        while True:
            wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if wait <= 0:
                return False
            try:
                message = self.client.get_iopub_msg(timeout=wait)
            except queue.Empty:
                if not self.manager.is_alive():
                    raise KernelDied from None
                continue
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "status" and content.get("execution_state") == "idle":
                return True
            if (line := relayed(kind, content)) is not None:
                send(line)

    def _interrupt(self, msg_id: str) -> None:
        self.manager.interrupt_kernel()
        if not self._until_idle(msg_id, time.monotonic() + INTERRUPT_GRACE, lambda message: None):
            self.manager.restart_kernel(now=True)  # it would not stop: its state is lost, not the server
            self.client.wait_for_ready(timeout=120)
            self._prepared()

    def _reply(self, msg_id: str) -> dict[str, Any] | None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                reply = self.client.get_shell_msg(timeout=1)
            except queue.Empty:
                continue
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                return reply["content"]
        return None


def relayed(kind: str, content: dict[str, Any]) -> dict[str, Any] | None:
    """One iopub message as an execution line, or None (status, execute_input, ...)."""
    if kind == "stream":
        return {"type": content["name"], "text": content["text"], "timestamp": time.time_ns()}
    if kind in ("execute_result", "display_data"):
        line: dict[str, Any] = {"type": "result", "is_main_result": kind == "execute_result"}
        extra = {}
        for mime, value in content.get("data", {}).items():
            if (key := MIME_KEYS.get(mime)) is not None:
                line[key] = value
            else:
                extra[mime] = value
        if extra:
            line["extra"] = extra
        return line
    if kind == "error":
        traceback = "\n".join(ANSI.sub("", frame) for frame in content.get("traceback", []))
        return {"type": "error", "name": content["ename"], "value": content["evalue"], "traceback": traceback}
    return None


class Interpreter:
    def __init__(self) -> None:
        self.contexts: dict[str, Context] = {}
        self.defaults: dict[str, str] = {}  # language -> its default context's id
        self.lock = threading.Lock()
        self.home = next((d for d in ("/home/user", os.path.expanduser("~"), "/") if os.path.isdir(d)), "/")

    def context(self, context_id: str | None, language: str | None) -> Context:
        if context_id:
            with self.lock:
                if (found := self.contexts.get(context_id)) is None:
                    raise ContextError(404, f"no context {context_id!r}; GET /contexts lists them")
                return found
        language = (language or "python").lower()
        with self.lock:
            if (known := self.defaults.get(language)) is not None:
                return self.contexts[known]
            made = Context(language, language, self.home)  # a language's default context is named for it
            self.contexts[made.id] = made
            self.defaults[language] = made.id
            return made

    def create(self, language: str | None, cwd: str | None) -> Context:
        made = Context(uuid.uuid4().hex, (language or "python").lower(), cwd or self.home)
        with self.lock:
            self.contexts[made.id] = made
        return made

    def remove(self, context_id: str) -> None:
        with self.lock:
            found = self.contexts.pop(context_id, None)
            for language, known in list(self.defaults.items()):
                if known == context_id:
                    del self.defaults[language]
        if found is None:
            raise ContextError(404, f"no context {context_id!r}")
        found.shutdown()


class Handler(BaseHTTPRequestHandler):
    interpreter: Interpreter
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes: lines stream as they come

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/contexts":
            with self.interpreter.lock:
                contexts = list(self.interpreter.contexts.values())
            self._json(200, [c.describe() for c in contexts])
        else:
            self._json(404, {"message": f"no route {self.path}"})

    def do_POST(self) -> None:
        try:
            body = self._body()
            if self.path == "/execute":
                self._execute(body)
            elif self.path == "/contexts":
                self._json(200, self.interpreter.create(body.get("language"), body.get("cwd")).describe())
            elif (found := re.fullmatch(r"/contexts/([^/]+)/restart", self.path)) is not None:
                self.interpreter.context(found[1], None).restart()
                self._json(200, {"restarted": found[1]})
            else:
                self._json(404, {"message": f"no route {self.path}"})
        except ContextError as exc:
            self._json(exc.status, {"message": exc.message})

    def do_DELETE(self) -> None:
        found = re.fullmatch(r"/contexts/([^/]+)", self.path)
        try:
            if found is None:
                raise ContextError(404, f"no route {self.path}")
            self.interpreter.remove(found[1])
            self._json(200, {"removed": found[1]})
        except ContextError as exc:
            self._json(exc.status, {"message": exc.message})

    def _execute(self, body: dict[str, Any]) -> None:
        if body.get("context_id") and body.get("language"):
            raise ContextError(400, "give a context or a language, not both")
        if not isinstance(body.get("code"), str):
            raise ContextError(400, "code: a string is required")
        context = self.interpreter.context(body.get("context_id"), body.get("language"))
        env = {str(k): str(v) for k, v in (body.get("env_vars") or {}).items()}
        self.send_response(200)
        self.send_header("content-type", "application/x-ndjson")
        self.end_headers()

        def send(line: dict[str, Any]) -> None:
            self.wfile.write(json.dumps(line).encode() + b"\n")
            self.wfile.flush()

        try:
            context.execute(body["code"], env, body.get("timeout"), send)
            send({"type": "end_of_execution"})
        except OSError:
            pass  # the client is gone; the kernel was interrupted

    def _body(self) -> dict[str, Any]:
        try:
            body = json.loads(self._raw_body() or b"{}")
        except ValueError as exc:
            raise ContextError(400, f"the body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise ContextError(400, "the body must be a JSON object")
        return body

    def _raw_body(self) -> bytes:
        """The request's body, by its length or in chunks (a proxy streaming it sends those), up to BODY_LIMIT."""
        if "chunked" not in (self.headers.get("transfer-encoding") or "").lower():
            return self.rfile.read(_within_limit(int(self.headers.get("content-length") or 0)))
        parts, total = [], 0
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            total = _within_limit(total + size)
            parts.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF after each chunk
        while self.rfile.readline().strip():
            pass  # trailers, up to the blank line
        return b"".join(parts)

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _within_limit(size: int) -> int:
    if not 0 <= size <= BODY_LIMIT:
        raise ContextError(413, f"the request's body is over {BODY_LIMIT >> 20} MiB; send less code at a time")
    return size


def main() -> None:
    interpreter = Interpreter()
    Handler.interpreter = interpreter
    server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    server.daemon_threads = True
    threading.Thread(target=interpreter.context, args=(None, "python"), daemon=True).start()  # warm, not awaited
    server.serve_forever()


if __name__ == "__main__":
    main()
