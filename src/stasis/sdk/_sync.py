"""``Sandbox``: a sandbox driven synchronously. Every method is a recipe of ``SandboxBase`` plus its I/O."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from typing_extensions import Unpack

from ..errors import Forbidden, ImageNotFound
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
from ._client import Client
from ._dirs import pack, unpack
from ._images import FIRST_USE, build_image_call, first_use_recipe, image_result
from .code import CodeContext, CodeRecipes, Execution, ExecutionBuilder, OnResult, OnText
from .desktop import DesktopRecipes, Keyboard, Mouse

log = logging.getLogger(__name__)


class Sandbox(b.SandboxBase, CodeRecipes, DesktopRecipes):
    """A sandbox, driven synchronously."""

    _client: Client

    # ---------------------------------------------------- lifecycle

    @classmethod
    def create(
        cls, name: str | None = None, *, client: Client | None = None, **options: Unpack[b.CreateOptions]
    ) -> Sandbox:
        """A new sandbox: from an image, or from a checkpoint (``snapshot_id``: its processes and files). A
        built-in image not built on this host yet is built first (logged: it takes minutes, once)."""
        client = client or Client()
        call = b.create_call(name, options)
        try:
            return cls(client.call(call), client)
        except ImageNotFound as exc:
            if (recipe := first_use_recipe(exc)) is None:
                raise
            missing = exc
        try:
            build_on_first_use(recipe, client)
        except Forbidden:  # a team's key builds no image: the host's owner does, as the message says
            raise missing from None
        return cls(client.call(call), client)

    @classmethod
    def connect(cls, id_or_name: str, client: Client | None = None) -> Sandbox:
        client = client or Client()
        return cls(client.call(b.connect_call(id_or_name)), client)

    @classmethod
    def list(
        cls,
        include_terminated: bool = False,
        client: Client | None = None,
        *,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[SandboxInfo]:
        """Oldest first; ``limit`` makes it a page, ``after`` (the last id of the previous page) the next one."""
        return (client or Client()).call(b.list_call(include_terminated, limit, after))

    def info(self) -> SandboxInfo:
        return self._client.call(self._info_call())

    def suspend(self, keep_memory: bool | None = None) -> SandboxInfo:
        """Save memory, processes and files to disk; nothing of it keeps running. ``keep_memory=False``: its files
        only (cheaper; the next resume boots it again with them); default: as it was created (``keep_memory``)."""
        return self._client.call(self._suspend_call(keep_memory))

    def resume(self) -> SandboxInfo:
        return self._client.call(self._lifecycle_call("resume"))

    def move(self, node: str | None = None) -> SandboxInfo:
        """Through a fleet's front door: suspend it, hand it over through the store and resume it on ``node`` (the
        roomiest other node if None), its memory and processes kept."""
        return self._client.call(b.Call("POST", f"{self._url}/move", self._keep, json={"node": node}))

    def push(self) -> TransferResult:
        """Suspend it (if it runs) and hand it to the daemon's remote store: it leaves this node, and any
        node of the store resumes it (``Sandbox.pull`` or a resume by name there)."""
        return self._client.call(h.remote_call("push", self.id, "sandbox"))

    @classmethod
    def pull(cls, ref: str, client: Client | None = None) -> TransferResult:
        """Take a sandbox over from the remote store, suspended (a resume by name does this too)."""
        return (client or Client()).call(h.remote_call("pull", ref, "sandbox"))

    @classmethod
    def push_checkpoint(cls, ref: str, client: Client | None = None) -> TransferResult:
        """Copy a checkpoint to the remote store, for any node to restore."""
        return (client or Client()).call(h.remote_call("push", ref, "checkpoint"))

    @classmethod
    def pull_checkpoint(cls, ref: str, client: Client | None = None) -> TransferResult:
        """Copy a checkpoint from the remote store to this node (a create from it does this too)."""
        return (client or Client()).call(h.remote_call("pull", ref, "checkpoint"))

    def terminate(self) -> SandboxInfo:
        return self._client.call(self._terminate_call())

    def close(self) -> None:
        """Close the connection to the daemon; the sandbox keeps running."""
        self._client.close()

    # ---------------------------------------------------- checkpoints and forks

    def checkpoint(
        self, checkpoint_type: CheckpointType | str = CheckpointType.MEMORY, **options: Unpack[b.CheckpointOptions]
    ) -> CheckpointInfo:
        """An immutable artifact of this instant; the sandbox keeps running. Restore with ``create(snapshot_id=)``."""
        return self._client.call(self._checkpoint_call(checkpoint_type, options))

    def copy(self, times: int = 1) -> list[Sandbox]:
        """Live forks: new running sandboxes that continue from this instant, then diverge."""
        return [Sandbox(info, self._client) for info in self._client.call(self._fork_call(times))]

    @classmethod
    def fork(cls, checkpoint: str, n: int = 1, client: Client | None = None) -> list[Sandbox]:
        """Rollouts: ``n`` sandboxes from one checkpoint (id or name), each going on from its instant; through
        a fleet's front door, spread over its nodes. All or none."""
        client = client or Client()
        return [Sandbox(info, client) for info in client.call(b.fork_checkpoint_call(checkpoint, n))]

    @classmethod
    def terminate_all(cls, sandboxes: Iterable[Sandbox | str], client: Client | None = None) -> list[str]:
        """Every sandbox given (objects, names or ids) removed in one call, e.g. a rollout's forks; through a
        fleet, each on its node. The ids removed; StasisError naming those that could not be (the rest go)."""
        items = list(sandboxes)
        refs = [s if isinstance(s, str) else s.id for s in items]
        client = client or next((s._client for s in items if not isinstance(s, str)), None) or Client()
        return client.call(b.remove_many_call(refs)) if refs else []

    @classmethod
    def list_checkpoints(cls, client: Client | None = None) -> list[CheckpointInfo]:
        return (client or Client()).call(b.list_checkpoints_call())

    @classmethod
    def get_checkpoint(cls, checkpoint_id: str, client: Client | None = None) -> CheckpointInfo:
        return (client or Client()).call(b.checkpoint_call("GET", checkpoint_id))

    @classmethod
    def delete_checkpoint(cls, checkpoint_id: str, client: Client | None = None) -> CheckpointInfo:
        return (client or Client()).call(b.checkpoint_call("DELETE", checkpoint_id))

    # ---------------------------------------------------- commands

    def run(self, command: b.Command, args: b.Args = None, **options: Unpack[b.WatchedRunOptions]) -> b.CommandResult:
        """Run to completion. With ``on_stdout``/``on_stderr``, output reaches them as it is produced."""
        request, collector = self._run_plan(command, args, options)
        if collector is None:
            return self._client.call(self._run_call(request))
        for event in self._events(request):
            collector.feed(event)
        return collector.finish()

    def stream(
        self, command: b.Command, args: b.Args = None, **options: Unpack[b.RunOptions]
    ) -> Iterator[b.OutputEvent]:
        """Run and yield stdout/stderr chunks while the command runs; the last event is ``exit``."""
        return self._events(b.run_request(command, args, options))

    def _events(self, request: RunRequest) -> Iterator[b.OutputEvent]:
        for line in self._client.stream_lines(self._stream_call(request)):
            if (event := b.stream_event(line)) is not None:
                yield event

    # ---------------------------------------------------- code: Jupyter kernels (the code-interpreter image)

    def run_code(
        self, code: str, language: str | None = None, context: CodeContext | str | None = None, *,
        on_stdout: OnText | None = None, on_stderr: OnText | None = None, on_result: OnResult | None = None,
        envs: dict[str, str] | None = None, timeout: float | None = None,
    ) -> Execution:  # fmt: skip
        """Run ``code`` in a Jupyter kernel of the sandbox: its output, rich results (a plot as PNG, a DataFrame
        as HTML) and error (returned, never raised). The kernel keeps its variables for the next call, across
        suspends, restarts and forks. ``timeout``: seconds, then the kernel is interrupted (it stays usable)."""
        builder = ExecutionBuilder(on_stdout, on_stderr, on_result)
        for line in self._client.stream_lines(self._code_execute_call(code, language, context, envs, timeout)):
            builder.feed(line)
        return builder.execution

    def create_code_context(self, cwd: str | None = None, language: str | None = None) -> CodeContext:
        """A kernel of its own (``language``: python, the default, or bash), started in ``cwd``."""
        return self._client.call(self._code_context_call(cwd, language))

    def list_code_contexts(self) -> list[CodeContext]:
        return self._client.call(self._code_contexts_call())

    def restart_code_context(self, context: CodeContext | str) -> None:
        """A fresh kernel in its place: its variables are gone."""
        self._client.call(self._code_context_action_call(context, "restart"))

    def remove_code_context(self, context: CodeContext | str) -> None:
        self._client.call(self._code_context_action_call(context, "remove"))

    def follow_output(
        self, process_id: str, stream: str = "stdout", offset: int = 0, wait: float = 5.0
    ) -> Iterator[tuple[int, bytes]]:
        """(offset, bytes) chunks of a process's output from ``offset`` until it ends.

        Keep the last offset plus the chunk's length: a client that comes back (after a kill, or a
        suspend) continues from there with nothing lost or repeated.
        """
        while True:
            chunk = self.process_output(process_id, stream=stream, offset=offset, wait=wait)
            if data := base64.b64decode(chunk.data_b64):
                yield chunk.offset, data
            if chunk.eof:
                return
            offset = chunk.next_offset

    def start_process(
        self, command: b.Command, args: b.Args = None, **options: Unpack[b.ProcessOptions]
    ) -> ProcessInfo:
        return self._client.call(self._start_process_call(command, args, options))

    def list_processes(self) -> list[ProcessInfo]:
        return self._client.call(self._processes_call())

    def get_process(self, process_id: str) -> ProcessInfo:
        return self._client.call(self._process_call(process_id))

    def process_output(
        self, process_id: str, stream: str = "stdout", offset: int = 0, max_bytes: int = 1 << 20, wait: float = 0
    ) -> ProcessOutput:
        return self._client.call(self._output_call(process_id, stream, offset, max_bytes, wait))

    def send_signal(self, process_id: str, signal: str = "SIGTERM") -> ProcessInfo:
        return self._client.call(self._signal_call(process_id, signal))

    def kill_process(self, process_id: str) -> ProcessInfo:
        return self.send_signal(process_id, "SIGKILL")

    def write_stdin(self, process_id: str, data: bytes | str, close: bool = False) -> None:
        self._client.call(self._stdin_call(process_id, data, close))

    def close_stdin(self, process_id: str) -> None:
        self.write_stdin(process_id, b"", close=True)

    # ---------------------------------------------------- files

    def read_file(self, path: str) -> bytes:
        return self._client.call(self._read_call(path))

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> FileEntry:
        return self._client.call(self._write_call(path, data, mode))

    def upload_dir(self, local: str | Path, path: str, *, replace: bool = False) -> FileEntry:
        """Local directory ``local`` as directory ``path`` in the sandbox, whole or not at all (a tar stream)."""
        return self._client.call(self._upload_tar_call(pack(local), path, replace))

    def download_dir(self, path: str, local: str | Path, *, replace: bool = False) -> Path:
        """Directory ``path`` of the sandbox as local directory ``local``, whole or not at all."""
        return unpack(self._client.call(self._download_dir_call(path)), local, replace)

    def upload_tar(self, tar: bytes, path: str, *, replace: bool = False) -> FileEntry:
        """An uncompressed tar extracted as directory ``path``, whole or not at all."""
        return self._client.call(self._upload_tar_call(tar, path, replace))

    def download_tar(self, path: str) -> bytes:
        """Directory ``path`` as an uncompressed tar, its contents at the archive's root."""
        return self._client.call(self._download_dir_call(path))

    def list_directory(self, path: str = "/root") -> list[FileEntry]:
        return self._client.call(self._list_call(path))

    def stat(self, path: str) -> FileEntry:
        return self._client.call(self._stat_call(path))

    def remove(self, path: str, recursive: bool = False) -> None:
        self._client.call(self._remove_call(path, recursive))

    def make_dir(self, path: str) -> FileEntry:
        return self._client.call(self._mkdir_call(path))

    def ssh_host_key(self) -> str:
        """The sandbox's own SSH host public key (made on first use; a fork or restore gets a new one)."""
        return self._client.call(self._ssh_host_key_call())

    def authorize_ssh_keys(self, public_keys: list[str]) -> None:
        """Let these OpenSSH public keys (lines of .pub files) log in as root; each is added once."""
        self._client.call(self._ssh_authorize_call(public_keys))

    # -- network

    def update_network(self, policy: NetworkPolicy | bool) -> SandboxInfo:
        """A new egress policy, live (the next connection is judged by it); True: the public internet."""
        return self._client.call(self._update_network_call(policy))

    def expose_port(self, port: int, *, public: bool = False, ttl_secs: int = 86400) -> str:
        """A URL on the daemon's host that reaches ``port`` in the sandbox (HTTP and WebSocket).

        It carries a token valid for ``ttl_secs`` (the URL without it gets 401) unless ``public``.
        A request to a suspended sandbox resumes it."""
        return (self._client.call(self._expose_port_call(port, public, ttl_secs))).url

    def ports(self) -> list[ExposedPort]:
        """Its exposed ports, each with a fresh URL."""
        return self._client.call(self._ports_call())

    def unexpose_port(self, port: int) -> None:
        self._client.call(self._unexpose_port_call(port))

    # ---------------------------------------------------- the desktop (image "desktop")

    def screenshot(self) -> bytes:
        """The desktop's screen as PNG (its session is started first if it was not running)."""
        return self._client.call(self._screenshot_call())

    @property
    def mouse(self) -> Mouse:
        return Mouse(self._url, self._client.call)

    @property
    def keyboard(self) -> Keyboard:
        return Keyboard(self._url, self._client.call)

    def open(self, url: str) -> None:
        """Open ``url`` in the desktop's browser (its window, its address bar, the URL, Return)."""
        self._client.call(self._open_call(url))

    def start_desktop(self) -> None:
        """Wait until the desktop session answers (a desktop sandbox starts it by itself at boot)."""
        self._client.call(self._desktop_call())

    def egress_log(self) -> list[dict[str, Any]]:
        """Every connection it opened, allowed or denied (time, destination, port, name, verdict, rule, bytes each
        way), oldest first, as far as the rotation keeps them."""
        return self._client.call(self._egress_call())

    def follow_egress(self) -> Iterator[dict[str, Any]]:
        """The kept lines, then each new connection as it ends (or is denied), until the iterator is closed."""
        return self._client.stream_lines(self._egress_call(follow=True))


__all__ = ["Sandbox"]


def build_on_first_use(recipe: str, client: Client) -> None:
    """Build built-in image ``recipe`` for a call that needs it, its progress logged."""
    log.info(FIRST_USE, recipe)
    image_result(client.stream_lines(build_image_call(recipe, False)), lambda line: log.info("%s: %s", recipe, line))
