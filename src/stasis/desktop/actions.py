"""What an agent does on a desktop, as the API takes it: one action, checked before anything runs."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from ..models import Strict

KEY_NAME = r"^[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*$"  # xdotool's: Return, ctrl+l, ctrl+shift+t


class DesktopAction(Strict):
    """One thing done on a sandbox's desktop: ``POST /v1/sandboxes/{ref}/desktop/actions``."""

    action: Literal["move", "click", "double_click", "scroll", "drag", "type", "press", "open"]
    x: int | None = Field(None, ge=0, le=16384, description="where (move, click, scroll, drag's start)")
    y: int | None = Field(None, ge=0, le=16384)
    to_x: int | None = Field(None, ge=0, le=16384, description="a drag's end")
    to_y: int | None = Field(None, ge=0, le=16384)
    button: Literal["left", "middle", "right"] = "left"
    direction: Literal["up", "down"] = "down"
    amount: int = Field(1, ge=1, le=100, description="scroll steps")
    text: str | None = Field(None, max_length=100_000, description="what to type")
    keys: list[str] = Field(default_factory=list, max_length=32, description="key combinations pressed in turn")
    url: str | None = Field(None, max_length=8192, description="what the browser opens")

    @model_validator(mode="after")
    def _complete(self) -> DesktopAction:
        if (self.x is None) != (self.y is None):
            raise ValueError("give both x and y, or neither (then the pointer stays where it is)")
        needs = {"move": ("x",), "drag": ("x", "to_x", "to_y"), "type": ("text",), "press": ("keys",), "open": ("url",)}
        for name in needs.get(self.action, ()):
            if getattr(self, name) in (None, []):
                raise ValueError(f"a {self.action} needs {name}")
        for key in self.keys:
            if not re.fullmatch(KEY_NAME, key):
                raise ValueError(f"invalid key {key[:40]!r}: use xdotool's names joined by +, e.g. ctrl+l or Return")
        if self.url is not None and (
            not re.match(r"^(https?://|about:|file:/)", self.url) or any(ord(c) < 0x21 for c in self.url)
        ):
            raise ValueError("url must be http(s)://, file:/ or about:, without spaces or control characters")
        return self
