"""``AsyncSandbox``: a sandbox driven from asyncio. The twin of ``Sandbox``: same recipes, awaited I/O."""

from __future__ import annotations

import base64
import inspect
import logging
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

from typing_extensions import Unpack

from ..errors import Forbidden, ImageNotFound, InvalidRequest
from ..images import ImageInfo
from ..models import (
    CheckpointInfo,
    CheckpointType,
    ExposedPort,
    FileEntry,
    ProcessInfo,
    ProcessOutput,
    RunRequest,
    SandboxInfo,
    TransferResult,
)
from ..netpolicy import NetworkPolicy
from . import _base as b
from . import _host as h
from ._client import AsyncClient
from ._dirs import pack, unpack
from ._images import FIRST_USE, build_image_call, first_use_recipe
from .code import CodeContext, CodeRecipes, Execution, ExecutionBuilder, OnResult, OnText
from .desktop import DesktopRecipes, Keyboard, Mouse

log = logging.getLogger(__name__)


class AsyncSandbox(b.SandboxBase, CodeRecipes, DesktopRecipes):
    """A sandbox, driven from asyncio. Same methods as :class:`Sandbox`, awaited."""

    _client: AsyncClient

    # ---------------------------------------------------- lifecycle

    @classmethod
    async def create(
        cls, name: str | None = None, *, client: AsyncClient | None = None, **options: Unpack[b.CreateOptions]
    ) -> AsyncSandbox:
        """A new sandbox: from an image, or from a checkpoint (``snapshot_id``: its processes and files). A
        built-in image not built on this host yet is built first (logged: it takes minutes, once)."""
        client = client or AsyncClient()
        call = b.create_call(name, options)
        try:
            return cls(await client.call(call), client)
        except ImageNotFound as exc:
            if (recipe := first_use_recipe(exc)) is None:
                raise
            missing = exc
        try:
            await build_on_first_use(recipe, client)
        except Forbidden:  # a team's key builds no image: the host's owner does, as the message says
            raise missing from None
        return cls(await client.call(call), client)

    @classmethod
    async def connect(cls, id_or_name: str, client: AsyncClient | None = None) -> AsyncSandbox:
        client = client or AsyncClient()
        return cls(await client.call(b.connect_call(id_or_name)), client)

    @classmethod
    async def list(
        cls,
        include_terminated: bool = False,
        client: AsyncClient | None = None,
        *,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[SandboxInfo]:
        """Oldest first; ``limit`` makes it a page, ``after`` (the last id of the previous page) the next one."""
        return await (client or AsyncClient()).call(b.list_call(include_terminated, limit, after))

    async def info(self) -> SandboxInfo:
        return await self._client.call(self._info_call())

    async def suspend(self, keep_memory: bool | None = None) -> SandboxInfo:
        """Save memory, processes and files to disk; nothing of it keeps running. ``keep_memory=False``: its files
        only (cheaper; the next resume boots it again with them); default: as it was created (``keep_memory``)."""
        return await self._client.call(self._suspend_call(keep_memory))

    async def resume(self) -> SandboxInfo:
        return await self._client.call(self._lifecycle_call("resume"))

    async def move(self, node: str | None = None) -> SandboxInfo:
        """Through a fleet's front door: suspend it, hand it over through the store and resume it on ``node`` (the
        roomiest other node if None), its memory and processes kept."""
        return await self._client.call(b.Call("POST", f"{self._url}/move", self._keep, json={"node": node}))

    async def push(self) -> TransferResult:
        """Suspend it (if it runs) and hand it to the daemon's remote store: it leaves this node, and any
        node of the store resumes it (``Sandbox.pull`` or a resume by name there)."""
        return await self._client.call(h.remote_call("push", self.id, "sandbox"))

    @classmethod
    async def pull(cls, ref: str, client: AsyncClient | None = None) -> TransferResult:
        """Take a sandbox over from the remote store, suspended (a resume by name does this too)."""
        return await (client or AsyncClient()).call(h.remote_call("pull", ref, "sandbox"))

    @classmethod
    async def push_checkpoint(cls, ref: str, client: AsyncClient | None = None) -> TransferResult:
        """Copy a checkpoint to the remote store, for any node to restore."""
        return await (client or AsyncClient()).call(h.remote_call("push", ref, "checkpoint"))

    @classmethod
    async def pull_checkpoint(cls, ref: str, client: AsyncClient | None = None) -> TransferResult:
        """Copy a checkpoint from the remote store to this node (a create from it does this too)."""
        return await (client or AsyncClient()).call(h.remote_call("pull", ref, "checkpoint"))

    async def terminate(self) -> SandboxInfo:
        return await self._client.call(self._terminate_call())

    async def aclose(self) -> None:
        """Close the connection to the daemon; the sandbox keeps running."""
        await self._client.aclose()

    # ---------------------------------------------------- checkpoints and forks

    async def checkpoint(
        self, checkpoint_type: CheckpointType | str = CheckpointType.MEMORY, **options: Unpack[b.CheckpointOptions]
    ) -> CheckpointInfo:
        """An immutable artifact of this instant; the sandbox keeps running. Restore with ``create(snapshot_id=)``."""
        return await self._client.call(self._checkpoint_call(checkpoint_type, options))

    async def copy(self, times: int = 1) -> list[AsyncSandbox]:
        """Live forks: new running sandboxes that continue from this instant, then diverge."""
        return [AsyncSandbox(info, self._client) for info in await self._client.call(self._fork_call(times))]

    @classmethod
    async def fork(cls, checkpoint: str, n: int = 1, client: AsyncClient | None = None) -> list[AsyncSandbox]:
        """Rollouts: ``n`` sandboxes from one checkpoint (id or name), each going on from its instant; through
        a fleet's front door, spread over its nodes. All or none."""
        client = client or AsyncClient()
        return [AsyncSandbox(info, client) for info in await client.call(b.fork_checkpoint_call(checkpoint, n))]

    @classmethod
    async def terminate_all(
        cls, sandboxes: Iterable[AsyncSandbox | str], client: AsyncClient | None = None
    ) -> list[str]:
        """Every sandbox given (objects, names or ids) removed in one call, e.g. a rollout's forks; through a
        fleet, each on its node. The ids removed; StasisError naming those that could not be (the rest go)."""
        items = list(sandboxes)
        refs = [s if isinstance(s, str) else s.id for s in items]
        client = client or next((s._client for s in items if not isinstance(s, str)), None) or AsyncClient()
        return await client.call(b.remove_many_call(refs)) if refs else []

    @classmethod
    async def list_checkpoints(cls, client: AsyncClient | None = None) -> list[CheckpointInfo]:
        return await (client or AsyncClient()).call(b.list_checkpoints_call())

    @classmethod
    async def get_checkpoint(cls, checkpoint_id: str, client: AsyncClient | None = None) -> CheckpointInfo:
        return await (client or AsyncClient()).call(b.checkpoint_call("GET", checkpoint_id))

    @classmethod
    async def delete_checkpoint(cls, checkpoint_id: str, client: AsyncClient | None = None) -> CheckpointInfo:
        return await (client or AsyncClient()).call(b.checkpoint_call("DELETE", checkpoint_id))

    # ---------------------------------------------------- commands

    async def run(
        self, command: b.Command, args: b.Args = None, **options: Unpack[b.WatchedRunOptions]
    ) -> b.CommandResult:
        """Run to completion. With ``on_stdout``/``on_stderr``, output reaches them as it is produced."""
        request, collector = self._run_plan(command, args, options)
        if collector is None:
            return await self._client.call(self._run_call(request))
        async for event in self._events(request):
            collector.feed(event)
        return collector.finish()

    async def stream(
        self, command: b.Command, args: b.Args = None, **options: Unpack[b.RunOptions]
    ) -> AsyncIterator[b.OutputEvent]:
        """Run and yield stdout/stderr chunks while the command runs; the last event is ``exit``."""
        async for event in self._events(b.run_request(command, args, options)):
            yield event

    async def _events(self, request: RunRequest) -> AsyncIterator[b.OutputEvent]:
        async for line in self._client.stream_lines(self._stream_call(request)):
            if (event := b.stream_event(line)) is not None:
                yield event

    # ---------------------------------------------------- code: Jupyter kernels (the code-interpreter image)

    async def run_code(
        self, code: str, language: str | None = None, context: CodeContext | str | None = None, *,
        on_stdout: OnText | None = None, on_stderr: OnText | None = None, on_result: OnResult | None = None,
        envs: dict[str, str] | None = None, timeout: float | None = None,
    ) -> Execution:  # fmt: skip
        """As ``Sandbox.run_code``; the callbacks may be coroutine functions."""
        builder = ExecutionBuilder(on_stdout, on_stderr, on_result)
        async for line in self._client.stream_lines(self._code_execute_call(code, language, context, envs, timeout)):
            if inspect.isawaitable(answer := builder.feed(line)):
                await answer
        return builder.execution

    async def create_code_context(self, cwd: str | None = None, language: str | None = None) -> CodeContext:
        return await self._client.call(self._code_context_call(cwd, language))

    async def list_code_contexts(self) -> list[CodeContext]:
        return await self._client.call(self._code_contexts_call())

    async def restart_code_context(self, context: CodeContext | str) -> None:
        await self._client.call(self._code_context_action_call(context, "restart"))

    async def remove_code_context(self, context: CodeContext | str) -> None:
        await self._client.call(self._code_context_action_call(context, "remove"))

    async def follow_output(
        self, process_id: str, stream: str = "stdout", offset: int = 0, wait: float = 5.0
    ) -> AsyncIterator[tuple[int, bytes]]:
        """(offset, bytes) chunks of a process's output from ``offset`` until it ends.

        Keep the last offset plus the chunk's length: a client that comes back (after a kill, or a
        suspend) continues from there with nothing lost or repeated.
        """
        while True:
            chunk = await self.process_output(process_id, stream=stream, offset=offset, wait=wait)
            if data := base64.b64decode(chunk.data_b64):
                yield chunk.offset, data
            if chunk.eof:
                return
            offset = chunk.next_offset

    async def start_process(
        self, command: b.Command, args: b.Args = None, **options: Unpack[b.ProcessOptions]
    ) -> ProcessInfo:
        return await self._client.call(self._start_process_call(command, args, options))

    async def list_processes(self) -> list[ProcessInfo]:
        return await self._client.call(self._processes_call())

    async def get_process(self, process_id: str) -> ProcessInfo:
        return await self._client.call(self._process_call(process_id))

    async def process_output(
        self, process_id: str, stream: str = "stdout", offset: int = 0, max_bytes: int = 1 << 20, wait: float = 0
    ) -> ProcessOutput:
        return await self._client.call(self._output_call(process_id, stream, offset, max_bytes, wait))

    async def send_signal(self, process_id: str, signal: str = "SIGTERM") -> ProcessInfo:
        return await self._client.call(self._signal_call(process_id, signal))

    async def kill_process(self, process_id: str) -> ProcessInfo:
        return await self.send_signal(process_id, "SIGKILL")

    async def write_stdin(self, process_id: str, data: bytes | str, close: bool = False) -> None:
        await self._client.call(self._stdin_call(process_id, data, close))

    async def close_stdin(self, process_id: str) -> None:
        await self.write_stdin(process_id, b"", close=True)

    # ---------------------------------------------------- files

    async def read_file(self, path: str) -> bytes:
        return await self._client.call(self._read_call(path))

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> FileEntry:
        return await self._client.call(self._write_call(path, data, mode))

    async def upload_dir(self, local: str | Path, path: str, *, replace: bool = False) -> FileEntry:
        """Local directory ``local`` as directory ``path`` in the sandbox, whole or not at all (a tar stream)."""
        return await self._client.call(self._upload_tar_call(pack(local), path, replace))

    async def download_dir(self, path: str, local: str | Path, *, replace: bool = False) -> Path:
        """Directory ``path`` of the sandbox as local directory ``local``, whole or not at all."""
        return unpack(await self._client.call(self._download_dir_call(path)), local, replace)

    async def upload_tar(self, tar: bytes, path: str, *, replace: bool = False) -> FileEntry:
        """An uncompressed tar extracted as directory ``path``, whole or not at all."""
        return await self._client.call(self._upload_tar_call(tar, path, replace))

    async def download_tar(self, path: str) -> bytes:
        """Directory ``path`` as an uncompressed tar, its contents at the archive's root."""
        return await self._client.call(self._download_dir_call(path))

    async def list_directory(self, path: str = "/root") -> list[FileEntry]:
        return await self._client.call(self._list_call(path))

    async def stat(self, path: str) -> FileEntry:
        return await self._client.call(self._stat_call(path))

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self._client.call(self._remove_call(path, recursive))

    async def make_dir(self, path: str) -> FileEntry:
        return await self._client.call(self._mkdir_call(path))

    async def ssh_host_key(self) -> str:
        """The sandbox's own SSH host public key (made on first use; a fork or restore gets a new one)."""
        return await self._client.call(self._ssh_host_key_call())

    async def authorize_ssh_keys(self, public_keys: list[str]) -> None:
        """Let these OpenSSH public keys (lines of .pub files) log in as root; each is added once."""
        await self._client.call(self._ssh_authorize_call(public_keys))

    # -- network

    async def update_network(self, policy: NetworkPolicy | bool) -> SandboxInfo:
        """A new egress policy, live (the next connection is judged by it); True: the public internet."""
        return await self._client.call(self._update_network_call(policy))

    async def expose_port(self, port: int, *, public: bool = False, ttl_secs: int = 86400) -> str:
        """A URL on the daemon's host that reaches ``port`` in the sandbox (HTTP and WebSocket).

        It carries a token valid for ``ttl_secs`` (the URL without it gets 401) unless ``public``.
        A request to a suspended sandbox resumes it."""
        return (await self._client.call(self._expose_port_call(port, public, ttl_secs))).url

    async def ports(self) -> list[ExposedPort]:
        """Its exposed ports, each with a fresh URL."""
        return await self._client.call(self._ports_call())

    # ---------------------------------------------------- the desktop (image "desktop")

    async def screenshot(self) -> bytes:
        """The desktop's screen as PNG (its session is started first if it was not running)."""
        return await self._client.call(self._screenshot_call())

    @property
    def mouse(self) -> Mouse:
        return Mouse(self._url, self._client.call)

    @property
    def keyboard(self) -> Keyboard:
        return Keyboard(self._url, self._client.call)

    async def open(self, url: str) -> None:
        """Open ``url`` in the desktop's browser, in a new tab."""
        await self._client.call(self._open_call(url))

    async def start_desktop(self) -> None:
        """Wait until the desktop session answers (a desktop sandbox starts it by itself at boot)."""
        await self._client.call(self._desktop_call())

    async def egress_log(self) -> list[dict[str, Any]]:
        return await self._client.call(self._egress_call())

    async def follow_egress(self) -> AsyncIterator[dict[str, Any]]:
        async for line in self._client.stream_lines(self._egress_call(follow=True)):
            yield line

    async def unexpose_port(self, port: int) -> None:
        await self._client.call(self._unexpose_port_call(port))


__all__ = ["AsyncSandbox"]


async def build_on_first_use(recipe: str, client: AsyncClient) -> ImageInfo:
    """Build built-in image ``recipe`` for a call that needs it, its progress logged."""
    log.info(FIRST_USE, recipe)
    async for event in client.stream_lines(build_image_call(recipe, False)):
        if "progress" in event:
            log.info("%s: %s", recipe, event["progress"])
        if "result" in event:
            return ImageInfo.model_validate(event["result"])
    raise InvalidRequest("the daemon's answer ended before the image was ready; see the daemon's log")
