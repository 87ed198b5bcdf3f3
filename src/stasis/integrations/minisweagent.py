"""mini-swe-agent environment: every action runs in a stasis sandbox.

    mini --environment-class stasis.integrations.minisweagent.StasisEnvironment -t "..."

Constructed with no arguments it creates a sandbox from the default image, and removes it when mini
is done (as the Docker environment removes its container). Given a ``name`` (``environment: {name: work}``
in the YAML config), it keeps that sandbox suspended, memory and processes, when mini is done, and the
next run with the same config finds it as it was (``keep: false`` removes it instead). ``sandbox="name"``
attaches to an existing one and leaves it be.
"""

from __future__ import annotations

import logging
import os
import platform
from typing import Any

from . import require

require("minisweagent", "minisweagent")

from minisweagent.exceptions import Submitted  # noqa: E402
from minisweagent.utils.serialize import recursive_merge  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from ..errors import SandboxNotFound, StasisError  # noqa: E402
from ..models import SandboxStatus  # noqa: E402
from ..sdk import Client, Sandbox  # noqa: E402

log = logging.getLogger(__name__)

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class StasisEnvironmentConfig(BaseModel):
    sandbox: str = ""
    """Name or id of an existing sandbox to run in; empty: create one."""
    name: str | None = None
    """Name of the sandbox to create, or to find again (when ``sandbox`` is empty)."""
    image: str = "default"
    template: str | None = None
    network: bool = False
    cwd: str = "/root"
    env: dict[str, str] = {}
    forward_env: list[str] = []
    """Variables of mini's own environment passed to every action (as the Docker environment's)."""
    timeout: int = 30
    """Seconds an action may run; then it and its children are killed."""
    max_output: int = 64 << 20
    """Bytes of output kept (the last ones); beyond it, ``exception_info`` says what was cut."""
    interpreter: list[str] = ["bash", "-lc"]
    keep: bool | None = None
    """When mini is done (``cleanup()``): suspend the sandbox this environment made (True) or remove it
    (False). None: keep it when it has a ``name`` to be found by, else remove it."""


class StasisEnvironment:
    def __init__(self, *, config_class: type = StasisEnvironmentConfig, client: Client | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        self.config = config_class(**kwargs)
        self._client = client or Client()
        self._owned = not self.config.sandbox
        self._cleaned = False
        if not self._owned:
            self.sandbox = Sandbox.connect(self.config.sandbox, client=self._client)
        elif (found := self._named()) is not None:
            self.sandbox = found
            log.info("found sandbox %s (%s) for mini-swe-agent, as the last run left it", found.name, found.id)
        else:
            self.sandbox = Sandbox.create(self.config.name, client=self._client, image=self.config.image,
                                          network=self.config.network, template=self.config.template)  # fmt: skip
            log.info("created sandbox %s for mini-swe-agent", self.sandbox.id)

    def _named(self) -> Sandbox | None:
        if not self.config.name:
            return None
        try:
            found = Sandbox.connect(self.config.name, client=self._client)
        except SandboxNotFound:
            return None
        return None if found.status == SandboxStatus.TERMINATED else found

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        timeout = timeout or self.config.timeout
        # One stream, in the order written, as mini-swe-agent's own environments give it.
        argv = [*self.config.interpreter, f"exec 2>&1\n{command}"]
        forwarded = {key: value for key in self.config.forward_env if (value := os.getenv(key)) is not None}
        try:
            result = self.sandbox.run(argv, working_dir=cwd or self.config.cwd, env=forwarded | self.config.env,
                                      timeout=timeout, max_output=self.config.max_output)  # fmt: skip
        except StasisError as exc:  # as the local and Docker environments report a command that could not run
            return {"output": "", "returncode": -1,
                    "exception_info": f"An error occurred while executing the command: {exc}",
                    "extra": {"exception_type": type(exc).__name__, "exception": str(exc)}}  # fmt: skip
        output: dict[str, Any] = {"output": result.stdout, "returncode": result.exit_code, "exception_info": ""}
        if result.timed_out:
            output |= {
                "returncode": -1,
                "exception_info": f"The command timed out after {timeout}s and was killed with its children.",
                "extra": {"exception_type": "TimeoutExpired", "exception": f"timed out after {timeout}s"},
            }
        elif result.stdout_truncated:
            output["exception_info"] = f"Only the last {self.config.max_output} bytes of the output are shown."
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        lines = output["output"].lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})  # fmt: skip

    def suspend(self) -> None:
        """Save the sandbox with its memory and processes; the next action resumes it."""
        self.sandbox.suspend()

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        info = self.sandbox.info()
        sandbox = {"sandbox_id": info.id, "sandbox_name": info.name or "", "backend": info.spec.backend}
        return recursive_merge(self.config.model_dump(), platform.uname()._asdict(), sandbox, kwargs)

    def serialize(self) -> dict:
        config = self.config.model_dump(mode="json") | {"sandbox": self.sandbox.id}
        return {"info": {"config": {"environment": config,
                                    "environment_type": f"{type(self).__module__}.{type(self).__name__}"}}}  # fmt: skip

    def cleanup(self) -> None:
        """When mini is done: keep (suspended) or remove the sandbox this environment made or found by name (see
        ``keep``); a sandbox it was given (``sandbox=``) is left as it is."""
        if not self._owned or self._cleaned:
            return
        self._cleaned = True
        keep = self.config.keep if self.config.keep is not None else bool(self.config.name)
        try:
            (self.sandbox.suspend if keep else self.sandbox.terminate)()
        except StasisError as exc:
            log.warning("could not %s sandbox %s: %s", "suspend" if keep else "remove", self.sandbox.id, exc)

    def __del__(self) -> None:
        """mini never calls cleanup(): as the Docker environment, clean up when the environment goes."""
        if getattr(self, "sandbox", None) is not None:
            self.cleanup()
