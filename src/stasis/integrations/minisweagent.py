"""mini-swe-agent environment: every action runs in a stasis sandbox.

    mini --environment-class stasis.integrations.minisweagent.StasisEnvironment -t "..."

Constructed with no arguments it creates a sandbox from the default image; ``sandbox="name"``
attaches to an existing one (suspended or not: a command resumes it). Between two runs the sandbox
can be suspended (``env.suspend()``, or by idle) and the next action finds its files and processes.
"""

from __future__ import annotations

import logging
import platform
from typing import Any

from . import require

require("minisweagent", "minisweagent")

from minisweagent.exceptions import Submitted  # noqa: E402
from minisweagent.utils.serialize import recursive_merge  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from ..sdk import Client, Sandbox  # noqa: E402

log = logging.getLogger(__name__)

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class StasisEnvironmentConfig(BaseModel):
    sandbox: str = ""
    """Name or id of an existing sandbox to run in; empty: create one."""
    name: str | None = None
    """Name of the sandbox to create (when ``sandbox`` is empty)."""
    image: str = "default"
    template: str | None = None
    network: bool = False
    cwd: str = "/root"
    env: dict[str, str] = {}
    timeout: int = 30
    """Seconds an action may run; then it and its children are killed."""
    max_output: int = 1_000_000
    """Bytes of output kept (the last ones); the rest is marked truncated."""
    interpreter: list[str] = ["bash", "-lc"]
    keep: bool = False
    """On ``cleanup()``, suspend a sandbox this environment created instead of terminating it."""


class StasisEnvironment:
    def __init__(self, *, config_class: type = StasisEnvironmentConfig, client: Client | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        self.config = config_class(**kwargs)
        self._client = client or Client()
        self._created = not self.config.sandbox
        if self._created:
            self.sandbox = Sandbox.create(self.config.name, client=self._client, image=self.config.image,
                                          network=self.config.network, template=self.config.template)  # fmt: skip
            log.info("created sandbox %s for mini-swe-agent", self.sandbox.id)
        else:
            self.sandbox = Sandbox.connect(self.config.sandbox, client=self._client)

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        timeout = timeout or self.config.timeout
        # One stream, in the order written, as mini-swe-agent's own environments give it.
        argv = [*self.config.interpreter, f"exec 2>&1\n{command}"]
        result = self.sandbox.run(argv, working_dir=cwd or self.config.cwd, env=self.config.env,
                                  timeout=timeout, max_output=self.config.max_output)  # fmt: skip
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
        """Terminate (or with ``keep``, suspend) a sandbox this environment created; leave others be."""
        if self._created:
            (self.sandbox.suspend if self.config.keep else self.sandbox.terminate)()
