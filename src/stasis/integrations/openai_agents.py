"""An OpenAI Agents SDK sandbox provider (``agents.sandbox``): a SandboxAgent's shell and workspace in stasis.

    from agents import Runner
    from agents.run_config import RunConfig, SandboxRunConfig
    from stasis.integrations.openai_agents import StasisSandboxClient, StasisSandboxClientOptions

    client = StasisSandboxClient()
    run_config = RunConfig(sandbox=SandboxRunConfig(client=client, options=StasisSandboxClientOptions(name="work")))
    await Runner.run(agent, "...", run_config=run_config)

Modelled on the SDK's E2B provider. A session's end suspends the sandbox (``pause_on_exit``, the
default): memory and running processes are kept, not only the workspace, and ``resume`` with the
saved session state reattaches to the same sandbox by id. Only when that sandbox is gone does
``resume`` create a new one, which the SDK then hydrates from the session's workspace snapshot.
"""

from __future__ import annotations

import contextlib
import io
import logging
import uuid
from pathlib import Path
from typing import Any, Literal

from . import require

require("agents", "openai-agents")

from agents.sandbox.errors import (  # noqa: E402
    ExecTimeoutError,
    ExecTransportError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceWriteTypeError,
)
from agents.sandbox.manifest import Manifest  # noqa: E402
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession  # noqa: E402
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions  # noqa: E402
from agents.sandbox.session.sandbox_session import SandboxSession  # noqa: E402
from agents.sandbox.session.sandbox_session_state import SandboxSessionState  # noqa: E402
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot  # noqa: E402
from agents.sandbox.types import ExecResult, User  # noqa: E402

from ..errors import FileNotFound, SandboxNotFound, StasisError  # noqa: E402
from ..models import SandboxStatus  # noqa: E402
from ..sdk import AsyncClient, AsyncSandbox  # noqa: E402

log = logging.getLogger(__name__)

BACKEND_ID = "stasis"


class StasisSandboxClientOptions(BaseSandboxClientOptions):
    """How to create a stasis sandbox for a session."""

    type: Literal["stasis"] = "stasis"
    name: str | None = None
    image: str = "default"
    template: str | None = None
    network: bool = False
    pause_on_exit: bool = True  # suspend (memory and processes kept) when the session ends; False: terminate
    exec_timeout: float = 600.0  # seconds a command may run when the SDK gives no timeout

    def __init__(self, name: str | None = None, image: str = "default", template: str | None = None,
                 network: bool = False, pause_on_exit: bool = True, exec_timeout: float = 600.0, *,
                 type: Literal["stasis"] = "stasis") -> None:  # fmt: skip
        super().__init__(type=type, name=name, image=image, template=template, network=network,
                         pause_on_exit=pause_on_exit, exec_timeout=exec_timeout)  # fmt: skip


class StasisSandboxSessionState(SandboxSessionState):
    type: Literal["stasis"] = "stasis"
    sandbox_id: str
    name: str | None = None
    image: str = "default"
    template: str | None = None
    network: bool = False
    pause_on_exit: bool = True
    exec_timeout: float = 600.0


class StasisSandboxSession(BaseSandboxSession):
    """One stasis sandbox behind the SDK's session interface."""

    state: StasisSandboxSessionState

    def __init__(self, *, state: StasisSandboxSessionState, sandbox: AsyncSandbox) -> None:
        self.state = state
        self.sandbox = sandbox

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None) -> ExecResult:
        argv = [str(c) for c in command]
        options: dict[str, Any] = {"timeout": timeout or self.state.exec_timeout}
        # SandboxSession.exec runs another user's command as `sudo -u USER -- ...`: stasis runs it as that user
        if len(argv) >= 4 and argv[0] == "sudo" and argv[1] == "-u" and argv[3] == "--":
            options["user"], argv = argv[2], argv[4:]
        if self.state.workspace_root_ready:
            options["working_dir"] = self.state.manifest.root
        try:
            result = await self.sandbox.run(argv, **options)
        except StasisError as exc:
            raise ExecTransportError(command=argv, cause=exc, message=f"stasis: {exc}") from exc
        if result.timed_out:
            raise ExecTimeoutError(command=argv, timeout_s=options["timeout"])
        return ExecResult(stdout=result.stdout_bytes, stderr=result.stderr_bytes, exit_code=result.exit_code)

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        if user is not None:
            await self._check_read_with_exec(path, user=user)
        workspace_path = await self._validate_path_access(path)
        try:
            return io.BytesIO(await self.sandbox.read_file(workspace_path.as_posix()))
        except FileNotFound as exc:
            raise WorkspaceReadNotFoundError(path=path, cause=exc) from exc
        except StasisError as exc:
            raise WorkspaceArchiveReadError(path=path, cause=exc) from exc

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        if user is not None:
            await self._check_write_with_exec(path, user=user)
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode()
        if not isinstance(payload, bytes | bytearray):
            raise WorkspaceWriteTypeError(path=path, actual_type=type(payload).__name__)
        workspace_path = await self._validate_path_access(path, for_write=True)
        try:
            await self.sandbox.write_file(workspace_path.as_posix(), bytes(payload))
        except StasisError as exc:
            raise WorkspaceArchiveWriteError(path=workspace_path, cause=exc) from exc

    async def running(self) -> bool:
        """Whether commands run now: a suspended sandbox is not running (the next command resumes it)."""
        try:
            return (await self.sandbox.info()).status == SandboxStatus.RUNNING
        except StasisError:
            return False

    async def persist_workspace(self) -> io.IOBase:
        root = self._workspace_root_path()
        try:
            return io.BytesIO(await self.sandbox.download_tar(root.as_posix()))
        except StasisError as exc:
            raise WorkspaceArchiveReadError(path=root, cause=exc) from exc

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = self._workspace_root_path()
        raw = data.read()
        if isinstance(raw, str):
            raw = raw.encode()
        try:  # members are checked in the sandbox before anything is written; the root is replaced whole
            await self.sandbox.upload_tar(bytes(raw), root.as_posix(), replace=True)
        except StasisError as exc:
            raise WorkspaceArchiveWriteError(path=root, cause=exc) from exc

    async def _shutdown_backend(self) -> None:
        try:
            if self.state.pause_on_exit:
                await self.sandbox.suspend()
            else:
                await self.sandbox.terminate()
        except StasisError as exc:
            log.warning("could not %s sandbox %s at the session's end: %s",
                        "suspend" if self.state.pause_on_exit else "terminate", self.state.sandbox_id, exc)  # fmt: skip


class StasisSandboxClient(BaseSandboxClient[StasisSandboxClientOptions]):
    """Creates, resumes and deletes stasis sandboxes for the Agents SDK."""

    backend_id = BACKEND_ID

    def __init__(self, client: AsyncClient | None = None) -> None:
        self.client = client or AsyncClient()

    async def create(self, *, snapshot: SnapshotSpec | SnapshotBase | None = None, manifest: Manifest | None = None,
                     options: StasisSandboxClientOptions) -> SandboxSession:  # fmt: skip
        manifest = self._validate_manifest_for_create(manifest if manifest is not None else Manifest())
        sandbox = await self._new_sandbox(options.name, options.image, options.template, options.network)
        session_id = uuid.uuid4()
        state = StasisSandboxSessionState(
            session_id=session_id, manifest=manifest, snapshot=resolve_snapshot(snapshot, str(session_id)),
            sandbox_id=sandbox.id, name=options.name, image=options.image, template=options.template,
            network=options.network, pause_on_exit=options.pause_on_exit, exec_timeout=options.exec_timeout,
        )  # fmt: skip
        return self._wrap_session(StasisSandboxSession(state=state, sandbox=sandbox))

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if not isinstance(inner, StasisSandboxSession):
            raise TypeError("StasisSandboxClient.delete expects a session it created")
        with contextlib.suppress(SandboxNotFound):
            await inner.sandbox.terminate()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, StasisSandboxSessionState):
            raise TypeError("StasisSandboxClient.resume expects a StasisSandboxSessionState")
        state.assert_path_grants_rebound()
        try:
            sandbox = await AsyncSandbox.connect(state.sandbox_id, client=self.client)
            reattached = sandbox.status != SandboxStatus.TERMINATED
        except SandboxNotFound:
            reattached = False
        if not reattached:  # gone: a new sandbox, which the SDK hydrates from the session's snapshot
            log.info("sandbox %s is gone; creating a new one for session %s", state.sandbox_id, state.session_id)
            sandbox = await self._new_sandbox(None, state.image, state.template, state.network)
            state.sandbox_id = sandbox.id
            state.workspace_root_ready = False
        inner = StasisSandboxSession(state=state, sandbox=sandbox)
        # a reattached sandbox kept everything (files, users, processes): nothing to set up again
        inner._set_start_state_preserved(reattached, system=reattached)
        return self._wrap_session(inner)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, StasisSandboxSessionState)

    async def _new_sandbox(self, name: str | None, image: str, template: str | None, network: bool) -> AsyncSandbox:
        return await AsyncSandbox.create(name, client=self.client, image=image, template=template, network=network)


__all__ = [
    "StasisSandboxClient",
    "StasisSandboxClientOptions",
    "StasisSandboxSession",
    "StasisSandboxSessionState",
]
