"""Chat completions through the `openai` package: OpenAI, vLLM, Ollama, llama.cpp, LiteLLM..."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import ModelError

if TYPE_CHECKING:
    import openai


@dataclass(frozen=True)
class ModelReply:
    message: dict[str, Any]  # the assistant message, as it goes back into the conversation
    finish_reason: str | None


class OpenAIModel:
    def __init__(
        self,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries: int = 6,
        timeout: float = 600.0,
    ) -> None:
        import openai  # here, not at the top: 0.45 s that a daemon or CLI start not running an agent never pays

        self.model = model or os.environ.get("STASIS_MODEL") or "gpt-4o-mini"
        # Retries with exponential backoff on 429, 5xx and connection errors are the library's own.
        self.client: openai.OpenAI = openai.OpenAI(
            base_url=base_url or os.environ.get("OPENAI_BASE_URL"),
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "not-needed",
            max_retries=max_retries,
            timeout=timeout,
        )

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelReply:
        import openai

        try:
            response = self.client.chat.completions.create(model=self.model, messages=messages, tools=tools)
        except openai.APIError as exc:
            raise ModelError(f"the model endpoint {self.client.base_url} failed: {exc}") from exc
        if not response.choices:
            raise ModelError("the model endpoint answered with no choices")
        choice = response.choices[0]
        message = choice.message.model_dump(exclude_none=True)
        message.setdefault("content", None)
        message = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}
        message["role"] = "assistant"
        return ModelReply(message=message, finish_reason=choice.finish_reason)
