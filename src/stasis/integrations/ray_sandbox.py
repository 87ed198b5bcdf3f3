"""stasis as a backend of Ray's own sandbox API (``ray.experimental.sandbox``, Ray 2.60): its released backend
interface (create, delete, exec, read and write files, status) over stasis sandboxes, plus what the interface
lacks and stasis has: pause (a suspend keeping memory and processes), resume, checkpoint and restore.

It talks to one daemon or to a fleet's front door (``STASIS_FLEET``), through the SDK::

    from stasis.integrations.ray_sandbox import StasisSandboxBackend
    backend = StasisSandboxBackend()                      # STASIS_FLEET / STASIS_URL, or the local daemon
    sandbox_id = backend.create_sandbox(SandboxConfig(image="default", cpu=1, memory="512Mi"))
    backend.exec_command(sandbox_id, "echo hi").stdout    # 'hi\\n'

Ray 2.60's ``SandboxRuntime`` builds its gVisor backend itself and pulls images from a registry; a stasis
sandbox runs a stasis image (``stasis image ls``, ``stasis image import``), so the runtime is not used.
"""

from __future__ import annotations

import shlex
import time
from typing import Any

from ray.experimental.sandbox.backend.base import BaseSandboxBackend, ExecResult, SandboxStatus
from ray.experimental.sandbox.config import SandboxConfig, parse_memory_bytes
from ray.experimental.sandbox.exceptions import SandboxCreationError, SandboxNotFoundError

from .. import Client, Sandbox
from ..errors import InvalidRequest, NotFound, StasisError
from ..models import CheckpointType

STATUS = {"pending": SandboxStatus.PENDING, "resuming": SandboxStatus.PENDING, "terminated": SandboxStatus.TERMINATED,
          "terminating": SandboxStatus.TERMINATED, "failed": SandboxStatus.ERROR}  # fmt: skip
NETWORK = {"none": None, "public": True}  # Ray's modes stasis has; "host" and "sandbox" have no stasis meaning


class StasisImages:
    """Ray's image manager, as stasis needs it: nothing to pull (a stasis image is built or imported on the
    daemon), nothing to bundle."""

    def pull_image(self, image: str, timeout_seconds: float = 120.0, instance_id: str | None = None) -> str:
        return image

    def release_image(self, image: str, instance_id: str) -> None:
        return None


class StasisSandboxBackend(BaseSandboxBackend):
    def __init__(self, client: Client | None = None) -> None:
        super().__init__(image_manager=StasisImages())
        self.client = client or Client()
        self._settings: dict[str, tuple[dict[str, str], str | None, str]] = {}  # id -> its config's env, workdir, shell

    # ------------------------------------------------------------ the interface as released

    def create_sandbox(self, config: SandboxConfig) -> str:
        if config.network not in NETWORK:
            raise SandboxCreationError(f"network {config.network!r} has no stasis meaning: use 'none' or 'public'")
        # idle, it suspends (costing nothing; the next command resumes it), where Ray's would run on
        spec: dict[str, Any] = {"image": config.image, "network": NETWORK[config.network], "on_idle": "suspend"}
        if config.cpu:
            spec["cpus"] = float(config.cpu)
        if memory := parse_memory_bytes(config.memory):
            spec["memory_mb"] = max(128, memory >> 20)
        if config.ttl_seconds and config.ttl_seconds > 0:  # wall-clock from creation: a stasis lifetime
            ttl = int(config.ttl_seconds)
            spec |= {"lifetime_secs": ttl, "timeout_secs": ttl, "on_idle": "terminate"}
        try:
            sandbox = Sandbox.create(client=self.client, **spec)
        except StasisError as exc:
            raise SandboxCreationError(f"stasis could not create the sandbox: {exc.message}") from exc
        self._settings[sandbox.id] = (dict(config.env or {}), config.workdir, config.shell)
        return sandbox.id

    def delete_sandbox(self, sandbox_id: str) -> None:
        try:
            self._sandbox(sandbox_id).terminate()
        finally:
            self._settings.pop(sandbox_id, None)

    def exec_command(
        self, sandbox_id: str, command: str | list[str], timeout: float | None = None, cwd: str | None = None,
        env: dict[str, str] | None = None, shell: str | None = None, user: str | None = None,
    ) -> ExecResult:  # fmt: skip
        base_env, workdir, default_shell = self._settings.get(sandbox_id, ({}, None, "/bin/bash"))
        argv = [shell or default_shell, "-c", command] if isinstance(command, str) else list(command)
        options: dict[str, Any] = {"env": {**base_env, **(env or {})}}
        if cwd or workdir:
            options["working_dir"] = cwd or workdir
        if timeout:
            options["timeout"] = timeout
        if user:
            options["user"] = user
        started = time.monotonic()
        result = self._sandbox(sandbox_id).run(argv, **options)
        stderr = result.stderr + ("\n[stasis: timed out]" if result.timed_out else "")
        return ExecResult(result.exit_code, result.stdout, stderr, time.monotonic() - started)

    def write_file(self, sandbox_id: str, path: str, content: str | bytes, append: bool = False) -> None:
        data = content.encode() if isinstance(content, str) else content
        sandbox = self._sandbox(sandbox_id)
        if append:
            sandbox.run(["sh", "-c", f"cat >> {shlex.quote(path)}"], stdin=data)
        else:
            sandbox.write_file(path, data)

    def read_file(self, sandbox_id: str, path: str) -> bytes:
        return self._sandbox(sandbox_id).read_file(path)

    def get_status(self, sandbox_id: str) -> SandboxStatus:
        try:
            status = self._sandbox(sandbox_id).info().status.value
        except SandboxNotFoundError:
            return SandboxStatus.TERMINATED
        return STATUS.get(status, SandboxStatus.RUNNING)  # running, suspended (a request resumes it), mid-operation

    # ------------------------------------------------------------ what stasis adds

    def pause_sandbox(self, sandbox_id: str) -> None:
        """Suspend: memory, processes and files kept, no CPU or RAM used; any command resumes it."""
        self._sandbox(sandbox_id).suspend()

    def resume_sandbox(self, sandbox_id: str) -> None:
        self._sandbox(sandbox_id).resume()

    def checkpoint_sandbox(self, sandbox_id: str, memory: bool = True) -> str:
        """A checkpoint (MEMORY: processes too) that :meth:`restore_sandbox` makes new sandboxes of; its id."""
        kind = CheckpointType.MEMORY if memory else CheckpointType.FILESYSTEM
        return self._sandbox(sandbox_id).checkpoint(kind).id

    def restore_sandbox(self, checkpoint_id: str) -> str:
        """A new sandbox from a checkpoint, going on from its instant."""
        return Sandbox.create(client=self.client, snapshot_id=checkpoint_id).id

    def _sandbox(self, sandbox_id: str) -> Sandbox:
        try:
            return Sandbox.connect(sandbox_id, client=self.client)
        except (NotFound, InvalidRequest) as exc:
            raise SandboxNotFoundError(f"no stasis sandbox {sandbox_id!r}: {exc.message}") from exc
