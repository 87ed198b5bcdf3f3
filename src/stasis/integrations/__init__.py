"""Adapters that make stasis a sandbox provider inside agent frameworks.

Each module imports its framework and is installed with an extra of the same name
(``pip install 'stasis[minisweagent]'``); importing one without it says which extra to install.
"""

from __future__ import annotations

import importlib


def require(module: str, extra: str) -> None:
    """Import ``module`` or say which extra installs it."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"stasis.integrations.{extra} needs the {module!r} package: pip install 'stasis[{extra}]'"
        ) from exc
