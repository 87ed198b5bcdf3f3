"""E2B's built templates as the face keeps them: a template is a name with builds and tags, one JSON file each
under ``e2b/templates/``; a build's log is kept beside it; the files its COPY steps uploaded are tars named by
E2B's files hash under ``e2b/template-files/``. The face is their only writer (builds finish in threads: one
lock). What a build made is stasis' own: an image (every step a cached layer) and, with a start command, a
stasis template that starts warm.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from .... import hostpath
from ....errors import InvalidRequest, NotFound, echo
from ....fsutil import atomic_write

log = logging.getLogger(__name__)

NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")  # a template's name and a tag: a stasis name's rules, lower case
TEMPLATE_ID = re.compile(r"[a-z0-9]{20}")
FILES_HASH = re.compile(r"[0-9a-f]{64}")
DEFAULT_TAG = "default"
# E2B's: a name without ":tag"
RESERVED = frozenset({"base", "code-interpreter-v1", "code-interpreter", "desktop"})  # the face's own templates
MAX_LOG_ENTRIES = 10_000  # a build's log beyond this is cut, and says so in its last entry
Status = Literal["waiting", "building", "ready", "error"]


class Build(BaseModel):
    build_id: str
    status: Status = "waiting"
    created_at: float = Field(default_factory=time.time)
    finished_at: float | None = None
    cpu_count: int = 2
    memory_mb: int = 1024
    tags: list[str] = Field(default_factory=list)  # assigned when it is ready: a tag never names a build under way
    image: str | None = None  # the stasis image (its exact build key) the steps made
    warm: str | None = None  # the stasis template its start command made
    reason: str | None = None
    step: str | None = None  # E2B's: "base", a step's number, or "finalize"


class Tag(BaseModel):
    build_id: str
    at: float = Field(default_factory=time.time)


class Template(BaseModel):
    template_id: str
    name: str
    created_at: float = Field(default_factory=time.time)
    builds: dict[str, Build] = Field(default_factory=dict)
    tags: dict[str, Tag] = Field(default_factory=dict)


def split_name(ref: str) -> tuple[str, str]:
    """E2B's ``[team/]name[:tag]`` as (name, tag); raises for what is not a name stasis keeps."""
    name, _, tag = ref.rpartition("/")[2].partition(":")
    tag = tag or DEFAULT_TAG
    for what, value in (("name", name), ("tag", tag)):
        if not NAME.fullmatch(value):
            raise InvalidRequest(
                f"template {what} {echo(value)} is not valid: use 1-63 lower-case letters, digits, '.', '_' or '-'"
            )
    return name, tag


class Templates:
    def __init__(self, home: Path) -> None:
        self.directory = home / "e2b" / "templates"
        self.files = home / "e2b" / "template-files"
        for directory in (self.directory, self.files):
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.lock = threading.RLock()
        self.logs: dict[str, list[dict[str, Any]]] = {}  # build id -> entries, while this daemon runs

    # -- records

    def _path(self, template_id: str) -> Path:
        return hostpath.child(self.directory, f"{template_id}.json", "template id")

    def get(self, template_id: str) -> Template:
        if not TEMPLATE_ID.fullmatch(template_id):
            raise NotFound(f"template {echo(template_id)} not found")
        try:
            return Template.model_validate_json(self._path(template_id).read_bytes())
        except FileNotFoundError:
            raise NotFound(f"template {echo(template_id)} not found") from None
        except (ValidationError, json.JSONDecodeError) as exc:
            raise InvalidRequest(f"template {template_id}'s record is unreadable: {str(exc)[:200]}") from None

    def put(self, template: Template) -> None:
        atomic_write(self._path(template.template_id), template.model_dump_json().encode(), mode=0o600)

    def all(self) -> list[Template]:
        found = []
        for path in sorted(self.directory.glob("*.json")):
            with contextlib.suppress(NotFound, InvalidRequest):
                found.append(self.get(path.stem))
        return found

    def by_name(self, name: str) -> Template | None:
        return next((t for t in self.all() if t.name == name), None)

    def find(self, ref: str) -> Template:
        """A template by its id or its name (a ``:tag`` after it is ignored)."""
        if TEMPLATE_ID.fullmatch(ref):
            with contextlib.suppress(NotFound):
                return self.get(ref)
        template = self.by_name(split_name(ref)[0])
        if template is None:
            raise NotFound(f"template {echo(ref)} not found")
        return template

    def resolve(self, ref: str) -> tuple[Template, Build] | None:
        """The ready build ``name[:tag]`` (or a template id: its default tag) names, or None if no such template."""
        try:
            template = self.get(ref) if TEMPLATE_ID.fullmatch(ref) else self.by_name(split_name(ref)[0])
            tag = DEFAULT_TAG if TEMPLATE_ID.fullmatch(ref) else split_name(ref)[1]
        except (NotFound, InvalidRequest):
            return None
        if template is None:
            return None
        if tag not in template.tags:
            known = ", ".join(sorted(template.tags)) or "none yet: no build of it has finished"
            raise NotFound(f"template {echo(template.name)} has no tag {echo(tag)} (its tags: {known})")
        return template, template.builds[template.tags[tag].build_id]

    # -- builds

    def request(self, ref: str, tags: list[str], cpu_count: int, memory_mb: int) -> tuple[Template, Build]:
        name, tag = split_name(ref)
        if name in RESERVED:
            raise InvalidRequest(f"{echo(name)} is one of E2B's own templates here; build under another name")
        wanted = sorted({tag, *(split_name(f"{name}:{t}")[1] for t in tags)})
        with self.lock:
            template = self.by_name(name) or Template(template_id=secrets.token_hex(10), name=name)
            build = Build(build_id=str(uuid.uuid4()), cpu_count=cpu_count, memory_mb=memory_mb, tags=wanted)
            template.builds[build.build_id] = build
            self.put(template)
        return template, build

    def build(self, template_id: str, build_id: str) -> tuple[Template, Build]:
        template = self.get(template_id)
        build = template.builds.get(build_id)
        if build is None:
            raise NotFound(f"build {echo(build_id)} of template {template.name} not found")
        return template, build

    def update(self, template_id: str, build_id: str, **changes: Any) -> Build:
        """Change a build; a build that became ready takes its tags."""
        with self.lock:
            template, build = self.build(template_id, build_id)
            build = build.model_copy(update=changes)
            template.builds[build_id] = build
            if build.status == "ready":
                for tag in build.tags:
                    template.tags[tag] = Tag(build_id=build_id)
            self.put(template)
        if build.status in ("ready", "error"):
            self._keep_log(build_id)
        return build

    def recover(self) -> None:
        """A build a stopped daemon left under way failed: its steps so far are cached, a new build reuses them.
        Uploads it cut off (hidden temporary files) go."""
        for partial in self.files.glob(".*"):
            partial.unlink(missing_ok=True)
        for template in self.all():
            for build in template.builds.values():
                if build.status in ("waiting", "building"):
                    self.update(template.template_id, build.build_id, status="error", finished_at=time.time(),
                                reason="the daemon stopped during this build; build again (finished steps are "
                                "cached)", step="finalize")  # fmt: skip

    def tag(self, target: str, tags: list[str]) -> tuple[str, list[str]]:
        """Point ``tags`` at the build ``target`` (``name:tag``) names."""
        name, _ = split_name(target)
        found = self.resolve(target)
        if found is None:
            raise NotFound(f"template {echo(name)} not found")
        template, build = found
        names = sorted({split_name(f"{name}:{t}")[1] for t in tags})
        with self.lock:
            template = self.get(template.template_id)
            for tag in names:
                template.tags[tag] = Tag(build_id=build.build_id)
            self.put(template)
        return build.build_id, names

    def untag(self, name: str, tags: list[str]) -> None:
        with self.lock:
            template = self.find(name)
            missing = [t for t in tags if t not in template.tags]
            if missing:
                raise NotFound(f"template {echo(template.name)} has no tag {echo(missing[0])}")
            for tag in tags:
                del template.tags[tag]
            self.put(template)

    def remove(self, template: Template) -> None:
        with self.lock:
            self._path(template.template_id).unlink(missing_ok=True)
        for build_id in template.builds:
            self._log_path(build_id).unlink(missing_ok=True)

    # -- logs

    def _log_path(self, build_id: str) -> Path:
        try:
            name = f"{uuid.UUID(build_id)}.log"  # its canonical form, whatever form was given
        except ValueError:
            raise InvalidRequest(f"{echo(build_id)} is not a build id") from None
        return hostpath.child(self.directory, name, "build id")

    def log(self, build_id: str, message: str, level: str = "info", step: str | None = None) -> None:
        entries = self.logs.setdefault(build_id, [])
        if len(entries) == MAX_LOG_ENTRIES:
            message, level = f"the log is cut here: a build keeps {MAX_LOG_ENTRIES} lines", "warn"
        elif len(entries) > MAX_LOG_ENTRIES:
            return
        entry = {"timestamp": time.time(), "level": level, "message": message}
        entries.append(entry | ({"step": step} if step else {}))

    def entries(self, build_id: str) -> list[dict[str, Any]]:
        if build_id in self.logs:
            return self.logs[build_id]
        path = self._log_path(build_id)
        try:
            loaded = json.loads(path.read_bytes())
        except (OSError, ValueError):
            loaded = []
        return loaded if isinstance(loaded, list) else []

    def _keep_log(self, build_id: str) -> None:
        """On disk once the build ended; memory keeps only the logs of builds under way."""
        atomic_write(self._log_path(build_id), json.dumps(self.logs.get(build_id, [])).encode(), mode=0o600)
        self.logs.pop(build_id, None)

    # -- uploaded files

    def file(self, files_hash: str) -> Path:
        if not FILES_HASH.fullmatch(files_hash):
            raise InvalidRequest(f"{echo(files_hash)} is not a files hash (64 hex digits)")
        return self.files / f"{files_hash}.tar"
