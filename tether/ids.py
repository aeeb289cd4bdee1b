"""Identifiers. Every id carries 128 random bits from the OS's CSPRNG, so ids are unguessable
handles.

The bits are read `_POOL_BYTES` at a time (one `getrandom` per 256 ids, not one per id: a create
makes several ids, and a system call costs ~5-10 µs on a VM, where 100 simultaneous creates wait
out each other's). The pool is dropped in a forked child, so no two processes hand out the same
bytes."""

from __future__ import annotations

import os
import re
import threading

# What an id a client names (a response, a conversation, an item) may look like before it is used
# in a store key: Tether's own ids and any client-chosen item id of letters, digits, `_`, `-`, `.`.
# Anything else (`resp_x:ev`, a NUL, a megabyte) cannot name anything: the caller answers 404 at
# once, and no store key is ever built from it (`<id>:ev` would name another kind of Redis key).
_SHAPE = re.compile(r"[A-Za-z0-9_.-]{1,256}")


def well_formed(value: str) -> bool:
    """Whether `value` has the shape of an id (see `_SHAPE`)."""
    return _SHAPE.fullmatch(value) is not None


_POOL_BYTES = 4096
_pool = b""
_at = 0
_lock = threading.Lock()  # ids are also made off the loop (offloaded work): no chunk twice


def _drop_pool() -> None:
    global _pool, _at, _lock
    _pool, _at, _lock = b"", 0, threading.Lock()


os.register_at_fork(after_in_child=_drop_pool)


def _random16() -> bytes:
    global _pool, _at
    with _lock:
        if _at + 16 > len(_pool):
            _pool, _at = os.urandom(_POOL_BYTES), 0
        chunk = _pool[_at : _at + 16]
        _at += 16
    return chunk


def new_id(prefix: str) -> str:
    """`prefix_` followed by 32 hex digits (128 random bits), e.g. `resp_9f…`."""
    return f"{prefix}_{_random16().hex()}"


def response_id() -> str:
    return new_id("resp")


def message_id() -> str:
    return new_id("msg")


def function_call_id() -> str:
    return new_id("fc")


def custom_tool_call_id() -> str:
    return new_id("ctc")


def call_id() -> str:
    return new_id("call")


def reasoning_id() -> str:
    return new_id("rs")


def compaction_id() -> str:
    return new_id("cmp")
