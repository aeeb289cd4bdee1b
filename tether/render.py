"""Render + tokenise: items become text segments, segments become o200k_base token ids.

The rendered prompt is defined segment by segment: tokens(conversation) = the concatenation of
encode(segment) over its items, with a header segment (instructions + tools) in front. Because
segments are encoded independently, appending new items to a cached prefix gives exactly the
tokens a full re-encode would give, so a continuation tokenises only its new input (the
SGLang/prompt-segment idea, exact by construction). The tokenizer is `bpe-openai`, which ships the
vocabulary in its wheel and runs offline.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from functools import lru_cache

import bpe_openai

from tether.compaction_codec import decode_payload
from tether.responses.v1 import items_pb2, request_pb2

ENCODING = "o200k_base"


@lru_cache(maxsize=1)
def _encoding() -> bpe_openai.Encoding:
    return bpe_openai.get_encoding(ENCODING)


# bpe_openai refuses one call that yields more than 200,000 tokens (or has 1,000,000+ characters).
# A token is at least one UTF-8 byte, so a piece of at most this many bytes is always accepted:
# ASCII text is cut every `_PIECE_BYTES` characters, any other text every `_PIECE_BYTES // 4`
# (a character is at most 4 bytes). Dense text (CJK, emoji, combining marks) needs that bound:
# 600,000 CJK characters are 600,000 tokens. The pieces are smaller than that bound requires
# (64,000 bytes, ~3 ms of tokenizer each): the tokenizer holds the interpreter lock for a whole
# piece, so while a large input is tokenised in the offload thread (tether/offload.py) the event
# loop waits at most that long for the lock.
_PIECE_BYTES = 64_000


def encode(text: str) -> array:
    """Token ids of `text` (special-token text is encoded as ordinary text, never as control).

    A long text is encoded in pieces that the tokenizer always accepts (see `_PIECE_BYTES`), each
    cut just before a space in its second half when there is one (the o200k pre-tokenizer starts
    a word at its leading space, so such a cut does not change the tokens); a cut elsewhere can
    change a token at the boundary, so the count stays exact to within one token per cut."""
    if not text:
        return array("I")
    enc = _encoding()
    piece = _PIECE_BYTES if text.isascii() else _PIECE_BYTES // 4
    if len(text) <= piece:
        return array("I", enc.encode_ordinary(text))
    out = array("I")
    start, n, half = 0, len(text), piece // 2
    while start < n:
        end = min(n, start + piece)
        if end < n:
            cut = text.rfind(" ", start + half, end)
            if cut > start:
                end = cut
        out.extend(enc.encode_ordinary(text[start:end]))
        start = end
    return out


class TokenCache:
    """Token ids of recently tokenised texts, per tenant, LRU-bounded in bytes (0 disables it).

    Why: a stateless client (HTTP full resend) sends its whole history on every turn, and
    tokenising it again was most of the server's CPU for such a turn; the connection-scoped cache
    cannot help a request that opens no connection. Entries are keyed by (tenant, text) so one
    tenant's timing never reveals what another sent. Texts under `min_chars` are tokenised
    directly: cheap, and not worth an entry. The arrays are shared: callers never modify them.
    Thread-safe: large inputs are tokenised off the event loop (`tether.offload`) while the loop
    tokenises small ones (a lock guards the entries, never the tokenising)."""

    def __init__(self, max_bytes: int, min_chars: int = 256) -> None:
        self.max_bytes = max_bytes
        self.min_chars = min_chars
        self.nbytes = 0
        self.hits = 0
        self._entries: OrderedDict[tuple[str, str], array] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def encode(self, tenant: str, text: str) -> array:
        if self.max_bytes <= 0 or len(text) < self.min_chars:
            return encode(text)
        key = (tenant, text)
        with self._lock:
            tokens = self._entries.get(key)
            if tokens is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return tokens
        tokens = encode(text)
        size = _entry_bytes(text, tokens)
        if size <= self.max_bytes:
            with self._lock:
                if key not in self._entries:
                    self._entries[key] = tokens
                    self.nbytes += size
                while self.nbytes > self.max_bytes:
                    (_, old_text), old = self._entries.popitem(last=False)
                    self.nbytes -= _entry_bytes(old_text, old)
        return tokens


def _entry_bytes(text: str, tokens: array) -> int:
    return len(text) + tokens.itemsize * len(tokens) + 128  # the text is held as the key


def render_item(item: items_pb2.Item) -> str:
    """One item as prompt text (a harmony-like frame per item)."""
    arm = item.WhichOneof("item")
    if arm == "message":
        msg = item.message
        return f"<|start|>{msg.role}<|message|>{message_text(msg)}<|end|>"
    if arm == "function_call":
        fc = item.function_call
        return f"<|start|>assistant to=functions.{fc.name}<|call|>{fc.arguments}<|end|>"
    if arm == "function_call_output":
        out = item.function_call_output
        body = out.output_text if out.WhichOneof("output") == "output_text" else out.output_json
        return f"<|start|>tool {out.call_id}<|message|>{body}<|end|>"
    if arm == "reasoning":
        r = item.reasoning
        return f"<|start|>assistant<|channel|>analysis<|message|>{' '.join([*r.summary, *r.content])}<|end|>"
    if arm == "compaction":
        return f"<|start|>system<|message|>Summary of the earlier conversation: {decode_payload(item.compaction.encrypted_content).summary}<|end|>"
    if arm == "item_reference":
        return f"<|start|>reference<|message|>{item.item_reference.id}<|end|>"
    if arm == "mcp_call":
        mc = item.mcp_call
        result = mc.output if mc.HasField("output") else mc.error_json
        return (f"<|start|>assistant to=mcp.{mc.server_label}.{mc.name}<|call|>{mc.arguments}<|end|>"
                f"<|start|>tool {mc.id}<|message|>{result}<|end|>")  # fmt: skip
    if arm == "mcp_list_tools":
        lt = item.mcp_list_tools
        tools = " ".join(f"{t.name}: {t.description} {t.input_schema_json}" for t in lt.tools)
        return f"<|start|>mcp.{lt.server_label}<|message|>{tools}{lt.error}<|end|>"
    if arm == "mcp_approval_request":
        ar = item.mcp_approval_request
        return f"<|start|>assistant to=mcp.{ar.server_label}.{ar.name}<|approval|>{ar.arguments}<|end|>"
    if arm == "mcp_approval_response":
        resp = item.mcp_approval_response
        return f"<|start|>user {resp.approval_request_id}<|message|>{resp.approve} {resp.reason}<|end|>"
    if arm == "multi_agent_call":
        mac = item.multi_agent_call
        return f"<|start|>assistant to=agents.{mac.action}<|call|>{mac.arguments}<|end|>"
    if arm == "multi_agent_call_output":
        maco = item.multi_agent_call_output
        return f"<|start|>tool {maco.call_id}<|message|>{' '.join(p.output_text.text for p in maco.output)}<|end|>"
    if arm == "agent_message":
        am = item.agent_message
        return f"<|start|>{am.author} to={am.recipient}<|message|>{' '.join(p.input_text.text for p in am.content)}<|end|>"
    return f"<|start|>{item.other.type}<|message|>{item.other.json}<|end|>"


def message_text(msg: items_pb2.Message) -> str:
    """The text a model sees for a message's content (images and files as short placeholders)."""
    if msg.HasField("content_text"):
        return msg.content_text
    parts = []
    for part in msg.content:
        arm = part.WhichOneof("part")
        if arm == "input_text":
            parts.append(part.input_text.text)
        elif arm == "output_text":
            parts.append(part.output_text.text)
        elif arm == "refusal":
            parts.append(part.refusal.refusal)
        elif arm == "input_image":
            parts.append("[image]")
        elif arm == "input_file":
            parts.append(f"[file {part.input_file.filename or part.input_file.file_id}]")
        elif arm == "other":
            parts.append(part.other.json)
    return "\n".join(parts)


def render_header(instructions: str | None, tools: list[request_pb2.Tool] | tuple) -> str:
    """Instructions and tool definitions: the segment in front of every conversation."""
    pieces = []
    if instructions:
        pieces.append(f"<|start|>developer<|message|>{instructions}<|end|>")
    if tools:
        defs = []
        for tool in tools:
            if tool.WhichOneof("tool") == "function":
                fn = tool.function
                defs.append(f"{fn.name}: {fn.description} {fn.parameters_json}")
            else:
                defs.append(tool.other.json)
        pieces.append("<|start|>system<|message|># Tools\n" + "\n".join(defs) + "<|end|>")
    return "".join(pieces)
