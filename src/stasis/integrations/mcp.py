"""An MCP server whose tools drive stasis sandboxes, suspend, checkpoint and fork included.

``stasis mcp`` serves it over stdio (an editor or desktop assistant starts it); the daemon serves
it over streamable HTTP at ``/mcp``, behind the daemon's own guard (the unix socket's mode 0600;
over TCP, the API token). Tools talk to the daemon through the async SDK, as any client does.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar

from . import require

require("mcp", "mcp")

from mcp.server.mcpserver import Image, MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402
from mcp.server.transport_security import TransportSecuritySettings  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402
from starlette.applications import Starlette  # noqa: E402

from .. import __version__  # noqa: E402
from ..errors import StasisError  # noqa: E402
from ..models import CheckpointInfo, FileEntry, SandboxInfo  # noqa: E402
from ..sdk import AsyncClient, AsyncSandbox  # noqa: E402

log = logging.getLogger(__name__)

T = TypeVar("T")
SandboxRef = Annotated[str, Field(description="the sandbox's name or id")]
INSTRUCTIONS = (
    "Sandboxes with their own kernel. Each keeps its files, memory and running processes across "
    "suspend and resume; checkpoint saves an instant to restore or fork later."
)


class SandboxSummary(BaseModel):
    id: str
    name: str | None
    status: str
    backend: str
    image: str

    @classmethod
    def of(cls, info: SandboxInfo) -> SandboxSummary:
        return cls(id=info.id, name=info.name, status=info.status, backend=info.spec.backend, image=info.spec.image)


class RunOutput(BaseModel):
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool = Field(description="output beyond max_output bytes was cut; the last bytes are kept")
    timed_out: bool
    duration: float


class CodeOutcome(BaseModel):
    """An execution in a Jupyter kernel: the kernel keeps its variables for the next run_code."""

    stdout: str
    stderr: str
    text: str | None = Field(description="the last expression's value")
    results: list[dict[str, Any]] = Field(description="rich results: text, html, markdown, png/jpeg (base64), svg")
    error: dict[str, str] | None = Field(description="the exception (name, value, traceback), if the code raised")


class FileContent(BaseModel):
    path: str
    content: str
    encoding: Literal["utf-8", "base64"]
    size: int


class DirectoryEntry(BaseModel):
    name: str  # the base name, as a directory lists it
    path: str
    type: str
    size: int

    @classmethod
    def of(cls, entry: FileEntry) -> DirectoryEntry:
        return cls(name=entry.name, path=entry.path, type=entry.type, size=entry.size)


class CheckpointSummary(BaseModel):
    id: str
    name: str | None
    type: str
    sandbox_id: str
    size_bytes: int

    @classmethod
    def of(cls, info: CheckpointInfo) -> CheckpointSummary:
        return cls(id=info.id, name=info.name, type=info.type, sandbox_id=info.sandbox_id, size_bytes=info.size_bytes)


async def _call(action: Callable[[], Awaitable[T]]) -> T:
    """A stasis error becomes a tool error with its actionable message (the client shows it)."""
    try:
        return await action()
    except StasisError as exc:
        raise ToolError(f"{type(exc).__name__}: {exc}") from exc


def build_server(client_factory: Callable[[], AsyncClient] = AsyncClient) -> MCPServer:
    """The server; each tool call opens a client from ``client_factory`` (an AsyncClient to the daemon)."""
    # WARNING: a line on the client's stderr for every request is noise there (the daemon's log has them)
    server = MCPServer("stasis", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    calls = _Calls(client_factory)
    _sandbox_tools(server, calls)
    _file_tools(server, calls)
    _state_tools(server, calls)
    _desktop_tools(server, calls)
    return server


class _Calls:
    """How a tool reaches the daemon: a client of its own per call, stasis errors as tool errors."""

    def __init__(self, client_factory: Callable[[], AsyncClient]) -> None:
        self.client_factory = client_factory

    async def with_client(self, action: Callable[[AsyncClient], Awaitable[T]]) -> T:
        async def go() -> T:
            client = self.client_factory()
            try:
                return await action(client)
            finally:
                await client.aclose()

        return await _call(go)

    async def on(self, ref: str, action: Callable[[AsyncSandbox], Awaitable[T]]) -> T:
        return await self.with_client(lambda client: _connected(ref, client, action))


def _sandbox_tools(server: MCPServer, calls: _Calls) -> None:
    """Creating, listing, running commands in and removing sandboxes."""

    @server.tool()
    async def create(name: str | None = None, image: str = "default", network: bool = False,
                     template: str | None = None) -> SandboxSummary:  # fmt: skip
        """Create a sandbox (from an image, or a template with its start command running). No network
        unless asked."""

        async def go(client: AsyncClient) -> SandboxSummary:
            sandbox = await AsyncSandbox.create(name, client=client, image=image, network=network, template=template)
            return SandboxSummary.of(sandbox._info)

        return await calls.with_client(go)

    @server.tool(name="list")
    async def list_sandboxes(include_terminated: bool = False) -> list[SandboxSummary]:
        """Every sandbox with its status (running, suspended, ...)."""

        async def go(client: AsyncClient) -> list[SandboxSummary]:
            return [SandboxSummary.of(i) for i in await AsyncSandbox.list(include_terminated, client=client)]

        return await calls.with_client(go)

    @server.tool()
    async def run(sandbox: SandboxRef, command: str, timeout: float = 60, max_output: int = 65536,
                  working_dir: str | None = None) -> RunOutput:  # fmt: skip
        """Run a shell command (bash -lc) to completion; a suspended sandbox is resumed first. After
        ``timeout`` seconds it is killed with its children; output keeps its last ``max_output`` bytes."""

        async def go(sbx: AsyncSandbox) -> RunOutput:
            options: dict[str, Any] = {"timeout": timeout, "max_output": max_output}
            if working_dir:
                options["working_dir"] = working_dir
            result = await sbx.run(["bash", "-lc", command], **options)
            return RunOutput(exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr,
                             truncated=result.stdout_truncated or result.stderr_truncated,
                             timed_out=result.timed_out, duration=result.duration)  # fmt: skip

        return await calls.on(sandbox, go)

    @server.tool()
    async def run_code(sandbox: SandboxRef, code: str, language: str = "python",
                       timeout: float | None = None) -> CodeOutcome:  # fmt: skip
        """Run code in a Jupyter kernel of the sandbox (a sandbox made from the code-interpreter image): variables
        and loaded data stay for the next call, across suspends. A plot comes back as a PNG result."""

        async def go(sbx: AsyncSandbox) -> CodeOutcome:
            done = await sbx.run_code(code, language, timeout=timeout)
            results = [
                {k: getattr(r, k) for k in (*r.formats(), "is_main_result") if hasattr(r, k)} for r in done.results
            ]
            error = None if done.error is None else vars(done.error)
            return CodeOutcome(stdout="".join(done.logs.stdout), stderr="".join(done.logs.stderr), text=done.text,
                               results=results, error=error)  # fmt: skip

        return await calls.on(sandbox, go)

    @server.tool()
    async def terminate(sandbox: SandboxRef) -> SandboxSummary:
        """Stop a sandbox for good and remove its files (its checkpoints stay)."""
        return await calls.on(sandbox, lambda sbx: _summary(sbx.terminate()))


def _file_tools(server: MCPServer, calls: _Calls) -> None:
    """Files in a sandbox."""

    @server.tool()
    async def read_file(sandbox: SandboxRef, path: str) -> FileContent:
        """A file's content: text as UTF-8, anything else base64."""

        async def go(sbx: AsyncSandbox) -> FileContent:
            data = await sbx.read_file(path)
            try:
                return FileContent(path=path, content=data.decode(), encoding="utf-8", size=len(data))
            except UnicodeDecodeError:
                return FileContent(path=path, content=base64.b64encode(data).decode(), encoding="base64",
                                   size=len(data))  # fmt: skip

        return await calls.on(sandbox, go)

    @server.tool()
    async def write_file(sandbox: SandboxRef, path: str, content: str,
                         encoding: Literal["utf-8", "base64"] = "utf-8") -> DirectoryEntry:  # fmt: skip
        """Write a file atomically (its directories are made)."""

        async def go(sbx: AsyncSandbox) -> DirectoryEntry:
            data = base64.b64decode(content, validate=True) if encoding == "base64" else content.encode()
            entry = await sbx.write_file(path, data)
            return DirectoryEntry.of(entry)

        return await calls.on(sandbox, go)

    @server.tool()
    async def list_directory(sandbox: SandboxRef, path: str = "/root") -> list[DirectoryEntry]:
        """The entries of a directory."""

        async def go(sbx: AsyncSandbox) -> list[DirectoryEntry]:
            return [DirectoryEntry.of(e) for e in await sbx.list_directory(path)]

        return await calls.on(sandbox, go)


def _state_tools(server: MCPServer, calls: _Calls) -> None:
    """A sandbox's state kept: suspend, resume, checkpoint, fork."""

    @server.tool()
    async def suspend(sandbox: SandboxRef) -> SandboxSummary:
        """Save memory, processes and files to disk; it uses no CPU or RAM until resumed."""
        return await calls.on(sandbox, lambda sbx: _summary(sbx.suspend()))

    @server.tool()
    async def resume(sandbox: SandboxRef) -> SandboxSummary:
        """Continue a suspended sandbox exactly where it was."""
        return await calls.on(sandbox, lambda sbx: _summary(sbx.resume()))

    @server.tool()
    async def checkpoint(sandbox: SandboxRef, name: str | None = None,
                         type: Literal["memory", "filesystem"] = "memory") -> CheckpointSummary:  # fmt: skip
        """Save this instant (memory and processes, or files only) as a durable checkpoint; the sandbox
        keeps running. Create a sandbox from it later with the SDK or `stasis create --from`."""

        async def go(sbx: AsyncSandbox) -> CheckpointSummary:
            options = {"name": name} if name else {}
            return CheckpointSummary.of(await sbx.checkpoint(type, **options))

        return await calls.on(sandbox, go)

    @server.tool()
    async def fork(sandbox: SandboxRef, count: int = 1) -> list[SandboxSummary]:
        """New running sandboxes that continue from this instant (memory, processes, files), then diverge."""

        async def go(sbx: AsyncSandbox) -> list[SandboxSummary]:
            return [SandboxSummary.of(f._info) for f in await sbx.copy(count)]

        return await calls.on(sandbox, go)


async def _connected(ref: str, client: AsyncClient, action: Callable[[AsyncSandbox], Awaitable[T]]) -> T:
    return await action(await AsyncSandbox.connect(ref, client=client))


async def _summary(info: Awaitable[SandboxInfo]) -> SandboxSummary:
    return SandboxSummary.of(await info)


def serve_stdio() -> None:
    server = build_server()
    for noisy in ("httpx", "httpcore"):  # each tool's request to the daemon is not news on the client's stderr
        logging.getLogger(noisy).setLevel(logging.WARNING)
    server.run("stdio")


def http_app(server: MCPServer, path: str = "/mcp") -> Starlette:
    """The streamable-HTTP app whose route the daemon serves. The daemon's own guard (socket mode,
    token over TCP) authenticates; a Host check would only refuse its unix-socket clients."""
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return server.streamable_http_app(streamable_http_path=path, transport_security=security)


def _desktop_tools(server: MCPServer, calls: _Calls) -> None:
    """Computer use: a sandbox made from the desktop image (a screen, a window manager, Chromium)."""

    @server.tool()
    async def screenshot(sandbox: SandboxRef) -> Image:
        """The desktop's screen as a PNG image (a sandbox of the desktop image; a suspended one wakes)."""
        return Image(data=await calls.on(sandbox, lambda sbx: sbx.screenshot()), format="png")

    @server.tool()
    async def click(sandbox: SandboxRef, x: int, y: int, button: Literal["left", "middle", "right"] = "left",
                    double: bool = False) -> str:  # fmt: skip
        """Click at pixel (x, y) of the desktop's screen (from its top left)."""

        async def go(sbx: AsyncSandbox) -> str:
            await (sbx.mouse.double_click(x, y) if double else sbx.mouse.click(x, y, button=button))
            return f"clicked at {x},{y}"

        return await calls.on(sandbox, go)

    @server.tool()
    async def type_text(sandbox: SandboxRef, text: str) -> str:
        """Type text as keystrokes into the desktop's focused window."""

        async def go(sbx: AsyncSandbox) -> str:
            await sbx.keyboard.type(text)
            return f"typed {len(text)} characters"

        return await calls.on(sandbox, go)

    @server.tool()
    async def press_keys(sandbox: SandboxRef, keys: list[str]) -> str:
        """Press key combinations in turn, xdotool's names: ["ctrl+l"], ["Return"], ["ctrl+shift+t"]."""

        async def go(sbx: AsyncSandbox) -> str:
            await sbx.keyboard.press(*keys)
            return "pressed " + " ".join(keys)

        return await calls.on(sandbox, go)

    @server.tool()
    async def open_url(sandbox: SandboxRef, url: str) -> str:
        """Open a URL in the desktop's browser."""

        async def go(sbx: AsyncSandbox) -> str:
            await sbx.open(url)
            return f"opened {url}"

        return await calls.on(sandbox, go)
