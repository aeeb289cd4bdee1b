"""Any OpenAI-compatible `/v1/chat/completions` server (kind "openai"): vLLM, llama.cpp, Ollama, ...

`base_url` is required (e.g. http://127.0.0.1:8000/v1); `api_key_env` is optional. Streamed
reasoning is read from `delta.reasoning_content` (vLLM, llama.cpp, DeepSeek style) or
`delta.reasoning`. Earlier reasoning is not sent back by default (`reasoning_field` = None);
set it to "reasoning_content" or "reasoning" for servers whose chat template uses it.
Capability flags (reasoning, json_schema, images, ...) are plain config options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tether.backends.chat_completions import ChatCompletionsBackend, ChatCompletionsConfig


@dataclass(kw_only=True)
class OpenAICompatConfig(ChatCompletionsConfig):
    base_url: str
    reasoning_field: str | None = None


class OpenAICompatBackend(ChatCompletionsBackend):
    kind: ClassVar[str] = "openai"
    Config: ClassVar[type[ChatCompletionsConfig]] = OpenAICompatConfig
    reasoning_delta_fields: ClassVar[tuple[str, ...]] = ("reasoning_content", "reasoning")
