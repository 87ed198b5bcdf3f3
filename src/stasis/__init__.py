"""stasis: stateful sandboxes for AI agents.

Every sandbox has its own kernel and can be suspended with its memory, running
processes and files, and resumed later exactly where it was::

    from stasis import Sandbox

    sbx = Sandbox.create(name="work")
    sbx.run("python3 -c 'print(1 + 1)'").stdout   # '2\\n'
    sbx.suspend(); sbx.resume()

The SDK's names are imported on first use, so that `stasis ls` and the guest's tools do not pay for
pydantic and httpx at start-up.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .sdk import *  # noqa: F403


def __getattr__(name: str) -> Any:
    if (name.startswith("__") and name != "__all__") or importlib.util.find_spec(f"{__name__}.{name}") is not None:
        # a submodule (`from stasis import faults` asks here first): the import system loads it, not the SDK
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    sdk = importlib.import_module(".sdk", __name__)
    if name == "__all__":
        return ["__version__", *sdk.__all__]
    if name in sdk.__all__:
        return getattr(sdk, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__getattr__("__all__")})
