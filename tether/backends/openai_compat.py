"""Any OpenAI-compatible `/v1/chat/completions` server (kind "openai"): vLLM, SGLang, llama.cpp,
llama-cpp-python, Ollama, LM Studio, OpenAI itself.

`base_url` is required (e.g. http://127.0.0.1:8000/v1); `api_key_env` is optional. `dialect`
(default "auto": detected from `GET /models`) names the server family; the table is in
`tether.backends.chat.dialects` and docs/backends.md. Capability flags (reasoning, json_schema,
images, ...) are plain config options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tether.backends.chat_completions import ChatCompletionsBackend, ChatCompletionsConfig


@dataclass(kw_only=True)
class OpenAICompatConfig(ChatCompletionsConfig):
    base_url: str


class OpenAICompatBackend(ChatCompletionsBackend):
    kind: ClassVar[str] = "openai"
    Config: ClassVar[type[ChatCompletionsConfig]] = OpenAICompatConfig
