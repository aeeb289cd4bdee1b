"""The Chat Completions adapter's parts, one concern per module (the adapter itself is
`tether.backends.chat_completions.ChatCompletionsBackend`):

- `dialects`: what each server family accepts and sends (a declared `Dialect` per family,
  chosen in config or detected from `GET /models`).
- `mapping`: Responses request -> the upstream JSON body, shaped by a dialect.
- `schema`: tool parameter schemas reduced to a dialect's JSON-schema subset (Cerebras).
- `sse`: the text/event-stream decoder.
- `stream`: upstream chunk objects -> base chunks (`TextDelta`, `ToolCallDelta`, `Finish`...).
- `upstream_errors`: upstream error bodies -> `BackendError` (sanitised text, Tether codes,
  rate-limit hints) and the retry policy.
"""
