"""The public surface: what `import stasis` offers, and sync/async twins that do not drift."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import stasis
from stasis import AsyncSandbox, Sandbox

pytestmark = pytest.mark.fast


def test_exported_members() -> None:
    assert {
        "Sandbox", "AsyncSandbox", "Client", "AsyncClient", "CommandResult", "SandboxInfo", "SandboxStatus",
        "StasisError", "InvalidRequest", "NotFound", "SandboxNotFound", "FileNotFound", "StateError",
        "DaemonUnavailable", "GuestError", "BackendError",
    } <= set(stasis.__all__)  # fmt: skip
    for name in stasis.__all__:
        assert hasattr(stasis, name), name


def test_the_sdk_loads_on_first_use_and_submodules_load_without_it() -> None:
    """`import stasis` is cheap (the CLI's quick path and the guest's tools rely on it); `from stasis import
    faults` (a submodule) loads that module alone; a name of the SDK loads the SDK."""
    probe = (
        "import sys, stasis; assert 'stasis.sdk' not in sys.modules; "
        "from stasis import faults, paths; assert 'stasis.sdk' not in sys.modules; "
        "from stasis.images.recipe import RECIPES; "
        "from stasis import Sandbox; assert Sandbox.__module__ == 'stasis.sdk._sync'"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member)
    }


def test_sync_and_async_sandboxes_have_the_same_methods() -> None:
    sync, asynchronous = _public(Sandbox), _public(AsyncSandbox)
    sync.pop("close")
    asynchronous.pop("aclose")
    assert sync.keys() == asynchronous.keys()
    for name, signature in sync.items():
        twin = asynchronous[name]
        assert list(signature.parameters) == list(twin.parameters), name
        member = getattr(AsyncSandbox, name)
        assert inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member), name


def test_errors_are_catchable_as_builtins() -> None:
    assert issubclass(stasis.FileNotFound, FileNotFoundError)
    assert issubclass(stasis.InvalidRequest, ValueError)
    assert issubclass(stasis.DaemonUnavailable, ConnectionError)
    assert issubclass(stasis.GuestTimeout, TimeoutError)
