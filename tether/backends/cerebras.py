"""Cerebras Inference (kind "cerebras"): the Chat Completions adapter with the `cerebras` dialect
and Cerebras's defaults (https://api.cerebras.ai/v1, key from CEREBRAS_API_KEY).

What the dialect does for Cerebras (see `tether.backends.chat.dialects`): reasoning controls per
model family (GPT-OSS effort levels, GLM `disable_reasoning`, `reasoning_format: "parsed"`),
earlier reasoning sent back as `reasoning`, `service_tier` passed on, tool schemas reduced to
Cerebras's JSON-schema subset. The default output cap (`default_max_output_tokens`, 16,384) keeps
Cerebras from reserving the model's maximum against the rate limit on every call; 429s carry the
wait from `x-ratelimit-reset-*` when no `retry-after` is sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tether.backends.chat_completions import ChatCompletionsBackend, ChatCompletionsConfig


@dataclass(kw_only=True)
class CerebrasConfig(ChatCompletionsConfig):
    base_url: str = "https://api.cerebras.ai/v1"
    api_key_env: str | None = "CEREBRAS_API_KEY"
    dialect: str = "cerebras"
    default_max_output_tokens: int | None = 16_384
    reasoning: bool = True
    json_schema: bool = True


class CerebrasBackend(ChatCompletionsBackend):
    kind: ClassVar[str] = "cerebras"
    Config: ClassVar[type[ChatCompletionsConfig]] = CerebrasConfig
    require_api_key: ClassVar[bool] = True
