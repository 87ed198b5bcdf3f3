"""The public surface: what `import stasis` offers, and sync/async twins that do not drift."""

from __future__ import annotations

import inspect

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
