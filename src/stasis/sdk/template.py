"""``Template``: a sandbox that starts warm, its server already running.

    Template.create("notebook", image="default", start_cmd="python3 -m http.server 8000",
                    ready_cmd="python3 -c 'import socket; socket.create_connection((\\"127.0.0.1\\", 8000))'")
    sbx = Sandbox.create(template="notebook")      # restored: the server answers at once

A template is the image booted once, its start command started and its ready command passing, kept
as a MEMORY checkpoint named ``template-NAME`` (every sandbox from it continues from that instant).
"""

from __future__ import annotations

import base64
import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from typing_extensions import Unpack

from ..errors import GuestTimeout, NameTaken, NotFound, TemplateNotReady
from ..kernels import IMAGE, PORT, bootstrap
from ..models import TEMPLATE_PREFIX as PREFIX
from ..models import CheckpointType, build
from ..models import CreateSandboxRequest as _Request
from . import _base as b
from ._client import Client
from ._sync import Sandbox

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Template:
    name: str
    image: str
    start_cmd: str
    ready_cmd: str | None
    checkpoint_id: str

    @classmethod
    def create(
        cls,
        name: str,
        image: str = "default",
        *,
        start_cmd: str,
        ready_cmd: str | None = None,
        ready_timeout: float = 120.0,
        replace: bool = False,
        client: Client | None = None,
        on_check: Callable[[int, float, str], None] | None = None,
        **options: Unpack[b.CreateOptions],
    ) -> Template:
        """Boot ``image``, run ``start_cmd`` in the background, wait until ``ready_cmd`` exits 0, keep it.
        ``on_check(attempt, seconds waited, what the last check said)`` hears of each check that failed."""
        build(_Request, name=name)  # the same rules as a sandbox's name
        client = client or Client()
        existing = cls._find(name, client)
        if existing is not None and not replace:
            raise NameTaken(f"a template named {name!r} exists; pass replace=True (--replace) to make it again")
        sbx = Sandbox.create(client=client, image=image, **({"timeout_secs": None} | dict(options)))  # type: ignore[arg-type]
        try:
            server = sbx.start_process(["/bin/sh", "-c", start_cmd], name="template-start")
            started_at = time.monotonic()
            deadline = started_at + ready_timeout
            attempt = 0
            while ready_cmd is not None:
                code, text = _ready_check(sbx, ready_cmd)
                if code == 0:
                    break
                attempt += 1
                said = f"exit {code}: {text[-120:]}"
                log.debug("template %s: ready check %d failed (%s)", name, attempt, said)
                if on_check is not None:
                    on_check(attempt, time.monotonic() - started_at, said)
                exited = sbx.get_process(server.id).exit_code is not None
                if exited and _ready_check(sbx, ready_cmd)[0] == 0:
                    break  # it started its server in the background and exited: ready since the check above
                if time.monotonic() > deadline or exited:
                    started = sbx.process_output(server.id)
                    output = base64.b64decode(started.data_b64).decode(errors="replace")[-1000:]
                    raise TemplateNotReady(
                        f"template {name!r}: `{ready_cmd}` did not succeed within {ready_timeout:.0f}s (last exit "
                        f"{code}: {text[-500:]!r}); the start command "
                        f"{'exited' if started.exit_code is not None else 'runs'}, its output: {output!r}"
                    )
                time.sleep(0.2)
            if existing is not None:
                Sandbox.delete_checkpoint(existing.checkpoint_id, client=client)
            meta = {"template": {"name": name, "image": image, "start_cmd": start_cmd, "ready_cmd": ready_cmd}}
            checkpoint = sbx.checkpoint(CheckpointType.MEMORY, name=PREFIX + name, metadata=meta)
        finally:
            sbx.terminate()
        return cls(name, image, start_cmd, ready_cmd, checkpoint.id)

    @classmethod
    def list(cls, client: Client | None = None) -> list[Template]:
        found = []
        for checkpoint in Sandbox.list_checkpoints(client=client or Client()):
            meta: dict[str, Any] = checkpoint.metadata.get("template") or {}
            if (checkpoint.name or "").startswith(PREFIX) and meta:
                found.append(cls(meta["name"], meta["image"], meta["start_cmd"], meta.get("ready_cmd"), checkpoint.id))
        return found

    @classmethod
    def _find(cls, name: str, client: Client) -> Template | None:
        return next((t for t in cls.list(client) if t.name == name), None)

    @classmethod
    def delete(cls, name: str, client: Client | None = None) -> None:
        client = client or Client()
        template = cls._find(name, client)
        if template is None:
            raise NotFound(f"no template named {name!r}; `stasis template ls` lists them")
        Sandbox.delete_checkpoint(template.checkpoint_id, client=client)


def interpreter_template(
    name: str = IMAGE, *, image: str = IMAGE, client: Client | None = None, replace: bool = False,
    **options: Unpack[b.CreateOptions],
) -> Template:  # fmt: skip
    """A template whose sandboxes start with the kernel server and a Python kernel running and warm
    (``Sandbox.create(template="code-interpreter")``): the first ``run_code`` needs no start. E2B's
    ``code-interpreter-v1`` has its own, on its image (:func:`stasis.sdk.e2b.code_template`)."""
    return Template.create(
        name, image, start_cmd=shlex.join(bootstrap()), ready_cmd=READY, replace=replace, client=client,
        ready_timeout=300.0,  # Jupyter's start in a microVM on TCG, on a loaded host: minutes, not seconds
        **({"memory_mb": 1024} | dict(options)),  # type: ignore[arg-type]
    )  # fmt: skip


READY = f'curl -sf http://127.0.0.1:{PORT}/contexts | grep -q \'"id": "python"\''  # the default kernel is up


def _ready_check(sbx: Sandbox, ready_cmd: str) -> tuple[int, str]:
    """One run of the ready check: its exit code and output. A check the sandbox did not answer in time (a loaded
    host: a microVM on TCG starting its server) is a failed one, tried again until the template's deadline."""
    try:
        check = sbx.run(["/bin/sh", "-c", ready_cmd], timeout=30)
    except GuestTimeout as exc:
        return -1, f"no answer: {exc}"
    return check.exit_code, (check.stdout + check.stderr).strip()
