"""The desktop's room: screenshots, the mouse, the keyboard and the browser of a sandbox's desktop session.

The session (:mod:`stasis.desktop.session`: Xvfb, openbox, x11vnc, Chromium) is a background process of the
sandbox, started here when a sandbox of the `desktop` image first starts or is first asked for its screen, so
it is suspended, checkpointed, forked and moved with the sandbox. Every action is one command in the sandbox
(`scrot`, `xdotool`) given as an argv, never through a shell: what an agent types is never parsed.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time

from ...desktop import DEFAULT_SCREEN, DISPLAY, IMAGE, SESSION_NAME, VNC_PORT, VNC_VIEW_PORT, bootstrap
from ...desktop.actions import DesktopAction
from ...errors import GuestError, StasisError
from ...guest.client import GuestChannel
from ...models import RunRequest, SandboxInfo
from ..core.service import SandboxService
from .operations import GuestOperations
from .ports import Ports
from .resident import Resident, Stream

log = logging.getLogger(__name__)

START_TIMEOUT = 180.0  # seconds for the session's VNC server to answer (Chromium's first start on a loaded host)
WINDOW_TIMEOUT = 300.0  # seconds for the browser's window to take a URL (Chromium on TCG, loaded: minutes of churn)
SHOT = "/tmp/.stasis-screenshot.png"
BUTTONS = {"left": "1", "middle": "2", "right": "3"}
ENV = {"DISPLAY": DISPLAY}


class DesktopRoom:
    def __init__(self, core: SandboxService, ports: Ports, ops: GuestOperations) -> None:
        self.core, self.ops = core, ops
        self.session = Resident(core, ports, ops, name=SESSION_NAME, port=VNC_PORT, what="the desktop",
                                argv=self._argv, exited=_exited, start_timeout=START_TIMEOUT)  # fmt: skip
        self._ready: set[str] = set()  # sessions seen answering; a command that fails looks again
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------ the session

    async def on_start(self, info: SandboxInfo, channel: GuestChannel) -> None:
        """A desktop sandbox starts its session at boot: after the create or resume that holds the lock."""
        if info.spec.image != IMAGE or not info.spec.desktop_session:
            return
        task = asyncio.create_task(self._start_quietly(info.id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start_quietly(self, sandbox_id: str) -> None:
        try:
            await self.ensure(sandbox_id)
        except StasisError as exc:
            log.warning("the desktop of %s did not start: %s", sandbox_id, exc)

    async def ensure(self, sandbox_id: str) -> None:
        """The session running (its VNC server answering), started if it was not."""
        await self.session.ensure(sandbox_id)
        self._ready.add(sandbox_id)

    async def vnc(self, ref: str, control: bool) -> Stream:
        """A connection to the desktop's VNC server: the one that takes input, or (``control`` False) the one
        that only shows the screen; the session is started (and the sandbox resumed) first if need be."""
        sandbox_id = self.core.lookup(ref).id
        await self.ensure(sandbox_id)
        return await self.session.connect(sandbox_id, VNC_PORT if control else VNC_VIEW_PORT)

    def _argv(self, sandbox_id: str) -> list[str]:
        return bootstrap(self.core.lookup(sandbox_id).spec.screen or DEFAULT_SCREEN)

    async def forget(self, sandbox_id: str) -> None:
        self._ready.discard(sandbox_id)

    # ------------------------------------------------------------ what an agent does

    async def screenshot(self, ref: str) -> bytes:
        """The screen as PNG."""
        sandbox_id = self.core.lookup(ref).id
        shot = ["sh", "-c", 'scrot --overwrite "$1" && cat "$1"', "sh", SHOT]
        return base64.b64decode(await self._in_session(sandbox_id, shot))

    async def _in_session(self, sandbox_id: str, argv: list[str]) -> str:
        """Run ``argv`` in the session; one that fails where the session was not checked just now (a cold boot
        ended it) has the session started and runs once more."""
        if sandbox_id not in self._ready:
            await self.ensure(sandbox_id)
            return await self._run(sandbox_id, argv)
        try:
            return await self._run(sandbox_id, argv)
        except GuestError:
            self._ready.discard(sandbox_id)
            await self.ensure(sandbox_id)
            return await self._run(sandbox_id, argv)

    async def act(self, ref: str, action: DesktopAction) -> None:
        sandbox_id = self.core.lookup(ref).id
        first, *rest = commands(action)
        deadline = time.monotonic() + WINDOW_TIMEOUT
        while True:  # a browser starting up opens and closes windows: one found may be gone a moment later
            try:
                await self._in_session(sandbox_id, first)
                break
            except GuestError:
                if action.action != "open" or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        for argv in rest:
            await self._run(sandbox_id, argv)

    async def _run(self, sandbox_id: str, argv: list[str]) -> str:
        result = await self.ops.run(sandbox_id, RunRequest(cmd=argv, env=ENV, timeout=60, max_output=64 << 20))
        if result.exit_code != 0:
            said = base64.b64decode(result.stderr_b64).decode(errors="replace").strip()
            raise GuestError(f"`{argv[0]}` failed in the desktop of {sandbox_id} (exit {result.exit_code}): {said}")
        return result.stdout_b64


def _exited(said: str) -> str:
    return f"a desktop needs the `{IMAGE}` image (Sandbox.create(image={IMAGE!r})); its session exited: {said}"


def commands(action: DesktopAction) -> list[list[str]]:
    """The argv (xdotool's, or Chromium's) that carry out ``action``."""
    # No --sync: it waits for the pointer to move, and a click where the pointer already is would wait forever.
    # xdotool sends its steps in order, and the X server applies them in order.
    at = ["mousemove", str(action.x), str(action.y)] if action.x is not None and action.y is not None else []
    button = BUTTONS[action.button]
    match action.action:
        case "move":
            return [["xdotool", *at]]
        case "click":
            return [["xdotool", *at, "click", button]]
        case "double_click":
            return [["xdotool", *at, "click", "--repeat", "2", "--delay", "80", button]]
        case "scroll":
            return [["xdotool", *at, "click", "--repeat", str(action.amount), "4" if action.direction == "up" else "5"]]
        case "drag":
            to = ["mousemove", str(action.to_x), str(action.to_y)]
            return [["xdotool", *at, "mousedown", button, *to, "mouseup", button]]
        case "type":
            return [["xdotool", "type", "--delay", "12", "--", action.text or ""]]
        case "press":
            return [["xdotool", "key", "--", *action.keys]]
        case "open":  # as a person would: the browser's window (waited for), its address bar, the URL, Return
            window = ["xdotool", "search", "--sync", "--onlyvisible", "--class", "chromium", "windowactivate", "--sync"]
            return [[*window, "key", "--clearmodifiers", "ctrl+l"], ["xdotool", "type", "--delay", "5", "--",
                    action.url or "about:blank"], ["xdotool", "key", "Return"]]  # fmt: skip
    raise ValueError(f"not a desktop action carried out by a command: {action.action}")
