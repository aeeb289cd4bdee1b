"""One initialised MCP session with one remote server, over streamable HTTP (the `mcp` SDK), or
the older HTTP+SSE transport for a server that only speaks that.

`McpServerSession.open()` connects and initialises (within `connect_timeout_s`); `list_tools()`
and `call_tool()` then run on that session, each within its own timeout, from any task. The SDK's
transport lives in a task of its own (its anyio scopes must be entered and left by one task), so a
session outlives the turn that opened it: a connection keeps it for its life (`McpSessions`).

What can go wrong never raises past this module as anything but `McpFailure`, whose `error` is the
`mcp_call.error` object of the API (`mcp_protocol_error` with a JSON-RPC code, or `http_error`
with an HTTP status); a tool that reports an error is a `CallResult` with `error` set
(`mcp_tool_execution_error`). Headers and the authorization token go into the HTTP client and
nowhere else: no log line, exception message or trace attribute carries them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import orjson

from tether.config import McpConfig
from tether.extras import require
from tether.mcp.policy import AddressRefused, McpPolicy

log = logging.getLogger("tether.mcp")

# JSON-RPC codes of failures that are Tether's, not the server's (the implementation-defined range).
TIMEOUT = -32001
REFUSED = -32002
TOO_LARGE = -32003
UNREACHABLE = -32004


class McpFailure(Exception):
    """A failed MCP exchange; `error` is the API's error object for the `mcp_call` item."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", ""))
        self.error = error

    @property
    def message(self) -> str:
        return str(self.error.get("message") or self.error.get("type"))


class SessionGone(McpFailure):
    """The server no longer knows this session (it restarted, or expired the session: HTTP 404,
    "Session not found"), or the session's transport broke: open a new one and try again."""


def protocol_error(code: int, message: str) -> McpFailure:
    return McpFailure({"type": "mcp_protocol_error", "code": code, "message": message})


@dataclass(frozen=True)
class ToolInfo:
    name: str
    description: str | None
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None

    @property
    def read_only(self) -> bool:
        return bool(self.annotations and self.annotations.get("readOnlyHint"))


@dataclass(frozen=True)
class CallResult:
    output: str | None  # the result text (the content blocks' text, or their JSON)
    error: dict[str, Any] | None  # `mcp_tool_execution_error` when the tool reported one


def _guarded_transport(policy: McpPolicy) -> Any:
    """An httpx2 transport that checks every request's URL and resolved addresses first."""
    httpx2 = require("httpx2", "mcp")

    class GuardedTransport(httpx2.AsyncHTTPTransport):  # type: ignore[name-defined]  # the optional package's class, imported at call time
        async def handle_async_request(self, request: Any) -> Any:
            try:
                await policy.check_addresses(str(request.url))
            except AddressRefused as exc:
                raise httpx2.ConnectError(f"refused by Tether's MCP policy: {exc}", request=request) from None
            return await super().handle_async_request(request)

    return GuardedTransport()


def _failure(exc: BaseException) -> McpFailure:
    """What an exception from the SDK or httpx2 means as an `mcp_call` error (no headers in it)."""
    if isinstance(exc, McpFailure):
        return exc
    httpx2 = require("httpx2", "mcp")
    mcp = require("mcp", "mcp")
    if isinstance(exc, BaseExceptionGroup):  # anyio task groups wrap what went wrong
        return _failure(exc.exceptions[0])
    if isinstance(exc, httpx2.HTTPStatusError):
        return McpFailure({"type": "http_error", "code": exc.response.status_code,
                           "message": f"the MCP server answered HTTP {exc.response.status_code}"})  # fmt: skip
    if isinstance(exc, httpx2.ConnectError) and "refused by Tether's MCP policy" in str(exc):
        return protocol_error(REFUSED, str(exc))
    if isinstance(exc, httpx2.HTTPError):
        return protocol_error(UNREACHABLE, f"cannot reach the MCP server: {type(exc).__name__}")
    if isinstance(exc, mcp.MCPError):
        return protocol_error(exc.error.code, exc.error.message)
    return protocol_error(UNREACHABLE, f"the MCP exchange failed: {type(exc).__name__}")


class McpServerSession:
    """One server's initialised session (see the module docstring)."""

    def __init__(self, url: str, headers: dict[str, str], policy: McpPolicy, config: McpConfig) -> None:
        self.url = url
        self._headers = headers  # credentials: used for the HTTP client only
        self.policy = policy
        self.config = config
        self.tools: list[ToolInfo] | None = None  # the last listing, once listed
        self.transport = "streamable_http"  # or "sse": a server that only speaks the older transport
        self._session: Any = None
        self._task: asyncio.Task | None = None
        self._closing = asyncio.Event()
        self._broken: McpFailure | None = None

    @property
    def alive(self) -> bool:
        return (self._session is not None and self._task is not None and not self._task.done()
                and not self._closing.is_set())  # fmt: skip

    async def open(self) -> None:
        """Connect and initialise over streamable HTTP; a server that refuses that (an error to the
        initialize POST: a 4xx from a server that only speaks the older HTTP+SSE transport) is
        tried once over SSE, as the MCP specification's backwards compatibility says. Raises
        McpFailure (a refused address, a timeout, an error), the streamable HTTP one when both fail."""
        try:
            await self._open("streamable_http")
        except McpFailure as exc:
            if exc.error.get("type") != "mcp_protocol_error" or exc.error.get("code") in (TIMEOUT, REFUSED, UNREACHABLE):
                raise
            try:
                await self._open("sse")
            except McpFailure:
                raise exc from None

    async def _open(self, transport: str) -> None:
        self.transport = transport
        self._closing = asyncio.Event()
        self._broken = None
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(ready), name="tether-mcp-session")
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.config.connect_timeout_s)
        except TimeoutError:
            await self.aclose()
            raise protocol_error(
                TIMEOUT, f"the MCP server did not initialise within {self.config.connect_timeout_s:g} s "
                "(mcp.connect_timeout_s)"
            ) from None
        except McpFailure:
            await self.aclose()
            raise

    def _streams(self, http: Any) -> Any:
        """The SDK transport of `self.transport`, its requests through the guarded client."""
        cfg = self.config
        if self.transport == "sse":
            sse_mod = require("mcp.client.sse", "mcp")

            def factory(headers: Any = None, timeout: Any = None, auth: Any = None) -> Any:
                return require("httpx2", "mcp").AsyncClient(transport=_guarded_transport(self.policy), headers=headers,
                                                            timeout=timeout, auth=auth)  # fmt: skip

            return sse_mod.sse_client(self.url, headers=self._headers, timeout=cfg.connect_timeout_s,
                                      sse_read_timeout=max(cfg.call_timeout_s, cfg.list_timeout_s) + 5,
                                      httpx_client_factory=factory)  # fmt: skip
        http_mod = require("mcp.client.streamable_http", "mcp")
        # An SSE event may carry a result escaped up to 6x (a \uXXXX per byte) plus its envelope;
        # past that the SDK stops reading (a result never sits in memory whole beyond the cap).
        return http_mod.streamable_http_client(self.url, http_client=http,
                                               max_sse_event_size=6 * cfg.max_result_bytes + 65536)  # fmt: skip

    async def _run(self, ready: asyncio.Future) -> None:
        httpx2 = require("httpx2", "mcp")
        session_mod = require("mcp.client.session", "mcp")
        cfg = self.config
        timeout = httpx2.Timeout(cfg.connect_timeout_s, read=max(cfg.call_timeout_s, cfg.list_timeout_s) + 5)
        try:
            async with (
                httpx2.AsyncClient(transport=_guarded_transport(self.policy), headers=self._headers,
                                   timeout=timeout) as http,  # fmt: skip
                self._streams(http) as streams,
                session_mod.ClientSession(streams[0], streams[1]) as session,
            ):
                await session.initialize()
                self._session = session
                if not ready.done():
                    ready.set_result(None)
                await self._closing.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.set_exception(protocol_error(UNREACHABLE, "the MCP session was closed"))
            raise
        except BaseException as exc:  # noqa: BLE001 - whatever broke the transport breaks this session
            failure = _failure(exc)
            self._broken = failure
            log.info("MCP session ended: %s", failure.message)
            if not ready.done():
                ready.set_exception(failure)
        finally:
            self._session = None

    async def _request(self, coro: Any, timeout: float, what: str, setting: str) -> Any:
        if not self.alive:
            coro.close()
            raise self._broken or protocol_error(UNREACHABLE, "the MCP session is closed")
        try:
            return await asyncio.wait_for(coro, timeout)
        except TimeoutError:
            raise protocol_error(TIMEOUT, f"{what} did not answer within {timeout:g} s ({setting})") from None
        except McpFailure:
            raise
        except Exception as exc:  # noqa: BLE001
            failure = _failure(exc)
            gone = "session not found" in failure.message.lower() or failure.error.get("code") in (404, UNREACHABLE)
            if gone or not self.alive:
                self._broken = failure
                self._closing.set()  # the pool opens a new session on next use
                raise SessionGone(failure.error) from None
            raise failure from None

    async def list_tools(self) -> list[ToolInfo]:
        """Every tool the server offers (all pages), at most `max_tools_per_server`."""
        cfg = self.config
        tools: list[ToolInfo] = []
        cursor = None
        while True:
            page = await self._request(self._session_list(cursor), cfg.list_timeout_s, "tools/list",
                                       "mcp.list_timeout_s")  # fmt: skip
            for t in page.tools:
                annotations = t.annotations.model_dump(exclude_none=True, by_alias=True) if t.annotations else None
                tools.append(ToolInfo(t.name, t.description, dict(t.input_schema or {}), annotations or None))
            if len(tools) > cfg.max_tools_per_server:
                raise protocol_error(TOO_LARGE, f"the MCP server offers more than {cfg.max_tools_per_server} tools "
                                                "(mcp.max_tools_per_server)")  # fmt: skip
            cursor = page.next_cursor
            if not cursor:
                break
        self.tools = tools
        return tools

    def _session_list(self, cursor: str | None) -> Any:
        if cursor is None:
            return self._session.list_tools()
        types = require("mcp.types", "mcp")
        return self._session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallResult:
        cfg = self.config
        try:
            result = await self._request(self._session.call_tool(name, arguments), cfg.call_timeout_s,
                                         f"the MCP tool {name!r}", "mcp.call_timeout_s")  # fmt: skip
        except McpFailure as exc:
            if "byte limit" in exc.message:  # the SDK's SSE event cap (set from max_result_bytes above)
                raise protocol_error(TOO_LARGE, f"the MCP tool's result is over {cfg.max_result_bytes} bytes "
                                                "(mcp.max_result_bytes)") from None  # fmt: skip
            raise
        blocks = [block.model_dump(exclude_none=True, by_alias=True) for block in result.content]
        texts = [b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str)]
        text = "\n".join(texts) if len(texts) == len(blocks) else orjson.dumps(blocks).decode()
        size = len(text.encode())
        if size > cfg.max_result_bytes:
            raise protocol_error(TOO_LARGE, f"the MCP tool's result of {size} bytes is over {cfg.max_result_bytes} "
                                            "bytes (mcp.max_result_bytes)")  # fmt: skip
        if result.is_error:
            return CallResult(None, {"type": "mcp_tool_execution_error", "content": blocks})
        return CallResult(text, None)

    async def aclose(self) -> None:
        self._closing.set()
        task = self._task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), 2.0)
            except (TimeoutError, Exception):  # noqa: BLE001 - a server that will not say goodbye
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
