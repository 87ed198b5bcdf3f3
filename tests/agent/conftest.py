"""The scripted OpenAI-compatible server (stasis.agent.scripted) as a fixture."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stasis.agent.scripted import ScriptedModel, call, final, serve_scripted, tools

__all__ = ["ScriptedModel", "call", "final", "tools"]


@pytest.fixture
def model_server() -> Iterator[tuple[ScriptedModel, str]]:
    scripted = ScriptedModel()
    with serve_scripted(scripted) as url:
        yield scripted, url
