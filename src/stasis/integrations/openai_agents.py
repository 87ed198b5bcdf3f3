"""An OpenAI Agents SDK sandbox provider (``agents.sandbox``): a SandboxAgent's shell and workspace in stasis.

    from agents import Runner
    from agents.run_config import RunConfig, SandboxRunConfig
    from stasis.integrations.openai_agents import StasisSandboxClient, StasisSandboxClientOptions

    run_config = RunConfig(sandbox=SandboxRunConfig(client=StasisSandboxClient(),
                                                    options=StasisSandboxClientOptions(name="work")))
    await Runner.run(agent, "start the dev server", run_config=run_config)
    await Runner.run(agent, "is it still up?", run_config=run_config)   # the same sandbox, as it was

Modelled member by member on the SDK's E2B provider. When the Runner owns the session, its end suspends
the sandbox (``pause_on_exit``, the default): memory and running processes are kept, not only the
workspace, and ``delete`` leaves it (as E2B's does). The next run reattaches: by the saved session state
(``resume``), or, in the plainest usage above, by the sandbox's ``name`` (``create`` finds it and resumes
it). A reattached sandbox's workspace is already there, so it is not hydrated again. Only a sandbox that
is gone is replaced by a new one, which the SDK hydrates from the session's workspace snapshot.
``pause_on_exit=False`` terminates the sandbox at the session's end instead.
"""

from __future__ import annotations

import io
import logging
import tarfile
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
from agents.sandbox.session.pty_types import PtyExecUpdate  # noqa: E402
from agents.sandbox.session.runtime_helpers import (  # noqa: E402
    RESOLVE_WORKSPACE_PATH_HELPER,
    RuntimeHelperScript,
)
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions  # noqa: E402
from agents.sandbox.session.sandbox_session import SandboxSession  # noqa: E402
from agents.sandbox.session.sandbox_session_state import SandboxSessionState  # noqa: E402
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot  # noqa: E402
from agents.sandbox.types import ExecResult, User  # noqa: E402

from ..errors import FileNotFound, SandboxNotFound, StasisError  # noqa: E402
from ..models import SandboxStatus  # noqa: E402
from ..sdk import AsyncClient, AsyncSandbox  # noqa: E402
from .openai_agents_pty import PtyProcesses  # noqa: E402

log = logging.getLogger(__name__)

BACKEND_ID = "stasis"
SHORTEST_TIMEOUT = 1.0  # a timeout of 0 or less: as the E2B provider, one second (stasis needs > 0)


class StasisSandboxClientOptions(BaseSandboxClientOptions):
    """How to create a stasis sandbox for a session. ``name`` makes it findable by the next run."""

    type: Literal["stasis"] = "stasis"
    name: str | None = None
    image: str = "default"
    template: str | None = None
    network: bool = False
    envs: dict[str, str] | None = None  # for every command, under the manifest's environment
    pause_on_exit: bool = True  # suspend (memory and processes kept) when the session ends; False: terminate
    exec_timeout: float | None = None  # seconds a command may run when the SDK gives none; None: no limit

    def __init__(self, name: str | None = None, image: str = "default", template: str | None = None,
                 network: bool = False, envs: dict[str, str] | None = None, pause_on_exit: bool = True,
                 exec_timeout: float | None = None, *, type: Literal["stasis"] = "stasis") -> None:  # fmt: skip
        super().__init__(type=type, name=name, image=image, template=template, network=network, envs=envs,
                         pause_on_exit=pause_on_exit, exec_timeout=exec_timeout)  # fmt: skip


class StasisSandboxSessionState(SandboxSessionState):
    type: Literal["stasis"] = "stasis"
    sandbox_id: str
    name: str | None = None
    image: str = "default"
    template: str | None = None
    network: bool = False
    base_envs: dict[str, str] = {}
    pause_on_exit: bool = True
    exec_timeout: float | None = None


class StasisSandboxSession(BaseSandboxSession):
    """One stasis sandbox behind the SDK's session interface."""

    state: StasisSandboxSessionState

    def __init__(self, *, state: StasisSandboxSessionState, sandbox: AsyncSandbox) -> None:
        self.state = state
        self.sandbox = sandbox
        self.ptys = PtyProcesses(sandbox)

    # -- commands

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None) -> ExecResult:
        argv, user = _without_sudo([str(c) for c in command])
        stdout, stderr = bytearray(), bytearray()  # all of it: the SDK bounds what the model sees itself
        options: dict[str, Any] = {"env": await self._resolved_envs(), "on_stdout": stdout.extend,
                                   "on_stderr": stderr.extend, **({"user": user} if user else {})}  # fmt: skip
        if (seconds := self._timeout(timeout)) is not None:
            options["timeout"] = seconds
        if self.state.workspace_root_ready:
            options["working_dir"] = self.state.manifest.root
        try:
            result = await self.sandbox.run(argv, **options)
        except StasisError as exc:
            raise ExecTransportError(command=argv, cause=exc, message=f"stasis: {exc}") from exc
        if result.timed_out:
            raise ExecTimeoutError(command=argv, timeout_s=seconds)
        return ExecResult(stdout=bytes(stdout), stderr=bytes(stderr), exit_code=result.exit_code)

    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(
        self, *command: str | Path, timeout: float | None = None, shell: bool | list[str] = True,
        user: str | User | None = None, tty: bool = False, yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:  # fmt: skip
        argv, as_user = _without_sudo(self._prepare_exec_command(*command, shell=shell, user=user))
        cwd = self.state.manifest.root if self.state.workspace_root_ready else None
        try:
            return await self.ptys.start(
                argv, env=await self._resolved_envs(), cwd=cwd, user=as_user, tty=tty, timeout=self._timeout(timeout),
                yield_time_s=yield_time_s, max_output_tokens=max_output_tokens,
            )  # fmt: skip
        except StasisError as exc:
            raise ExecTransportError(command=argv, cause=exc, message=f"stasis: {exc}") from exc

    async def pty_write_stdin(
        self, *, session_id: int, chars: str, yield_time_s: float | None = None, max_output_tokens: int | None = None
    ) -> PtyExecUpdate:
        return await self.ptys.write(session_id, chars, yield_time_s, max_output_tokens)

    async def pty_terminate_all(self) -> None:
        await self.ptys.end_all()

    async def _resolved_envs(self) -> dict[str, str]:
        return {**self.state.base_envs, **await self.state.manifest.environment.resolve()}

    def _timeout(self, timeout: float | None) -> float | None:
        """The SDK's timeout: None is no limit (or the options' ``exec_timeout``); 0 or less, one second."""
        if timeout is None:
            return self.state.exec_timeout
        return max(timeout, SHORTEST_TIMEOUT)

    # -- files: paths are resolved inside the sandbox, so a workspace symlink cannot lead outside it

    async def _validate_path_access(self, path: Path | str, *, for_write: bool = False) -> Path:
        return await self._validate_remote_path_access(path, for_write=for_write)

    def _runtime_helpers(self) -> tuple[RuntimeHelperScript, ...]:
        return (RESOLVE_WORKSPACE_PATH_HELPER,)

    def _current_runtime_helper_cache_key(self) -> object | None:
        return self.state.sandbox_id

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
        """Whether commands run now on a workspace that is set up (as the E2B provider answers it)."""
        if not self.state.workspace_root_ready:
            return False
        try:
            return (await self.sandbox.info()).status == SandboxStatus.RUNNING
        except StasisError:
            return False

    # -- the workspace as a tar, without the paths the SDK keeps out of it (ephemeral entries, mounts)

    async def persist_workspace(self) -> io.IOBase:
        root = self._workspace_root_path()
        try:
            archive = await self.sandbox.download_tar(root.as_posix())
        except StasisError as exc:
            raise WorkspaceArchiveReadError(path=root, cause=exc) from exc
        return io.BytesIO(_without(archive, self._persist_workspace_skip_relpaths()))

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = self._workspace_root_path()
        raw = data.read()
        if isinstance(raw, str):
            raw = raw.encode()
        try:  # checked in the sandbox before anything is written; the root is replaced in place, whole
            await self.sandbox.upload_tar(bytes(raw), root.as_posix(), replace=True)
        except StasisError as exc:
            raise WorkspaceArchiveWriteError(path=root, cause=exc) from exc

    async def _shutdown_backend(self) -> None:
        verb = "suspend" if self.state.pause_on_exit else "terminate"
        try:
            if self.state.pause_on_exit:
                await self.sandbox.suspend()
            else:
                await self.sandbox.terminate()
        except StasisError as exc:  # a suspend that cannot save leaves it running, memory intact
            log.warning("could not %s sandbox %s at the session's end: %s", verb, self.state.sandbox_id, exc)


def _without_sudo(argv: list[str]) -> tuple[list[str], str | None]:
    """SandboxSession.exec runs another user's command as `sudo -u USER -- ...`: stasis runs it as that user."""
    if len(argv) >= 4 and argv[0] == "sudo" and argv[1] == "-u" and argv[3] == "--":
        return argv[4:], argv[2]
    return argv, None


def _without(archive: bytes, skipped: set[Path]) -> bytes:
    """The tar without the members at or under ``skipped`` (paths relative to its root)."""
    if not skipped:
        return archive
    names = {p.as_posix().strip("/") for p in skipped}
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(archive)) as source, tarfile.open(fileobj=out, mode="w") as target:
        for member in source:
            name = member.name.removeprefix("./").strip("/")
            if any(name == skip or name.startswith(f"{skip}/") for skip in names):
                continue
            target.addfile(member, source.extractfile(member) if member.isfile() else None)
    return out.getvalue()


class StasisSandboxClient(BaseSandboxClient[StasisSandboxClientOptions]):
    """Creates, finds and resumes stasis sandboxes for the Agents SDK."""

    backend_id = BACKEND_ID

    def __init__(self, client: AsyncClient | None = None) -> None:
        self.client = client or AsyncClient()

    async def create(self, *, snapshot: SnapshotSpec | SnapshotBase | None = None, manifest: Manifest | None = None,
                     options: StasisSandboxClientOptions) -> SandboxSession:  # fmt: skip
        """A new sandbox; or, when ``options.name`` names one that is there, that one as it was (resumed)."""
        manifest = self._validate_manifest_for_create(manifest if manifest is not None else Manifest())
        found = await self._live(options.name) if options.name else None
        sandbox = found or await self._new_sandbox(options.name, options.image, options.template, options.network)
        session_id = uuid.uuid4()
        state = StasisSandboxSessionState(
            session_id=session_id, manifest=manifest, snapshot=resolve_snapshot(snapshot, str(session_id)),
            sandbox_id=sandbox.id, name=options.name, image=options.image, template=options.template,
            network=options.network, base_envs=dict(options.envs or {}), pause_on_exit=options.pause_on_exit,
            exec_timeout=options.exec_timeout,
        )  # fmt: skip
        return self._session(state, sandbox, preserved=found is not None)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Nothing more to do, as with E2B's provider: the session's end already suspended the sandbox (or,
        with ``pause_on_exit=False``, terminated it). `stasis rm NAME` removes a kept one."""
        if not isinstance(session._inner, StasisSandboxSession):
            raise TypeError("StasisSandboxClient.delete expects a session it created")
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, StasisSandboxSessionState):
            raise TypeError("StasisSandboxClient.resume expects a StasisSandboxSessionState")
        state.assert_path_grants_rebound()
        found = await self._live(state.sandbox_id)
        sandbox = found
        if sandbox is None:  # gone: a new sandbox, which the SDK hydrates from the session's snapshot
            log.info("sandbox %s is gone; creating a new one for session %s", state.sandbox_id, state.session_id)
            sandbox = await self._new_sandbox(None, state.image, state.template, state.network)
            state.sandbox_id = sandbox.id
            state.workspace_root_ready = False
        return self._session(state, sandbox, preserved=found is not None)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, StasisSandboxSessionState)

    def _session(self, state: StasisSandboxSessionState, sandbox: AsyncSandbox, preserved: bool) -> SandboxSession:
        inner = StasisSandboxSession(state=state, sandbox=sandbox)
        # a reattached sandbox kept everything (files, users, processes): the SDK probes its workspace root
        # and, when it is there, neither applies the manifest again nor hydrates it
        inner._set_start_state_preserved(preserved, system=preserved)
        return self._wrap_session(inner)

    async def _live(self, ref: str) -> AsyncSandbox | None:
        """The sandbox ``ref`` running (resumed if it was suspended, as E2B's connect resumes a paused one),
        or None when there is none."""
        try:
            sandbox = await AsyncSandbox.connect(ref, client=self.client)
        except SandboxNotFound:
            return None
        if sandbox.status == SandboxStatus.TERMINATED:
            return None
        if sandbox.status != SandboxStatus.RUNNING:
            await sandbox.resume()
        return sandbox

    async def _new_sandbox(self, name: str | None, image: str, template: str | None, network: bool) -> AsyncSandbox:
        return await AsyncSandbox.create(name, client=self.client, image=image, template=template, network=network)


__all__ = [
    "StasisSandboxClient",
    "StasisSandboxClientOptions",
    "StasisSandboxSession",
    "StasisSandboxSessionState",
]
