"""A sandbox's desktop from the SDK: ``sbx.screenshot()``, ``sbx.mouse``, ``sbx.keyboard``, ``sbx.open(url)``.

    sbx = Sandbox.create(image="desktop", screen="1280x800")
    sbx.open("https://example.com")      # typed into the browser's address bar
    png = sbx.screenshot()
    sbx.mouse.click(640, 400)
    sbx.keyboard.type("hello")
    sbx.keyboard.press("ctrl+l")

The same objects serve both twins: on an :class:`AsyncSandbox` each call returns an awaitable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..desktop.actions import DesktopAction
from ..models import build
from ._base import Call

Button = str  # "left", "middle" or "right"


def action_call(sandbox_url: str, **fields: Any) -> Call:
    body = build(DesktopAction, **{k: v for k, v in fields.items() if v is not None})
    return Call("POST", f"{sandbox_url}/desktop/actions", json=body.model_dump(exclude_defaults=True))


class Mouse:
    def __init__(self, url: str, send: Callable[[Call], Any]) -> None:
        self._url, self._send = url, send

    def move(self, x: int, y: int) -> Any:
        return self._send(action_call(self._url, action="move", x=x, y=y))

    def click(self, x: int | None = None, y: int | None = None, button: Button = "left") -> Any:
        """At (x, y), or where the pointer is."""
        return self._send(action_call(self._url, action="click", x=x, y=y, button=button))

    def double_click(self, x: int | None = None, y: int | None = None) -> Any:
        return self._send(action_call(self._url, action="double_click", x=x, y=y))

    def scroll(self, amount: int = 1, direction: str = "down", x: int | None = None, y: int | None = None) -> Any:
        return self._send(action_call(self._url, action="scroll", amount=amount, direction=direction, x=x, y=y))

    def drag(self, start: tuple[int, int], end: tuple[int, int], button: Button = "left") -> Any:
        fields = {"x": start[0], "y": start[1], "to_x": end[0], "to_y": end[1], "button": button}
        return self._send(action_call(self._url, action="drag", **fields))


class Keyboard:
    def __init__(self, url: str, send: Callable[[Call], Any]) -> None:
        self._url, self._send = url, send

    def type(self, text: str) -> Any:
        """Type ``text`` as keystrokes, into the focused window."""
        return self._send(action_call(self._url, action="type", text=text))

    def press(self, *keys: str) -> Any:
        """Press each key combination in turn: ``press("ctrl+l")``, ``press("Return")``."""
        return self._send(action_call(self._url, action="press", keys=list(keys)))


class DesktopRecipes:
    """The desktop's calls; the twins send them."""

    _url: str

    def _screenshot_call(self) -> Call:
        return Call("GET", f"{self._url}/desktop/screenshot", lambda r: r.content)

    def _open_call(self, url: str) -> Call:
        return action_call(self._url, action="open", url=url)

    def _desktop_call(self) -> Call:
        return Call("POST", f"{self._url}/desktop")
