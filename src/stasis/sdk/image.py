"""``Image``: build an image step by step, each step run in a build sandbox and cached.

    Image.from_image("pyapp").apt_install("jq").pip_install("requests").copy("app/", "/srv/app") \\
        .env({"MODE": "prod"}).workdir("/srv/app").build("myapp")
    Image.from_dockerfile("Dockerfile", context=".").build("myapp")

A step's cache key is the hash of its parent's key, the step, and (COPY) the content of the files it
copies: an unchanged step is a cache hit, and a change reruns that step and those after it. A step
that changes files runs in a gVisor sandbox of the parent image (its own kernel: never on the host),
with the build's network policy (none by default); its files become an image through a FILESYSTEM
checkpoint (:mod:`stasis.images.layers`: the parent's files are hard links, so a step costs what it
changed). ENV, WORKDIR, USER, CMD and ENTRYPOINT change only the image's config. The result is named
``name``; every step's image stays as cache (``stasis image prune`` removes what nothing uses).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import secrets
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import BuildError, ImageNotFound, InvalidRequest, StasisError
from ..images import ImageInfo
from ..images.dockerfile import Step
from ..images.dockerfile import read as read_dockerfile
from ..images.oci import ImageConfig
from ..models import CheckpointType, CommitImageRequest
from ..netpolicy import NetworkPolicy
from ._client import Client
from ._images import (
    ProgressCallback,
    build_image_call,
    commit_image_call,
    first_use_recipe,
    image_call,
    image_result,
    images_call,
    import_image_call,
)
from ._sync import Sandbox, build_on_first_use

MAX_MATCHES = 10_000  # paths one COPY wildcard may match
BUILD_FORMAT = 1  # bump when what a step's cache key covers changes
# What apt, pip, curl and git say when a name cannot be looked up: a build step has no network unless asked.
NAME_LOOKUP_FAILED = re.compile(
    r"Temporary failure (in name resolution|resolving)|Could not resolve host|Name or service not known|"
    r"Failed to establish a new connection|Network is unreachable"
)
NO_NETWORK_HINT = (
    "\n(build steps have no network unless asked: Image.build(..., network=True), or `stasis image build "
    "--network`; a policy such as NetworkPolicy(allow_out=['deb.debian.org']) narrows it)"
)
StepCallback = Callable[[int, int, str, bool], None]  # (number, total, description, cached)
OutputCallback = Callable[[bytes], None]


@dataclass(frozen=True)
class Image:
    base: str  # an image name or key (imported, built, or a recipe's)
    steps: tuple[Step, ...] = ()
    context: Path = field(default_factory=Path.cwd)  # where COPY finds its sources

    # ---------------------------------------------------------------- where to start

    @classmethod
    def from_image(cls, name: str) -> Image:
        return cls(name)

    @classmethod
    def debian(cls, suite: str = "bookworm") -> Image:
        """stasis's own Debian image (the ``default`` recipe: python3, pip, git, build tools)."""
        if suite != "bookworm":
            raise InvalidRequest(f"stasis's Debian image is bookworm; for {suite}, import an image of it")
        return cls("default")

    @classmethod
    def from_oci(cls, ref: str, name: str | None = None, client: Client | None = None) -> Image:
        """Import ``ref`` (docker-archive:, oci-archive:, oci:, docker://) into the daemon now, then build on it."""
        chosen = name or "base-" + hashlib.sha256(ref.encode()).hexdigest()[:8]
        return cls(import_image(ref, chosen, client=client).key)

    @classmethod
    def from_registry(cls, ref: str, name: str | None = None) -> Image:
        return cls.from_oci(ref if ref.startswith("docker://") else f"docker://{ref}", name)

    @classmethod
    def from_dockerfile(cls, path: str | Path, context: str | Path | None = None,
                        build_args: dict[str, str] | None = None) -> Image:  # fmt: skip
        parsed = read_dockerfile(Path(path), build_args)
        return cls(parsed.base, tuple(parsed.steps), Path(context or Path(path).parent).absolute())

    # ---------------------------------------------------------------- steps

    def _add(self, kind: str, *args: str, options: tuple[tuple[str, str], ...] = ()) -> Image:
        return replace(self, steps=(*self.steps, Step(kind, tuple(args), options=options)))

    def run(self, command: str | list[str]) -> Image:
        return self._add("run", *(("shell", command) if isinstance(command, str) else ("exec", *command)))

    def apt_install(self, *packages: str) -> Image:
        names = " ".join(shlex.quote(p) for p in packages)
        return self.run(f"apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                        f"--no-install-recommends {names} && rm -rf /var/lib/apt/lists/*")  # fmt: skip

    def pip_install(self, *packages: str, extra_args: str = "") -> Image:
        names = " ".join(shlex.quote(p) for p in packages)
        return self.run(f"PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-cache-dir {extra_args} {names}")

    def copy(self, local: str, remote: str, chown: str | None = None) -> Image:
        return self._add("copy", local, remote, options=(("chown", chown),) if chown else ())

    def env(self, variables: dict[str, str]) -> Image:
        return self._add("env", *(f"{k}={v}" for k, v in variables.items()))

    def workdir(self, path: str) -> Image:
        return self._add("workdir", path)

    def user(self, name: str) -> Image:
        return self._add("user", name)

    def cmd(self, argv: list[str]) -> Image:
        return self._add("cmd", "exec", *argv)

    def entrypoint(self, argv: list[str]) -> Image:
        return self._add("entrypoint", "exec", *argv)

    # ---------------------------------------------------------------- building

    def build(
        self,
        name: str,
        *,
        client: Client | None = None,
        network: NetworkPolicy | bool | None = None,
        on_step: StepCallback | None = None,
        on_output: OutputCallback | None = None,
        force_from: int | None = None,
        timeout: float | None = None,
    ) -> ImageInfo:
        """Build (or find in the cache) every step, and name the result ``name``. ``force_from``: the first step
        (1-based) to run again even if cached; the steps after it run again too. ``timeout``: seconds the whole
        build's RUN steps may take (a step still running then is killed, and the build fails saying so)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return _Build(self, name, client or Client(), network, on_step, on_output, force_from, deadline).run()


@dataclass
class _Build:
    image: Image
    name: str
    client: Client
    network: NetworkPolicy | bool | None
    on_step: StepCallback | None
    on_output: OutputCallback | None
    force_from: int | None = None  # the first step (1-based) never taken from the cache: it and those after run
    deadline: float | None = None  # time.monotonic() by which every RUN step must have ended
    sandbox: Sandbox | None = None
    forced: str = ""

    def run(self) -> ImageInfo:
        try:
            base = self._image(self.image.base)
        except ImageNotFound as exc:
            if (recipe := first_use_recipe(exc)) is None:
                raise
            build_on_first_use(recipe, self.client)
            base = self._image(self.image.base)
        config = base.config or ImageConfig()
        last = base.key  # the newest image of the chain
        sandbox_image = last  # the image the build sandbox was made from: its upper layer is relative to it
        total = len(self.image.steps)
        try:
            for number, step in enumerate(self.image.steps, start=1):
                config = _configure(config, step)
                if self.force_from is not None and number >= self.force_from and not self.forced:
                    self.forced = secrets.token_hex(8)
                key = self._key(last, step)
                cached = self._exists(key)
                self._report(number, total, step, cached)
                if cached:
                    self._drop_sandbox()  # only a prefix of the steps can hit: the chain diverged before
                    last = key
                    continue
                checkpoint = None
                if step.kind in ("run", "copy", "workdir"):
                    if self.sandbox is None:
                        self.sandbox = Sandbox.create(client=self.client, image=last, backend="gvisor",
                                                      network=self.network, timeout_secs=None)  # fmt: skip
                        sandbox_image = last
                    if step.kind == "workdir":
                        self._workdir(step, config)
                    elif step.kind == "run":
                        self._run(step, config)
                    else:
                        self._copy(step, config)
                    checkpoint = self.sandbox.checkpoint(CheckpointType.FILESYSTEM).id
                self._commit(key, sandbox_image if checkpoint else last, step, config, checkpoint)
                last = key
            final = f"{self.name}-{hashlib.sha256(last.encode()).hexdigest()[:12]}"
            return self._commit(final, last, Step("tag", (self.name,)), config, None, name=self.name)
        finally:
            self._drop_sandbox()

    # -- steps

    def _run(self, step: Step, config: ImageConfig) -> None:
        assert self.sandbox is not None
        form, *words = step.args
        argv = ["/bin/sh", "-c", words[0]] if form == "shell" else words
        options: dict[str, Any] = {"env": config.env, "working_dir": config.working_dir or "/"}
        if user := dict(step.options).get("user") or config.user:  # a step's own user (E2B's RUN) comes first
            options["user"] = user
        if self.on_output is not None:
            options |= {"on_stdout": self.on_output, "on_stderr": self.on_output}
        if self.deadline is not None:
            options["timeout"] = max(1.0, self.deadline - time.monotonic())
        result = self.sandbox.run(argv, **options)
        if result.timed_out:
            raise BuildError(f"build step {step.describe()!r} was still running when the build's time ran out; it "
                             "was killed", exit_code=result.exit_code)  # fmt: skip
        if result.exit_code != 0:
            tail = (result.stdout + result.stderr).strip()[-2000:]
            hint = NO_NETWORK_HINT if self.network is None and NAME_LOOKUP_FAILED.search(tail) else ""
            raise BuildError(f"build step {step.describe()!r} failed with exit code {result.exit_code}:\n{tail}{hint}",
                             exit_code=result.exit_code)  # fmt: skip

    def _copy(self, step: Step, config: ImageConfig) -> None:
        assert self.sandbox is not None
        *sources, dest = step.args
        base_dir = config.working_dir or "/"
        dest_path = dest if dest.startswith("/") else os.path.join(base_dir, dest)
        files = _copied_files(self.image.context, sources)
        into_dir = dest.endswith("/") or len(files) > 1 or any((self.image.context / s).is_dir() for s in sources)
        remotes = [os.path.join(dest_path, relative) if into_dir else dest_path for relative, _ in files]
        options = dict(step.options)
        if options.get("owner") == "user" and config.user and config.user != "root":  # E2B's: the current USER's
            options.setdefault("chown", config.user)
        made = self._missing_dirs(dest_path, remotes) if options.get("chown") else []
        written = []
        for relative, local in files:  # write_file makes the parent directories
            remote = os.path.join(dest_path, relative) if into_dir else dest_path
            if local.is_symlink():
                link = self.sandbox.run(["sh", "-c", 'mkdir -p "$(dirname "$2")" && ln -sfn "$1" "$2"', "sh",
                                         os.readlink(local), remote], user="root")  # fmt: skip
                if link.exit_code != 0:
                    raise BuildError(f"COPY: cannot make the link {remote}: {link.stderr.strip()}", exit_code=1)
                written.append(remote)
                continue
            written.append(self.sandbox.write_file(remote, local.read_bytes(), mode=local.stat().st_mode & 0o7777).path)
        if chown := options.get("chown"):  # the files, and the directories this COPY made (as Docker's --chown)
            self.sandbox.run(["chown", "-h", chown, *made, *written], user="root")
        if mode := options.get("mode"):  # E2B's COPY mode: the files copied, never what their links point to
            regular = [path for (_, local), path in zip(files, written, strict=True) if not local.is_symlink()]
            done = self.sandbox.run(["chmod", mode, *regular], user="root") if regular else None
            if done is not None and done.exit_code != 0:
                raise BuildError(f"COPY: chmod {mode}: {done.stderr.strip()[-500:]}", exit_code=1)

    def _workdir(self, step: Step, config: ImageConfig) -> None:
        """Made, as Docker does (owned by root); E2B's (an ``owner`` option): by the current USER."""
        assert self.sandbox is not None
        path = config.working_dir or "/"
        user = config.user if dict(step.options).get("owner") == "user" and config.user != "root" else None
        made = self._missing_dirs("/", [os.path.join(path, "-")]) if user else []
        self.sandbox.make_dir(path)
        if made:
            self.sandbox.run(["chown", str(user), *made], user="root")

    def _missing_dirs(self, dest: str, remotes: list[str]) -> list[str]:
        """The directories from ``dest`` down to the files that do not exist yet (a COPY will make them)."""
        assert self.sandbox is not None
        wanted = {os.path.normpath(dest)} if len(remotes) > 1 or dest.endswith("/") else set()
        for remote in remotes:
            parent = os.path.dirname(remote)
            while (parent + "/").startswith(os.path.normpath(dest).rstrip("/") + "/") and parent not in wanted:
                wanted.add(parent)
                parent = os.path.dirname(parent)
        if not wanted:
            return []
        probe = self.sandbox.run(["sh", "-c", 'for d; do [ -e "$d" ] || echo "$d"; done', "sh", *sorted(wanted)],
                                 user="root")  # fmt: skip
        return probe.stdout.splitlines()

    # -- the daemon's images

    def _image(self, name: str) -> ImageInfo:
        return self.client.call(image_call(name))

    def _exists(self, key: str) -> bool:
        try:
            self._image(key)
        except ImageNotFound:
            return False
        return True

    def _key(self, parent: str, step: Step) -> str:
        parts: list[Any] = [BUILD_FORMAT, parent, step.kind, step.args, step.options]
        if self.forced:  # a step asked to run again: a key of its own, so neither it nor any after it is a hit
            parts.append(self.forced)
        if step.kind == "copy":
            parts.append([(rel, _digest(path)) for rel, path in _copied_files(self.image.context, step.args[:-1])])
        return "build-" + hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]

    def _commit(self, key: str, parent: str, step: Step, config: ImageConfig, checkpoint: str | None,
                name: str = "build-cache") -> ImageInfo:  # fmt: skip
        request = CommitImageRequest(parent=parent, checkpoint=checkpoint, name=name, key=key,
                                     config=config.model_dump(), step=step.describe())  # fmt: skip
        try:
            return self.client.call(commit_image_call(request))
        finally:
            if checkpoint is not None:
                Sandbox.delete_checkpoint(checkpoint, client=self.client)

    def _report(self, number: int, total: int, step: Step, cached: bool) -> None:
        if self.on_step is not None:
            self.on_step(number, total, step.describe(), cached)

    def _drop_sandbox(self) -> None:
        if self.sandbox is not None:
            sandbox, self.sandbox = self.sandbox, None
            with contextlib.suppress(StasisError):  # the build's own error (a daemon gone) is the one to see
                sandbox.terminate()


def _configure(config: ImageConfig, step: Step) -> ImageConfig:
    if step.kind == "env":
        return config.model_copy(update={"env": {**config.env, **dict(a.split("=", 1) for a in step.args)}})
    if step.kind == "workdir":
        path = step.args[0]
        path = path if path.startswith("/") else os.path.join(config.working_dir or "/", path)
        return config.model_copy(update={"working_dir": path})
    if step.kind == "user":
        return config.model_copy(update={"user": step.args[0]})
    if step.kind in ("cmd", "entrypoint"):
        form, *words = step.args
        argv = ["/bin/sh", "-c", words[0]] if form == "shell" else words
        return config.model_copy(update={step.kind: argv})
    return config


def _copied_files(context: Path, sources: tuple[str, ...] | list[str]) -> list[tuple[str, Path]]:
    """(path relative to the destination, local file) of every file COPY takes, in a stable order."""
    found: list[tuple[str, Path]] = []
    root = context.resolve()
    for source in _expanded(context, sources):
        local = (context / source).resolve()
        if not local.is_relative_to(root):
            raise InvalidRequest(f"COPY {source}: outside the build context {context}")
        if not local.exists():
            raise InvalidRequest(f"COPY {source}: no such file in the build context {context}")
        if local.is_dir():  # as Docker does: a link inside the directory is copied as a link, never followed
            for top, dirs, files in os.walk(local):
                for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(top, d)))]:
                    path = Path(top, name)
                    found.append((str(path.relative_to(local)), path))
            found.sort()
        else:
            found.append((local.name, local))
    return found


def _expanded(context: Path, sources: tuple[str, ...] | list[str]) -> list[str]:
    """COPY's sources with their wildcards (``*``, ``?``, ``[...]``) matched in the context, as Docker does."""
    found: list[str] = []
    for source in sources:
        if not any(c in source for c in "*?["):
            found.append(source)
            continue
        matches = []
        for path in context.glob(source):  # links to "." make wildcards multiply: bounded
            matches.append(str(path.relative_to(context)))
            if len(matches) > MAX_MATCHES:
                raise InvalidRequest(f"COPY {source}: matches more than {MAX_MATCHES} paths; copy a folder instead")
        matches.sort()
        if not matches:
            raise InvalidRequest(f"COPY {source}: nothing in the build context {context} matches it")
        found.extend(matches)
    return found


def _digest(path: Path) -> str:
    if path.is_symlink():
        return "link:" + os.readlink(path)
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256")
    digest.update(str(path.stat().st_mode & 0o7777).encode())
    return base64.b16encode(digest.digest()[:16]).decode()


def import_image(
    ref: str, name: str, *, client: Client | None = None, on_progress: ProgressCallback | None = None
) -> ImageInfo:
    """An OCI or Docker image imported by the daemon (the only writer of images): a registry's by reference,
    or a local archive or OCI layout uploaded to it, so a daemon over TCP gets it the same way."""
    client = client or Client()
    with import_image_call(ref, name) as call:
        return image_result(client.stream_lines(call), on_progress)


def build_recipe(
    recipe: str = "default", *, force: bool = False, client: Client | None = None,
    on_progress: ProgressCallback | None = None,
) -> ImageInfo:  # fmt: skip
    """A built-in recipe's image, built by the daemon (cached by the recipe's hash unless ``force``)."""
    return image_result((client or Client()).stream_lines(build_image_call(recipe, force)), on_progress)


def list_images(client: Client | None = None) -> list[ImageInfo]:
    return (client or Client()).call(images_call())  # type: ignore[no-any-return]


def get_image(name: str, client: Client | None = None) -> ImageInfo:
    return (client or Client()).call(image_call(name))  # type: ignore[no-any-return]
