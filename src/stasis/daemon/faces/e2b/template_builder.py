"""An E2B template build, run by stasis' own builder (:mod:`stasis.sdk.image`) in a thread of the daemon, through
its own socket, as the resident face makes its images.

E2B's steps become stasis' one for one (COPY, RUN, ENV, WORKDIR, USER), so every step is a cached layer keyed by
the layer before it, the step and its files' content: an unchanged step is never run again, a changed one runs with
those after it. COPY's files are the tars the SDK uploaded, unpacked (as untrusted input) into the build's context.
``startCmd`` and ``readyCmd`` make a stasis template of the image: a sandbox made from the template starts from
the instant its ready command first passed. A build's log is its steps, their output, and why it failed.
"""

from __future__ import annotations

import logging
import re
import shutil
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ....e2b_wire import BASE_IMAGE, CODE_IMAGE
from ....errors import InvalidRequest, StasisError, echo
from ....guest import untar
from ....images.dockerfile import Step
from ....paths import Paths
from .templates import Build, Template, Templates

log = logging.getLogger(__name__)

MAX_CONTEXT_BYTES = 4 << 30  # what a build's uploaded files may unpack to, in all
MAX_FILE_BYTES = 256 << 20  # one file a COPY takes (the builder reads it whole)
MAX_LINE = 2048  # characters of one line of a step's output kept in the log (the rest is cut, and says so)
READY_TIMEOUT = 300.0  # seconds a ready command has to pass
BUILD_TIMEOUT = 3600.0  # seconds a build's RUN steps may take in all (E2B's cap on a build: an hour)
WARM_IDLE = 900  # seconds: the making sandbox of a warm template, left by a stopped daemon, ends
USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}(:[a-z_][a-z0-9_.-]{0,31})?|\d{1,10}(:\d{1,10})?")
MODE = re.compile(r"[0-7]{3,4}")
E2B_IMAGES = {"e2bdev/base": BASE_IMAGE, "e2bdev/code-interpreter": CODE_IMAGE}
E2B_TEMPLATES = {"base": BASE_IMAGE, "code-interpreter-v1": CODE_IMAGE, "code-interpreter": CODE_IMAGE}


class E2bStep(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    type: str = Field(max_length=32)
    args: list[str] = Field(default_factory=list, max_length=256)
    files_hash: str | None = Field(None, alias="filesHash")
    force: bool | None = False


class BuildStart(BaseModel):
    """E2B's ``TemplateBuildStartV2``."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    from_image: str | None = Field(None, alias="fromImage", max_length=512)
    from_template: str | None = Field(None, alias="fromTemplate", max_length=512)
    from_image_registry: dict[str, Any] | None = Field(None, alias="fromImageRegistry")
    force: bool | None = False
    steps: list[E2bStep] = Field(default_factory=list, max_length=1000)
    start_cmd: str | None = Field(None, alias="startCmd", max_length=65536)
    ready_cmd: str | None = Field(None, alias="readyCmd", max_length=65536)


@dataclass(frozen=True)
class Plan:
    """What a build will do, checked before it starts: a step stasis cannot run is a 400, not a failed build."""

    base: str  # an E2B image or template name
    base_kind: Literal["image", "template"]
    steps: tuple[Step, ...]
    files: tuple[str, ...]  # files hashes of the COPY steps, in order
    force_from: int | None
    start_cmd: str | None
    ready_cmd: str | None


def plan(body: BuildStart, templates: Templates) -> Plan:
    if body.from_image_registry:
        raise InvalidRequest("fromImageRegistry: stasis pulls no registry with credentials; `stasis image import` "
                             "the image (from a registry or an archive), then build from its name")  # fmt: skip
    if body.from_template:
        base, kind = body.from_template, "template"
    else:
        base, kind = body.from_image or "e2bdev/base", "image"
    steps, files, force_from = [], [], 1 if body.force else None
    for number, step in enumerate(body.steps, start=1):
        steps.append(_step(number, step, templates, files))
        if step.force and force_from is None:
            force_from = number
    return Plan(base, kind, tuple(steps), tuple(files), force_from, body.start_cmd, body.ready_cmd)  # type: ignore[arg-type]


def _step(number: int, step: E2bStep, templates: Templates, files: list[str]) -> Step:
    kind, args = step.type.upper(), step.args
    where = f"step {number} ({kind[:16]})"
    if kind == "RUN" and 1 <= len(args) <= 2:
        options = (("user", _user(args[1], where)),) if len(args) == 2 and args[1] else ()
        return Step("run", ("shell", args[0]), number, options)
    if kind == "COPY" and 2 <= len(args) <= 4:
        src, dest, user, mode = [*args, "", ""][:4]
        if src.startswith("/") or ".." in Path(src).parts or not src:
            raise InvalidRequest(f"{where}: COPY's source {echo(src)} must be a path inside the build's context")
        if step.files_hash is None or not templates.file(step.files_hash).exists():
            raise InvalidRequest(f"{where}: the files of COPY {echo(src)} were not uploaded (GET "
                                 "/templates/{id}/files/{hash} gives the upload URL)")  # fmt: skip
        files.append(step.files_hash)
        options = [("chown", _user(user, where))] if user else [("owner", "user")]  # E2B's: the current USER owns
        if mode:
            if not MODE.fullmatch(mode):
                raise InvalidRequest(f"{where}: COPY's mode {echo(mode)} is not an octal mode such as 0755")
            options.append(("mode", mode))
        return Step("copy", (f"{step.files_hash}/{src}", dest), number, tuple(options))  # its tar's own folder
    if kind == "ENV" and args and len(args) % 2 == 0:
        pairs = [f"{args[i]}={args[i + 1]}" for i in range(0, len(args), 2)]
        return Step("env", tuple(pairs), number)
    if kind in ("WORKDIR", "USER") and len(args) == 1 and args[0]:
        if kind == "WORKDIR":  # made by the current USER, as E2B does
            return Step("workdir", (args[0],), number, (("owner", "user"),))
        return Step("user", (_user(args[0], where),), number)
    raise InvalidRequest(
        f"{where}: {echo(kind)} with {len(args)} arguments is not a step stasis builds (COPY, RUN, ENV, WORKDIR, USER)"
    )


def _user(user: str, where: str) -> str:
    if not USER.fullmatch(user):
        raise InvalidRequest(f"{where}: {echo(user)} is not a user name (or user:group)")
    return user


class TemplateBuilder:
    def __init__(self, templates: Templates, paths: Paths) -> None:
        self.templates = templates
        self.paths = paths
        self.contexts = paths.home / "e2b" / "template-builds"

    def recover(self) -> None:
        """At the daemon's start: builds a stopped daemon left under way failed, their unpacked contexts go."""
        self.templates.recover()
        shutil.rmtree(self.contexts, ignore_errors=True)

    def start(self, template: Template, build: Build, plan: Plan, backend: str, network: bool) -> None:
        self.templates.update(template.template_id, build.build_id, status="building")
        run = _Run(self, template, build, plan, backend, network)
        threading.Thread(target=run.run, name=f"e2b-build-{build.build_id[:8]}", daemon=True).start()


@dataclass
class _Run:
    builder: TemplateBuilder
    template: Template
    build: Build
    plan: Plan
    backend: str
    network: bool
    step: str = "base"
    partial: bytes = b""

    def log(self, message: str, level: str = "info") -> None:
        self.builder.templates.log(self.build.build_id, message, level, self.step)

    def run(self) -> None:
        from ....sdk import Client

        started = time.monotonic()
        context = self.builder.contexts / self.build.build_id
        self.log(f"Building {self.template.name} ({self.template.template_id}), build {self.build.build_id}")
        try:
            with Client(paths=self.builder.paths) as client:
                image = self._image(client, context)
                warm = self._warm(client, image) if (self.plan.start_cmd or self.plan.ready_cmd) else None
        except Exception as exc:  # every failure is the build's, said in its status
            message = str(exc) if isinstance(exc, StasisError) else f"{type(exc).__name__}: {exc}"
            self.log(message, "error")
            self.builder.templates.update(self.template.template_id, self.build.build_id, status="error",
                                          finished_at=time.time(), reason=message[-4000:], step=self.step)  # fmt: skip
            log.info("E2B build %s of %s failed at step %s", self.build.build_id, self.template.name, self.step)
            return
        finally:
            shutil.rmtree(context, ignore_errors=True)
        self.step = "finalize"
        self.log(f"Build finished in {time.monotonic() - started:.1f}s: image {image}" + (f", warm {warm}" if warm
                 else ""))  # fmt: skip
        self.builder.templates.update(self.template.template_id, self.build.build_id, status="ready",
                                      finished_at=time.time(), image=image, warm=warm)  # fmt: skip

    def _image(self, client: Any, context: Path) -> str:
        from ....sdk.image import Image

        base = self._base(client)
        self._unpack(context)
        image = Image(base, self.plan.steps, context)
        info = image.build(f"e2b-{self.template.template_id}", client=client, network=self.network or None,
                           on_step=self._on_step, on_output=self._on_output,
                           force_from=self.plan.force_from, timeout=BUILD_TIMEOUT)  # fmt: skip
        self._flush()
        return info.key

    def _base(self, client: Any) -> str:
        """The stasis image the build starts from: E2B's base images are stasis' E2B images; any other image must
        be a stasis image (imported, built or a recipe's), a template one E2B built here."""
        from ....sdk import e2b
        from ....sdk.image import get_image

        name = self.plan.base
        if self.plan.base_kind == "template":
            if name in E2B_TEMPLATES:
                name = E2B_TEMPLATES[name]
            else:
                found = self.builder.templates.resolve(name)
                if found is None:
                    raise InvalidRequest(f"fromTemplate {echo(name)}: no such template (build it first)")
                return str(found[1].image)
        name = E2B_IMAGES.get(name.partition(":")[0], name)
        if name == BASE_IMAGE:
            return e2b.base_image(client).key
        if name == CODE_IMAGE:
            return e2b.code_image(client).key
        try:
            return get_image(name, client).key
        except StasisError as exc:
            raise InvalidRequest(
                f"fromImage {echo(name)}: not an image this daemon has, and it pulls from no registry for a build; "
                f"`stasis image import docker://{name[:200]} --name NAME` brings it (then build from NAME), or "
                f"start from E2B's base image ({exc.message[:200]})"
            ) from None

    def _unpack(self, context: Path) -> None:
        """Each COPY's tar into its own folder of the context (named by its files hash), by stasis' one routine for
        archives somebody else made (:mod:`stasis.guest.untar`): the whole member list is checked first (names
        inside, links that stay inside and pass through no other link, no hard link out, no device, bounded
        counts and sizes), then nothing is written through a link."""
        shutil.rmtree(context, ignore_errors=True)
        context.mkdir(parents=True, mode=0o700)
        budget = MAX_CONTEXT_BYTES
        for files_hash in dict.fromkeys(self.plan.files):
            path = self.builder.templates.file(files_hash)
            try:
                with untar.open_archive(name=str(path), mode="r:*") as tar:
                    budget -= self._sizes(tar)
                (context / files_hash).mkdir(mode=0o700)
                with untar.open_archive(name=str(path), mode="r:*") as tar:
                    untar.extract(tar, context / files_hash, links="inside", max_bytes=MAX_CONTEXT_BYTES)
            except (untar.UnsafeArchive, tarfile.TarError, OSError, EOFError) as exc:
                raise InvalidRequest(f"COPY's uploaded files ({files_hash[:12]}) are refused: {exc}") from None
            if budget < 0:
                raise InvalidRequest(f"COPY's files add up to more than {MAX_CONTEXT_BYTES >> 30} GiB in one build")

    @staticmethod
    def _sizes(tar: tarfile.TarFile) -> int:
        """The bytes of a tar's files, each at most MAX_FILE_BYTES; read member by member (bounded by untar)."""
        total = 0
        for count, member in enumerate(tar, start=1):
            if count > untar.MAX_MEMBERS:
                raise untar.UnsafeArchive(f"the archive has more than {untar.MAX_MEMBERS} members")
            if member.isreg() and member.size > MAX_FILE_BYTES:
                raise untar.UnsafeArchive(f"{member.name[:200]!r} is over {MAX_FILE_BYTES >> 20} MiB")
            total += member.size if member.isreg() else 0
        return total

    def _warm(self, client: Any, image: str) -> str:
        from ....sdk.template import Template

        self.step = "finalize"
        name = f"e2b-{self.template.template_id}-{self.build.build_id[:8]}"
        self.log(f"Starting {self.plan.start_cmd or '(no start command)'}; waiting for {self.plan.ready_cmd or 'it'}")

        def check(attempt: int, waited: float, said: str) -> None:
            if attempt % 10 == 1:
                self.log(f"ready command: not yet after {waited:.0f}s ({said[:200]})")

        Template.create(name, image, start_cmd=self.plan.start_cmd or "true", ready_cmd=self.plan.ready_cmd,
                        ready_timeout=READY_TIMEOUT, replace=True, client=client, on_check=check,
                        backend=self.backend, memory_mb=self.build.memory_mb, cpus=float(self.build.cpu_count),
                        timeout_secs=WARM_IDLE, on_idle="terminate")  # fmt: skip
        return name

    def _on_step(self, number: int, total: int, description: str, cached: bool) -> None:
        self._flush()
        self.step = str(number)
        self.log(f"[{number}/{total}] {'CACHED ' if cached else ''}{description}")

    def _on_output(self, chunk: bytes) -> None:
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        if len(self.partial) > MAX_LINE:  # a line without an end: what is kept of it goes now
            lines.append(self.partial)
            self.partial = b""
        for line in lines:
            text = line.decode(errors="replace")
            self.log(text if len(text) <= MAX_LINE else text[:MAX_LINE] + f" [{len(text) - MAX_LINE} more cut]")

    def _flush(self) -> None:
        if self.partial:
            self.log(self.partial.decode(errors="replace"))
            self.partial = b""
