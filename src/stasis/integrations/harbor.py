"""A Harbor environment: each trial runs in a stasis sandbox built from the task's Dockerfile.

    harbor run -p TASK -a AGENT -e stasis.integrations.harbor:StasisEnvironment

The task's ``environment/Dockerfile`` is built with stasis's builder (cached per step, so a second
trial of the task starts from the cached image), or its ``docker_image`` is imported with skopeo.
Harbor's network modes map onto stasis's egress policy. ``stop(delete=False)`` suspends the sandbox
with its memory and processes instead of removing it. Harbor needs Python 3.12 or later.
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import io
import os
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any

from . import require

require("harbor", "harbor")

from harbor.environments.base import BaseEnvironment, ExecResult  # noqa: E402
from harbor.environments.capabilities import EnvironmentCapabilities  # noqa: E402
from harbor.environments.definition import effective_exec_cwd, require_agent_environment_definition  # noqa: E402
from harbor.models.task.config import NetworkMode, NetworkPolicy  # noqa: E402

from ..errors import InvalidRequest, StasisError, WorkdirNotFound  # noqa: E402
from ..guest import untar  # noqa: E402
from ..netpolicy import NetworkPolicy as StasisPolicy  # noqa: E402
from ..sdk import Client, Image, Sandbox  # noqa: E402


class StasisEnvironment(BaseEnvironment):
    def __init__(self, environment_dir: Path, environment_name: str, session_id: str, trial_paths: Any,
                 task_env_config: Any, *args: Any, **kwargs: Any) -> None:  # fmt: skip
        super().__init__(environment_dir, environment_name, session_id, trial_paths, task_env_config, *args, **kwargs)
        self._client = Client()
        self.sandbox: Sandbox | None = None
        slug = re.sub(r"[^a-z0-9-]+", "-", environment_name.lower()).strip("-")[:40] or "task"
        self._image_name = f"harbor-{slug}-{self.environment_id[:12]}"

    @staticmethod
    def type() -> str:
        return "stasis"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            disable_internet=True, network_allowlist=True, network_allowlist_hostnames=True,
            network_allowlist_wildcard_hostnames=True, network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv4_cidrs=True, dynamic_network_policy=True,
        )  # fmt: skip

    def _validate_definition(self) -> None:
        require_agent_environment_definition(self.environment_dir, docker_image=self.task_env_config.docker_image)
        if not self.task_env_config.docker_image and not (self.environment_dir / "Dockerfile").is_file():
            raise FileNotFoundError(
                f"{self.environment_dir / 'Dockerfile'} is missing: the stasis environment runs one sandbox per "
                "trial, built from a Dockerfile or a docker_image (docker-compose tasks are not supported)"
            )

    # ------------------------------------------------------------------ lifecycle

    async def start(self, force_build: bool) -> None:
        image = await asyncio.to_thread(self._image, force_build)
        options: dict[str, Any] = {"image": image, "network": self._network(self.network_policy)}
        if self._effective_cpus:
            options["cpus"] = float(self._effective_cpus)
        if self._effective_memory_mb:
            options["memory_mb"] = int(self._effective_memory_mb)
        if self._effective_storage_mb:
            options["disk_mb"] = int(self._effective_storage_mb)
        self.sandbox = await asyncio.to_thread(Sandbox.create, None, client=self._client, **options)
        self.logger.info(f"stasis sandbox {self.sandbox.id} from image {image}")
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        await self._upload_environment_dir_after_start()

    def _image(self, force_build: bool) -> str:
        """The image's name. Steps are cached by their content, so a changed Dockerfile or context
        rebuilds from the changed step on; ``force_build`` has nothing more to force."""
        if self.task_env_config.docker_image:
            Image.from_registry(self.task_env_config.docker_image, name=self._image_name)
            return self._image_name
        dockerfile = self.environment_dir / "Dockerfile"
        # Build steps get the network only when the task's own network mode allows some
        network = self.network_policy.network_mode != NetworkMode.NO_NETWORK or None
        Image.from_dockerfile(dockerfile, self.environment_dir).build(self._image_name, client=self._client,
                                                                      network=network)  # fmt: skip
        return self._image_name

    @staticmethod
    def _network(policy: NetworkPolicy) -> bool | StasisPolicy:
        if policy.network_mode == NetworkMode.NO_NETWORK:
            return False
        if policy.network_mode == NetworkMode.ALLOWLIST:
            return StasisPolicy(allow_out=list(policy.allowed_hosts))
        return True

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        await asyncio.to_thread(self._started().update_network, self._network(network_policy))

    async def stop(self, delete: bool) -> None:
        """Terminate the sandbox, or (``delete=False``) suspend it: ``stasis ls`` shows it, resumable."""
        if self.sandbox is None:
            return
        try:
            await asyncio.to_thread(self.sandbox.terminate if delete else self.sandbox.suspend)
        except StasisError as exc:
            self.logger.error(f"could not {'terminate' if delete else 'suspend'} sandbox {self.sandbox.id}: {exc}")
        finally:
            self.sandbox = None

    def _started(self) -> Sandbox:
        if self.sandbox is None:
            raise RuntimeError("the stasis environment is not started; call start() first")
        return self.sandbox

    # ------------------------------------------------------------------ commands and files

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:  # fmt: skip
        options: dict[str, Any] = {"env": self._merge_env(env) or {}}
        if workdir := effective_exec_cwd(cwd, self.task_env_config.workdir, None):
            options["working_dir"] = workdir
        if timeout_sec:
            options["timeout"] = timeout_sec
        if (who := self._resolve_user(user)) is not None:
            options["user"] = str(who)
        output = Output(self._output_callback(), asyncio.get_running_loop())
        try:  # all of the output: Docker's environment returns it whole, however large
            result = await asyncio.to_thread(
                self._started().run,
                ["bash", "-c", command],
                on_stdout=output.stdout,
                on_stderr=output.stderr,
                **options,
            )
        except WorkdirNotFound as exc:  # as `docker exec -w` answers a missing directory: an exit code, not a raise
            return ExecResult(stdout="", stderr=f"{exc}\n", return_code=EXIT_CANNOT_EXECUTE)
        await output.flushed()
        if result.timed_out:  # as Harbor's Docker environment says it
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(stdout=output.text("stdout"), stderr=output.text("stderr"), return_code=result.exit_code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        data = Path(source_path).read_bytes()
        await asyncio.to_thread(self._started().write_file, target_path, data, os.stat(source_path).st_mode & 0o777)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Merged into ``target_dir`` (Harbor's meaning): sent whole beside it, then copied in."""
        sandbox = self._started()
        staging = f"/tmp/.stasis-upload-{os.getpid()}-{id(self)}"
        await asyncio.to_thread(sandbox.upload_dir, source_dir, staging, replace=True)
        target, source = shlex.quote(target_dir), shlex.quote(staging)
        merged = await self.exec(f"mkdir -p {target} && cp -a {source}/. {target}/ && rm -rf {source}", user="root")
        if merged.return_code != 0:
            raise RuntimeError(f"could not copy {source_dir} into {target_dir}: {merged.stderr}")

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        data = await asyncio.to_thread(self._started().read_file, source_path)
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Its files over those in ``target_dir`` (Harbor's meaning): unpacked apart first (every member checked,
        nothing written through a link), then copied over."""
        data = await asyncio.to_thread(self._started().download_tar, source_dir)
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".stasis-download-", dir=target.parent) as staging:
            try:
                with untar.open_archive(io.BytesIO(data)) as tar:
                    untar.extract(tar, staging, links="inside")
            except untar.UnsafeArchive as exc:
                raise InvalidRequest(f"{source_dir} was not unpacked: {exc}") from exc
            untar.merge(staging, target)  # over what is there, never through a link already in target_dir


EXIT_CANNOT_EXECUTE = 126  # what `docker exec` returns when the command cannot start there


class Output:
    """A command's output, all of it, and (when Harbor streams) each piece handed to its callback as it comes.

    The SDK calls ``stdout``/``stderr`` from the thread that runs the command; the callback runs on the loop."""

    def __init__(self, callback: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.parts: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in self.parts}
        self.callback, self.loop = callback, loop
        self.sent: list[concurrent.futures.Future[None]] = []

    def stdout(self, data: bytes) -> None:
        self._add("stdout", data)

    def stderr(self, data: bytes) -> None:
        self._add("stderr", data)

    def _add(self, stream: str, data: bytes) -> None:
        self.parts[stream].extend(data)
        if self.callback is not None and (text := self.decoders[stream].decode(data)):
            self.sent.append(asyncio.run_coroutine_threadsafe(self.callback(text, stream), self.loop))

    async def flushed(self) -> None:
        """Every piece delivered to the callback, in order, before the result is returned."""
        for future in self.sent:
            await asyncio.wrap_future(future)

    def text(self, stream: str) -> str:
        return self.parts[stream].decode(errors="replace")
