"""Cerebras Inference (kind "cerebras"): Chat Completions at https://api.cerebras.ai/v1.

Quirks handled by the shared adapter plus these defaults:
- the validator is strict (unknown body fields -> 400 wrong_api_format): the mapping sends only
  known fields and never forwards a client's unknown ones;
- streamed reasoning arrives as `delta.reasoning`; earlier reasoning goes back as `reasoning` on
  assistant messages; `reasoning_effort` is low/medium/high only (minimal -> low, none dropped);
- the final chunk carries `usage` and `time_info` (-> `Finish.timing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tether.backends.chat_completions import ChatCompletionsBackend, ChatCompletionsConfig


@dataclass(kw_only=True)
class CerebrasConfig(ChatCompletionsConfig):
    base_url: str = "https://api.cerebras.ai/v1"
    api_key_env: str | None = "CEREBRAS_API_KEY"
    reasoning_field: str | None = "reasoning"
    reasoning: bool = True
    json_schema: bool = True


class CerebrasBackend(ChatCompletionsBackend):
    kind: ClassVar[str] = "cerebras"
    Config: ClassVar[type[ChatCompletionsConfig]] = CerebrasConfig
    reasoning_delta_fields: ClassVar[tuple[str, ...]] = ("reasoning",)
    require_api_key: ClassVar[bool] = True
