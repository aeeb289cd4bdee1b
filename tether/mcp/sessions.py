"""The MCP sessions of one connection, kept for the connection's life.

A session is keyed by the server URL and a digest of the credentials sent to it (headers and
authorization), so a create that names the same server with the same credentials reuses the
initialised session (and its tool list) of an earlier turn; different credentials get a session of
their own. A pool belongs to one connection, and a connection to one tenant, so sessions are never
shared across tenants. A stateless HTTP create is a one-turn connection: its pool opens what it
needs and closes it with the response. Past `max_sessions_per_connection` the least recently used
session is closed. A session that broke (the server went away) is opened again on next use.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping

from tether.config import McpConfig
from tether.mcp.client import McpServerSession
from tether.mcp.policy import McpPolicy

_closing: set[asyncio.Task] = set()  # close_soon's tasks, referenced until done


def credentials_digest(headers: Mapping[str, str], authorization: str | None) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for k, v in sorted(headers.items()):
        h.update(k.lower().encode() + b"\0" + v.encode() + b"\0")
    h.update(b"auth\0" + (authorization or "").encode())
    return h.digest()


class McpSessions:
    def __init__(self, config: McpConfig, on_count: Callable[[int], None] = lambda delta: None) -> None:
        self.config = config
        self._policy: McpPolicy | None = None  # built on first use: most connections name no MCP server
        self._on_count = on_count  # +1 when a session opens, -1 when it closes (the sessions-open gauge)
        self._sessions: OrderedDict[tuple[str, bytes], McpServerSession] = OrderedDict()
        self._locks: dict[tuple[str, bytes], asyncio.Lock] = {}
        self.opened = 0  # sessions this pool opened (tests and the lab read it)
        self._closed = False

    def __len__(self) -> int:
        return len(self._sessions)

    async def get(self, url: str, headers: Mapping[str, str], authorization: str | None) -> McpServerSession:
        """The open session for this server and these credentials: reused, or opened now (raises
        McpFailure when it cannot be)."""
        key = (url, credentials_digest(headers, authorization))
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:  # two lanes of one connection naming one server open one session
            session = self._sessions.get(key)
            if session is not None and session.alive:
                self._sessions.move_to_end(key)
                return session
            if session is not None:
                await self._drop(key)
            sent = dict(headers)
            if authorization:
                sent["Authorization"] = f"Bearer {authorization}"
            if self._policy is None:
                self._policy = McpPolicy(self.config)
            session = McpServerSession(url, sent, self._policy, self.config)
            await session.open()
            if self._closed:  # the connection closed while this one was opening
                await session.aclose()
                raise RuntimeError("the connection is closed")
            self._sessions[key] = session
            self.opened += 1
            self._on_count(1)
            while len(self._sessions) > self.config.max_sessions_per_connection:
                await self._drop(next(iter(self._sessions)))
            return session

    async def _drop(self, key: tuple[str, bytes]) -> None:
        session = self._sessions.pop(key, None)
        if session is not None:
            self._on_count(-1)
            await session.aclose()

    def close_soon(self) -> asyncio.Task | None:
        """Close every session in the background (the connection ended): the last response's
        terminal event is not held back by the servers' goodbyes (`DELETE` of each session).
        Returns the task (None when there was nothing to close)."""
        self._closed = True
        if not self._sessions:
            return None
        task = asyncio.ensure_future(self.aclose())
        _closing.add(task)
        task.add_done_callback(_closing.discard)
        return task

    async def aclose(self) -> None:
        """Close every session (the connection ended)."""
        self._closed = True
        if self._sessions:  # most connections never opened one
            await asyncio.gather(*(self._drop(k) for k in list(self._sessions)), return_exceptions=True)
