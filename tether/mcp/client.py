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

# The MCP SDK and its HTTP client log request URLs (httpx2 at INFO, the SDK at INFO and DEBUG) and
# a server URL's path can carry a key (`/s/<key>/mcp`): their logging is off. Tether's own
# `tether.mcp` lines say what failed without a URL.
for _name in ("httpx2", "httpcore2", "mcp"):
    logging.getLogger(_name).setLevel(logging.CRITICAL + 1)

# What a server sends beyond the result text itself: the JSON-RPC envelope of a call's answer.
ENVELOPE_BYTES = 65536

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
    schema_bytes: int = 0  # the input schema as JSON

    @property
    def read_only(self) -> bool:
        return bool(self.annotations and self.annotations.get("readOnlyHint"))


@dataclass(frozen=True)
class CallResult:
    output: str | None  # the result text (the content blocks' text, or their JSON)
    error: dict[str, Any] | None  # `mcp_tool_execution_error` when the tool reported one


def preload() -> None:
    """Import the MCP SDK now (a server with `[mcp]` on calls this at startup): its import takes
    about a second (more on a busy machine), which the first MCP create would otherwise spend on
    the event loop, stalling every other tenant."""
    for module in ("httpx2", "mcp", "mcp.types", "mcp.client.session", "mcp.client.sse", "mcp.client.streamable_http"):
        require(module, "mcp")


def answer_limit(config: McpConfig, body: bytes) -> tuple[int, str]:
    """The most bytes the answer to a request with JSON-RPC `body` may have, and the setting."""
    method = None
    if body:
        try:
            message = orjson.loads(body)
            method = message.get("method") if isinstance(message, dict) else None
        except orjson.JSONDecodeError:
            pass
    if method == "tools/call":
        return config.max_result_bytes + ENVELOPE_BYTES, "mcp.max_result_bytes"
    return config.max_list_bytes + ENVELOPE_BYTES, "mcp.max_list_bytes"


def _guarded_transport(policy: McpPolicy, config: McpConfig | None = None) -> Any:
    """An httpx2 transport that checks every request's URL and resolved addresses first, asks for
    answers uncompressed (a compressed answer could inflate past any bound) and reads a JSON
    answer only up to its bound (`answer_limit`): past it, reading stops with AnswerTooLarge
    (which the SDK turns into that request's error; the session stays usable). An SSE answer is
    bounded per event by the SDK (`max_sse_event_size`); an SSE stream of the older transport,
    which the SDK does not bound, is bounded per event here."""
    httpx2 = require("httpx2", "mcp")
    cfg = config or policy.config

    class AnswerTooLarge(httpx2.StreamError):  # type: ignore[name-defined]  # the optional package's class, imported at call time
        pass

    class Capped(httpx2.AsyncByteStream):  # type: ignore[name-defined]  # the optional package's class, imported at call time
        def __init__(self, inner: Any, limit: int, setting: str, per_event: bool) -> None:
            self.inner, self.limit, self.setting, self.per_event = inner, limit, setting, per_event

        async def __aiter__(self) -> Any:
            seen, tail = 0, b""
            async for chunk in self.inner:
                if self.per_event:  # bytes since the last blank line (an event's end)
                    joined = tail + chunk
                    end = max(joined.rfind(b"\n\n"), joined.rfind(b"\n\r\n"))
                    seen = len(joined) - end if end >= 0 else seen + len(chunk)
                    tail = joined[-2:]
                else:
                    seen += len(chunk)
                if seen > self.limit:
                    raise AnswerTooLarge(f"{TOO_LARGE_MARK} {self.limit} bytes ({self.setting})")
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    class GuardedTransport(httpx2.AsyncHTTPTransport):  # type: ignore[name-defined]  # the optional package's class, imported at call time
        async def handle_async_request(self, request: Any) -> Any:
            try:
                await policy.check_addresses(str(request.url))
            except AddressRefused as exc:
                raise httpx2.ConnectError(f"refused by Tether's MCP policy: {exc}", request=request) from None
            request.headers["Accept-Encoding"] = "identity"
            response = await super().handle_async_request(request)
            if response.headers.get("content-encoding", "identity").lower() != "identity":
                await response.aclose()
                raise httpx2.DecodingError("the MCP server sent a compressed answer, which Tether did not ask for",
                                           request=request)  # fmt: skip
            content_type = response.headers.get("content-type", "").lower()
            sse = content_type.startswith("text/event-stream")
            if sse and request.method == "POST":
                return response  # the SDK bounds each event (max_sse_event_size)
            if sse:
                limit, setting = max(cfg.max_list_bytes, cfg.max_result_bytes) + ENVELOPE_BYTES, "mcp.max_result_bytes"
            else:
                limit, setting = answer_limit(cfg, request.content if request.method == "POST" else b"")
            return httpx2.Response(response.status_code, headers=response.headers, request=request,
                                   stream=Capped(response.stream, limit, setting, sse), extensions=response.extensions)  # fmt: skip

    return GuardedTransport()


TOO_LARGE_MARK = "the MCP server's answer is over"


def bounded(text: str, limit: int) -> str:
    """`text` cut to at most `limit` bytes of UTF-8 (a server's error message), saying so."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[:limit].decode(errors="ignore") + f"... [cut at {limit} bytes: mcp.max_error_bytes]"


def _failure(exc: BaseException, max_error_bytes: int) -> McpFailure:
    """What an exception from the SDK or httpx2 means as an `mcp_call` error (no headers in it;
    a server's message cut to `max_error_bytes`)."""
    if isinstance(exc, McpFailure):
        return exc
    httpx2 = require("httpx2", "mcp")
    mcp = require("mcp", "mcp")
    if isinstance(exc, BaseExceptionGroup):  # anyio task groups wrap what went wrong
        return _failure(exc.exceptions[0], max_error_bytes)
    text = str(exc) if isinstance(exc, httpx2.StreamError | mcp.MCPError) else ""
    if TOO_LARGE_MARK in text:  # a bounded answer (the SDK wraps the stream's error in its own)
        return protocol_error(TOO_LARGE, bounded(text[text.index(TOO_LARGE_MARK) :], max_error_bytes))
    if isinstance(exc, httpx2.HTTPStatusError):
        return McpFailure({"type": "http_error", "code": exc.response.status_code,
                           "message": f"the MCP server answered HTTP {exc.response.status_code}"})  # fmt: skip
    if isinstance(exc, httpx2.ConnectError) and "refused by Tether's MCP policy" in str(exc):
        return protocol_error(REFUSED, str(exc))
    if isinstance(exc, httpx2.HTTPError):
        return protocol_error(UNREACHABLE, f"cannot reach the MCP server: {type(exc).__name__}")
    if isinstance(exc, mcp.MCPError):
        return protocol_error(exc.error.code, bounded(exc.error.message, max_error_bytes))
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
                return require("httpx2", "mcp").AsyncClient(transport=_guarded_transport(self.policy, cfg), headers=headers,
                                                            timeout=timeout, auth=auth)  # fmt: skip

            return sse_mod.sse_client(self.url, headers=self._headers, timeout=cfg.connect_timeout_s,
                                      sse_read_timeout=max(cfg.call_timeout_s, cfg.list_timeout_s) + 5,
                                      httpx_client_factory=factory)  # fmt: skip
        http_mod = require("mcp.client.streamable_http", "mcp")
        # An SSE event carries one answer: a listing page or a call's result with its envelope;
        # past that the SDK stops reading (an answer never sits in memory whole beyond its bound).
        event = max(cfg.max_list_bytes, cfg.max_result_bytes) + ENVELOPE_BYTES
        return http_mod.streamable_http_client(self.url, http_client=http, max_sse_event_size=event)

    async def _run(self, ready: asyncio.Future) -> None:
        httpx2 = require("httpx2", "mcp")
        session_mod = require("mcp.client.session", "mcp")
        cfg = self.config
        timeout = httpx2.Timeout(cfg.connect_timeout_s, read=max(cfg.call_timeout_s, cfg.list_timeout_s) + 5)
        try:
            async with (
                httpx2.AsyncClient(transport=_guarded_transport(self.policy, cfg), headers=self._headers,
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
            failure = _failure(exc, cfg.max_error_bytes)
            self._broken = failure
            log.info("MCP session ended: %s", failure.message)
            if not ready.done():
                ready.set_exception(failure)
        finally:
            self._session = None

    async def _request(self, coro: Any, timeout: float, what: str, setting: str, whole: float | None = None) -> Any:
        """`coro` within `timeout` (what is left of `whole`, when the setting bounds several)."""
        if not self.alive:
            coro.close()
            raise self._broken or protocol_error(UNREACHABLE, "the MCP session is closed")
        try:
            return await asyncio.wait_for(coro, timeout)
        except TimeoutError:
            raise protocol_error(TIMEOUT, f"{what} did not answer within {whole or timeout:g} s ({setting})") from None
        except McpFailure:
            raise
        except Exception as exc:  # noqa: BLE001
            failure = _failure(exc, self.config.max_error_bytes)
            gone = "session not found" in failure.message.lower() or failure.error.get("code") in (404, UNREACHABLE)
            if gone or not self.alive:
                self._broken = failure
                self._closing.set()  # the pool opens a new session on next use
                raise SessionGone(failure.error) from None
            raise failure from None

    async def list_tools(self) -> list[ToolInfo]:
        """Every tool the server offers (all pages), within one deadline (`list_timeout_s`) for
        the whole listing, at most `max_list_pages` pages, `max_tools_per_server` tools and
        `max_list_bytes` bytes (names, descriptions, schemas), each tool's description and schema
        within their bounds: past any of them the listing fails (McpFailure naming the setting)."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        deadline = loop.time() + cfg.list_timeout_s
        tools: list[ToolInfo] = []
        cursor = None
        pages = total = 0
        while True:
            pages += 1
            if pages > cfg.max_list_pages:
                raise protocol_error(TOO_LARGE, f"the MCP server's listing has more than {cfg.max_list_pages} pages "
                                                "(mcp.max_list_pages)")  # fmt: skip
            left = deadline - loop.time()
            if left <= 0:
                raise protocol_error(TIMEOUT, f"tools/list did not end within {cfg.list_timeout_s:g} s "
                                              "(mcp.list_timeout_s)")  # fmt: skip
            try:
                page = await self._request(self._session_list(cursor), left, "tools/list", "mcp.list_timeout_s",
                                           whole=cfg.list_timeout_s)  # fmt: skip
            except McpFailure as exc:
                if "byte limit" in exc.message:  # the SDK's SSE event cap (set from the bounds above)
                    raise protocol_error(TOO_LARGE, f"a tools/list answer is over {cfg.max_list_bytes} bytes "
                                                    "(mcp.max_list_bytes)") from None  # fmt: skip
                raise
            for t in page.tools:
                info = self._tool_info(t)
                total += len(info.name.encode()) + len((info.description or "").encode()) + info.schema_bytes
                if total > cfg.max_list_bytes:
                    raise protocol_error(TOO_LARGE, f"the MCP server's listing is over {cfg.max_list_bytes} bytes "
                                                    "(mcp.max_list_bytes)")  # fmt: skip
                tools.append(info)
            if len(tools) > cfg.max_tools_per_server:
                raise protocol_error(TOO_LARGE, f"the MCP server offers more than {cfg.max_tools_per_server} tools "
                                                "(mcp.max_tools_per_server)")  # fmt: skip
            cursor = page.next_cursor
            if not cursor:
                break
        self.tools = tools
        return tools

    def _tool_info(self, t: Any) -> ToolInfo:
        """One listed tool, its description and schema checked against their bounds."""
        cfg = self.config
        name = t.name if len(t.name) <= 64 else t.name[:64] + "..."
        size = len((t.description or "").encode())
        if size > cfg.max_tool_description_bytes:
            raise protocol_error(TOO_LARGE, f"the MCP tool {name!r} has a description of {size} bytes, over "
                                            f"{cfg.max_tool_description_bytes} (mcp.max_tool_description_bytes)")  # fmt: skip
        schema = dict(t.input_schema or {})
        schema_bytes = len(orjson.dumps(schema))
        if schema_bytes > cfg.max_tool_schema_bytes:
            raise protocol_error(TOO_LARGE, f"the MCP tool {name!r} has an input schema of {schema_bytes} bytes, over "
                                            f"{cfg.max_tool_schema_bytes} (mcp.max_tool_schema_bytes)")  # fmt: skip
        annotations = t.annotations.model_dump(exclude_none=True, by_alias=True) if t.annotations else None
        return ToolInfo(t.name, t.description, schema, annotations or None, schema_bytes)

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
            if "byte limit" in exc.message or TOO_LARGE_MARK in exc.message:  # the SSE event cap, or the JSON one
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
