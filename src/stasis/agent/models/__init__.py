"""Model adapters: anything with ``complete(messages, tools) -> ModelReply``."""

from .openai import ModelError, ModelReply, OpenAIModel

__all__ = ["ModelError", "ModelReply", "OpenAIModel"]
