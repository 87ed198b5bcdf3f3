"""The agent harness: an OpenAI-compatible tool-calling loop whose tools run in a stasis sandbox."""

from .journal import Journal, RunRecord
from .loop import AgentRunner
from .models import ModelError, OpenAIModel

__all__ = ["AgentRunner", "Journal", "ModelError", "OpenAIModel", "RunRecord"]
