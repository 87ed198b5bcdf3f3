"""A LangChain Deep Agents sandbox backend: the agent's shell and files live in a stasis sandbox.

    from deepagents import create_deep_agent
    from stasis.integrations.deepagents import StasisSandbox

    agent = create_deep_agent(model, backend=StasisSandbox.create(name="research"))

``StasisSandbox.connect("research")`` reattaches later, after a suspend or a restart of everything:
files, memory and background processes are where the agent left them. Deep Agents' file tools
(ls, read, write, edit, grep, glob) run through ``execute`` and the bulk transfers below.
"""

from __future__ import annotations

from typing import Any

from . import require

require("deepagents", "deepagents")

from deepagents.backends.protocol import ExecuteResponse, FileDownloadResponse, FileUploadResponse  # noqa: E402
from deepagents.backends.sandbox import BaseSandbox  # noqa: E402

from ..errors import FileError, FileNotFound, StasisError  # noqa: E402
from ..sdk import Client, Sandbox  # noqa: E402

# A guest's error kind (stasis.guest.protocol.ErrorKind) as Deep Agents names it for its model.
FILE_ERRORS = {
    "FileNotFoundError": "file_not_found",
    "IsADirectoryError": "is_directory",
    "NotADirectoryError": "invalid_path",
    "PermissionError": "permission_denied",
}


class StasisSandbox(BaseSandbox):
    """Deep Agents' ``BaseSandbox`` over one stasis sandbox (``.sandbox``)."""

    def __init__(self, sandbox: Sandbox, *, timeout: int = 120, max_output: int = 1 << 20) -> None:
        _positive(timeout)
        self.sandbox = sandbox
        self.default_timeout = timeout
        self.max_output = max_output

    @classmethod
    def create(cls, name: str | None = None, *, client: Client | None = None, timeout: int = 120,
               **options: Any) -> StasisSandbox:  # fmt: skip
        """A new sandbox (``image``, ``template``, ``network``, ... as ``Sandbox.create`` takes them)."""
        return cls(Sandbox.create(name, client=client, **options), timeout=timeout)

    @classmethod
    def connect(cls, id_or_name: str, *, client: Client | None = None, timeout: int = 120) -> StasisSandbox:
        """An existing sandbox, running or suspended (the next command resumes it)."""
        return cls(Sandbox.connect(id_or_name, client=client), timeout=timeout)

    @property
    def id(self) -> str:
        return self.sandbox.id

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """As Deep Agents' local shell backend: a timeout must be positive (the middleware turns the ValueError
        into a message for the model), a timed-out command exits 124, and a failure to run is an answer with
        exit code 1, never an exception out of the tool."""
        limit = _positive(self.default_timeout if timeout is None else timeout)
        try:  # stderr joins stdout in the order written: Deep Agents shows the model one stream
            result = self.sandbox.run(
                ["bash", "-c", f"exec 2>&1\n{command}"], timeout=limit, max_output=self.max_output
            )
        except StasisError as exc:
            return ExecuteResponse(output=f"Error executing command ({type(exc).__name__}): {exc}", exit_code=1)
        if result.timed_out:
            why = f"Error: Command timed out after {limit} seconds and was killed with its children."
            return ExecuteResponse(output=f"{result.stdout}\n{why}".lstrip("\n"), exit_code=EXIT_TIMED_OUT)
        output = result.stdout
        if result.stdout_truncated:  # never silent: the model is told what it does not see
            output = f"[... the first part of the output was cut; the last {self.max_output} bytes follow]\n{output}"
        return ExecuteResponse(output=output, exit_code=result.exit_code, truncated=result.stdout_truncated)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        responses = []
        for path, content in files:
            try:
                self.sandbox.write_file(path, content)
                responses.append(FileUploadResponse(path=path))
            except StasisError as exc:
                responses.append(FileUploadResponse(path=path, error=_file_error(exc)))
        return responses

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        responses = []
        for path in paths:
            try:
                responses.append(FileDownloadResponse(path=path, content=self.sandbox.read_file(path)))
            except StasisError as exc:
                responses.append(FileDownloadResponse(path=path, error=_file_error(exc)))
        return responses

    def suspend(self) -> None:
        """Save the sandbox with its memory and processes; the next call resumes it."""
        self.sandbox.suspend()


def _file_error(exc: StasisError) -> str:
    """Deep Agents' name for a file's failure where it has one, else what stasis said."""
    if isinstance(exc, FileNotFound):
        return "file_not_found"
    if isinstance(exc, FileError) and (kind := FILE_ERRORS.get(str(exc.details.get("guest_error")))):
        return kind
    return f"{type(exc).__name__}: {exc}"


EXIT_TIMED_OUT = 124  # as the local shell backend (and `timeout(1)`)


def _positive(timeout: int) -> int:
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    return timeout
