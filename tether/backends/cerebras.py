"""Cerebras Inference (kind "cerebras"): the Chat Completions adapter with the `cerebras` dialect
and Cerebras's defaults (https://api.cerebras.ai/v1, key from CEREBRAS_API_KEY).

What the dialect does for Cerebras (see `tether.backends.chat.dialects`, and docs/cerebras.md):
API version 2 pinned (`X-Cerebras-Version-Patch: 2`) and its rules kept before sending (`$defs`,
closed strict schemas, tool messages in order); each model's capabilities and limits read from
`GET /v1/models/{id}` (reasoning, vision, structured outputs, output cap), the family table
filling in what it leaves unsaid (effort levels: GPT-OSS low-high, GLM and later Qwen none-high,
Gemma and Qwen3 none); `reasoning_format: "parsed"`; earlier reasoning sent back as `reasoning`
with `clear_thinking: false`; `service_tier` passed on and the tier used read back. The default
output cap (`default_max_output_tokens`, 16,384, or the model's own limit when lower) keeps
Cerebras from reserving the model's maximum against the rate limit on every call; 429s carry the
wait from `x-ratelimit-reset-*` when no `retry-after` is sent. Connections are warmed
(`/tcp_warming`) at startup and through idle gaps; bodies of 16 KiB and more go gzip-compressed.
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
    images: bool = True  # where the model takes them (its model info, else the family table)
    gzip_min_bytes: int | None = 16 * 1024
    warm_path: str | None = "/tcp_warming"


class CerebrasBackend(ChatCompletionsBackend):
    kind: ClassVar[str] = "cerebras"
    Config: ClassVar[type[ChatCompletionsConfig]] = CerebrasConfig
    require_api_key: ClassVar[bool] = True
