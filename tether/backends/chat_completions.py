"""The one Chat Completions adapter: any `/v1/chat/completions` server, shaped by its dialect.

`ChatCompletionsBackend` talks to one upstream over one `UpstreamPool` (`tether.backends.chat.http1`:
a minimal HTTP/1.1 client, keep-alive, `max_connections`): a streamed token is one network read,
and every create one request, and both cost less there than through an HTTP client library (the
module says how much; httpx, tried first, cost 3x the CPU per read of a bare asyncio reader). What differs between
servers (vLLM, SGLang, llama.cpp, llama-cpp-python, Ollama, LM Studio, Cerebras, OpenAI) is
declared in `tether.backends.chat.dialects` and chosen by the `dialect` option, or detected from
`GET {base_url}/models` when it is "auto". The kinds "openai" and "cerebras" are this class with
different defaults (`openai_compat.py`, `cerebras.py`).

A call has two steps: `prepare(request)` (before `response.created`) maps the request to the
upstream body and raises a 400 for what the server cannot do; `stream(request)` sends it,
retrying only failures that may pass on a second try and only before the first byte, and parses
the reply. The parts live in `tether.backends.chat` (mapping, SSE, stream parsing, errors).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import os
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import orjson

from tether import errors, offload
from tether.backends.base import (
    BackendError,
    BackendRequest,
    Chunk,
    Finish,
    ReasoningDelta,
    RefusalDelta,
    RunSink,
    TextDelta,
    ToolCallDelta,
    Usage,
    chunks_of,
)
from tether.backends.chat.dialects import Dialect, ModelCaps, detect, dialect_named, known_caps
from tether.backends.chat.http1 import HttpError, Response, UpstreamPool
from tether.backends.chat.mapping import (
    MappingOptions,
    emulated_custom_tools,
    forces_tool_call,
    to_chat_request,
)
from tether.backends.chat.sse import MAX_EVENT_BYTES, SSEDecoder
from tether.backends.chat.stream import StreamParser
from tether.backends.chat.upstream_errors import (
    error_from_status,
    parse_error_body,
    rate_limit_wait,
    retry_delay,
    should_retry,
)
from tether.errors import TetherError

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class ChatCompletionsConfig:
    base_url: str = ""
    api_key: str | None = None  # prefer api_key_env; a literal key is for tests and local servers
    api_key_env: str | None = None
    # A name from tether.backends.chat.dialects.DIALECTS, or "auto" (detected from GET /models).
    dialect: str = "auto"
    connect_timeout_s: float = 5.0  # the TCP (and TLS) connect
    pool_timeout_s: float = 10.0  # waiting for a free connection when all `max_connections` are busy
    # Sending the request. The response head must come within pool + connect + write + idle timeouts
    # of the call's start (so an upstream that stops reading the request cannot hold it either).
    write_timeout_s: float = 10.0
    # Longest silence tolerated from upstream while a stream waits for its next bytes (a JSON body
    # must come whole within it); past it the call fails with backend_timeout.
    stream_idle_timeout_s: float = 60.0
    # The largest SSE line or event (and one-piece JSON reply) taken from the upstream; past it
    # the call fails with backend_error (tether/backends/chat/sse.py).
    max_event_bytes: int = MAX_EVENT_BYTES
    max_retries: int = 2
    retry_initial_delay_s: float = 0.5
    retry_max_delay_s: float = 8.0
    max_connections: int = 100  # open connections to the upstream at most (streams beyond wait)
    keepalive_timeout_s: float = 15.0  # an idle kept-alive connection is closed after this long
    headers: dict[str, str] = field(default_factory=dict)  # extra request headers
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every request body
    developer_role: str = "system"
    # The output cap sent when a request sets none (servers that reserve the cap against rate
    # limits, like Cerebras, otherwise reserve the model's maximum). None: send no cap.
    default_max_output_tokens: int | None = None
    # False: ask for one JSON reply instead of a stream; the answer then arrives in one piece, with
    # the server's own usage even where its streams carry none (llama-cpp-python).
    stream_upstream: bool = True
    # Route the model ids the server lists (GET /models) to this backend and list them in /v1/models.
    discover_models: bool = True
    # What the upstream takes (the request mapping's options, `tether.backends.chat.mapping`).
    tools: bool = True
    parallel_tool_calls: bool = True
    reasoning: bool = False
    json_schema: bool = False
    images: bool = False
    hosted_tools: bool = False
    # Request bodies of at least this many bytes are sent gzip-compressed (`Content-Encoding:
    # gzip`, at `gzip_level`) to a server that takes it (Cerebras); 0 or None: never compressed.
    gzip_min_bytes: int | None = None
    gzip_level: int = 1
    # Connection warming (Cerebras: `/tcp_warming`): GET {base_url}{warm_path} at startup, so the
    # first call finds its TCP (and TLS) connection open, and again whenever the pool has sat
    # idle for 80% of keepalive_timeout_s, for up to warm_for_s after the last call (a user's next
    # turn then finds a warm connection too). "" or None: no warming.
    warm_path: str | None = None
    warm_for_s: float = 300.0
    # How long a model's capabilities (GET {base_url}/models/{id}, where the dialect has them)
    # are trusted before they are read again.
    model_info_refresh_s: float = 600.0
    # Tenant -> the environment variable holding that tenant's own upstream key: its calls go out
    # under it (on Cerebras another organisation: a prompt cache of its own).
    tenant_api_key_envs: dict[str, str] = field(default_factory=dict)
    # Only tenants with a key of their own (above) may use this backend: no two tenants ever share
    # an upstream account (nor its prompt cache). An open server's single tenant uses api_key.
    isolate_tenants: bool = False


RetryHook = Callable[[int, float, str], None]  # (retry number from 1, delay seconds, reason)


class ChatCompletionsBackend:
    """One configured Chat Completions upstream. Subclasses only change config defaults."""

    kind: ClassVar[str] = "chat_completions"
    Config: ClassVar[type[ChatCompletionsConfig]] = ChatCompletionsConfig
    require_api_key: ClassVar[bool] = False
    drain_timeout_s: ClassVar[float] = 1.0

    def __init__(self, name: str, config: ChatCompletionsConfig):
        self.name = name
        self.config = config
        if not config.base_url:
            raise ValueError(f"backend {name!r} ({self.kind}): base_url is required")
        if config.max_retries < 0:
            raise ValueError(f"backend {name!r}: max_retries must be >= 0")
        if config.max_connections < 1:
            raise ValueError(f"backend {name!r}: max_connections must be >= 1")
        if config.gzip_min_bytes is not None and config.gzip_min_bytes < 0:
            raise ValueError(f"backend {name!r}: gzip_min_bytes must be >= 0 (or unset)")
        if not 1 <= config.gzip_level <= 9:
            raise ValueError(f"backend {name!r}: gzip_level must be 1-9")
        # None until known: "auto" is resolved by the first `discover()` (GET /models).
        self.dialect: Dialect | None = None if config.dialect == "auto" else dialect_named(config.dialect)
        self.api_key = self._resolve_key()
        self._tenant_keys = {tenant: self._env_key(env) for tenant, env in config.tenant_api_key_envs.items()}
        self.base_url = config.base_url.rstrip("/")
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            "user-agent": "tether/0.1",
        }
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        headers.update({k.lower(): v for k, v in config.headers.items()})
        self._headers = headers
        self._proxy = _env_proxy(self.base_url)
        # Made on first use, inside the running loop (a session belongs to the loop it was made in).
        self._pool: UpstreamPool | None = None
        self._pool_loop: asyncio.AbstractEventLoop | None = None
        self._discovery = asyncio.Lock()
        self._owners: dict[str, str] = {}  # model id -> `owned_by` in the server's model list
        # Observability: retries made (total), an optional hook, the last x-ratelimit-* headers seen.
        self.retries = 0
        self.on_retry: RetryHook | None = None
        self.ratelimit: dict[str, str] = {}
        self.warmings = 0  # warming requests that reached the server
        # Model capabilities (`Dialect.model_info`): id -> (monotonic time read, caps).
        self._caps: dict[str, tuple[float, ModelCaps]] = {}
        self._caps_refreshing: set[asyncio.Task[None]] = set()
        # Warming: when the pool was last used, when the last call came, the keep-warm task.
        self._last_used = self._last_call = time.monotonic()
        self._called = asyncio.Event()
        self._warm_task: asyncio.Task[None] | None = None

    def _env_key(self, env: str) -> str:
        key = os.environ.get(env)
        if not key:
            raise ValueError(
                f"backend {self.name!r} ({self.kind}): environment variable {env} "
                "is not set (it must hold the upstream API key)"
            )
        return key

    def _resolve_key(self) -> str | None:
        c = self.config
        if c.api_key:
            return c.api_key
        if c.api_key_env:
            return self._env_key(c.api_key_env)
        if self.require_api_key:
            raise ValueError(f"backend {self.name!r} ({self.kind}): an API key is required (set api_key_env)")
        return None

    def _http(self) -> UpstreamPool:
        """The upstream's connection pool, made in the running loop on first use."""
        loop = asyncio.get_running_loop()
        if self._pool is None or self._pool_loop is not loop:
            c = self.config
            self._pool = UpstreamPool(
                self.base_url, max_connections=c.max_connections, keepalive_timeout_s=c.keepalive_timeout_s,
                connect_timeout_s=c.connect_timeout_s, pool_timeout_s=c.pool_timeout_s, proxy=self._proxy,
                headers=self._headers,
            )  # fmt: skip
            self._pool_loop = loop
        return self._pool

    async def _request(self, method: str, url: str, *, data: bytes = b"", headers: Mapping[str, str] | None = None) -> Response:
        """Send a request; the response once its head is in (read the body, then release it:
        `async with response`). Past the head deadline (see `write_timeout_s`): TimeoutError."""
        c = self.config
        if self.dialect is not None and self.dialect.headers:
            headers = {**dict(self.dialect.headers), **(headers or {})}
        async with asyncio.timeout(c.pool_timeout_s + c.connect_timeout_s + c.write_timeout_s + c.stream_idle_timeout_s):
            return await self._http().request(method, url, body=data, headers=headers)

    async def aclose(self) -> None:
        task, self._warm_task = self._warm_task, None
        for t in (task, *self._caps_refreshing):
            if t is not None:
                t.cancel()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()

    # -- models and dialect ---------------------------------------------------------------------

    async def list_models(self) -> list[str]:
        """Model ids from `GET {base_url}/models` (resolving an "auto" dialect on the way)."""
        try:
            resp = await self._request("GET", self.base_url + "/models", headers={"accept": "application/json"})
            async with resp:
                async with asyncio.timeout(self.config.stream_idle_timeout_s):
                    status, headers, content = resp.status, resp.headers, await resp.read()
        except TimeoutError as exc:
            raise BackendError(errors.BACKEND_TIMEOUT, f"upstream timed out: {type(exc).__name__}") from exc
        except HttpError as exc:
            raise BackendError(errors.BACKEND_ERROR, f"upstream unreachable: {type(exc).__name__}") from exc
        self._note_ratelimit(headers)
        if status >= 400:
            message, etype, code = parse_error_body(content)
            raise error_from_status(status, message, code, rate_limit_wait(headers), etype)
        try:
            listing = orjson.loads(content)
        except orjson.JSONDecodeError:
            raise BackendError(errors.BACKEND_ERROR, "upstream sent an invalid model list") from None
        if self.dialect is None:
            self.dialect = detect(listing) or dialect_named("openai")
            log.info("backend %s: dialect %s (detected)", self.name, self.dialect.name)
        data = listing.get("data") if isinstance(listing, dict) else None
        models = [m for m in data or () if isinstance(m, dict) and isinstance(m.get("id"), str)]
        self._owners = {m["id"]: m["owned_by"] for m in models if isinstance(m.get("owned_by"), str) and m["owned_by"]}
        return [m["id"] for m in models]

    async def discover(self) -> list[str]:
        """The model ids to route here ([] when `discover_models` is off or the server cannot
        say); never raises: an unreachable server leaves an "auto" dialect generic for now."""
        async with self._discovery:
            self._start_warming()
            try:
                ids = await self.list_models()
            except BackendError as exc:
                log.warning("backend %s: model list unavailable (%s)", self.name, exc.message)
                if self.dialect is None:
                    self.dialect = dialect_named("openai")
                return []
            if self.dialect is not None and self.dialect.model_info:
                await asyncio.gather(*(self._read_caps(m) for m in ids))
        return ids if self.config.discover_models else []

    # -- model capabilities ---------------------------------------------------------------------

    async def _read_caps(self, model: str) -> None:
        """Read `GET {base_url}/models/{id}` into the capability table; a failure keeps what was
        known (nothing at first: the dialect's family table then decides)."""
        url = f"{self.base_url}/models/{urllib.parse.quote(model, safe='')}"
        try:
            resp = await self._request("GET", url, headers={"accept": "application/json"})
            async with resp, asyncio.timeout(self.config.stream_idle_timeout_s):
                status, content = resp.status, await resp.read()
            self._note_used()
        except (TimeoutError, HttpError) as exc:
            log.info("backend %s: model info for %s unavailable (%s)", self.name, model, type(exc).__name__)
            return
        if status >= 400:
            log.info("backend %s: model info for %s unavailable (HTTP %d)", self.name, model, status)
            return
        try:
            caps = ModelCaps.from_model(orjson.loads(content))
        except orjson.JSONDecodeError:
            return
        self._caps[model] = (time.monotonic(), caps)

    async def model_caps(self, model: str) -> ModelCaps:
        """What the server reports about `model` (read on first use when discovery did not, and
        re-read in the background once older than `model_info_refresh_s`)."""
        if self.dialect is None or not self.dialect.model_info:
            return ModelCaps()
        known = self._caps.get(model)
        if known is None:
            await self._read_caps(model)
            known = self._caps.get(model)
            if known is None:
                self._caps[model] = known = (time.monotonic(), ModelCaps())  # until the next refresh
        elif time.monotonic() - known[0] > self.config.model_info_refresh_s and not self._caps_refreshing:
            task = asyncio.create_task(self._read_caps(model))
            self._caps_refreshing.add(task)
            task.add_done_callback(self._caps_refreshing.discard)
        return known[1]

    # -- warming --------------------------------------------------------------------------------

    async def warm(self) -> bool:
        """One `GET {base_url}{warm_path}` (at most `WARM_TIMEOUT_S`): a connection opened, or a
        kept-alive one refreshed, in the pool. True when the server answered."""
        path = self.config.warm_path
        if not path:
            return False
        try:
            async with asyncio.timeout(WARM_TIMEOUT_S):
                resp = await self._request("GET", self.base_url + path)
                async with resp:
                    await resp.read()
        except (TimeoutError, HttpError) as exc:
            log.debug("backend %s: warming failed (%s)", self.name, type(exc).__name__)
            return False
        self._note_used()
        self.warmings += 1
        return True

    def _note_used(self) -> None:
        self._last_used = time.monotonic()

    def _start_warming(self) -> None:
        if self.config.warm_path and self._warm_task is None:
            self._warm_task = asyncio.create_task(self._keep_warm())

    async def _keep_warm(self) -> None:
        """Warm now, then whenever the pool has been idle for 80% of `keepalive_timeout_s` (before
        the pool closes the idle connection), until `warm_for_s` have passed since the last call;
        then wait for the next call."""
        interval = 0.8 * self.config.keepalive_timeout_s
        await self.warm()
        while True:
            await asyncio.sleep(max(0.0, self._last_used + interval - time.monotonic()))
            now = time.monotonic()
            if now - self._last_used < interval:
                continue  # a call used the pool meanwhile
            if now - self._last_call > self.config.warm_for_s:
                self._called.clear()
                await self._called.wait()
                continue
            await self.warm()

    def owned_by(self, model: str) -> str:
        """As the server's model list says (GET /models at startup), else this backend's kind."""
        return self._owners.get(model) or self.kind

    def catch_all_models(self) -> list[str]:
        return []  # its names are the ones it lists (`discover`)

    def mapping_options(self, dialect: Dialect, caps: ModelCaps | None = None) -> MappingOptions:
        """The mapping's options: this backend's config, narrowed by what the model can do
        (`caps`: the server's word, else the dialect's family table; see `known_caps`)."""
        c = self.config
        caps = caps or ModelCaps()
        cap = c.default_max_output_tokens
        if cap and caps.max_completion_tokens:
            cap = min(cap, caps.max_completion_tokens)
        return MappingOptions(
            dialect=dialect,
            tools=c.tools,
            parallel_tool_calls=c.parallel_tool_calls,
            images=c.images and caps.vision is not False,
            hosted_tools=c.hosted_tools,
            reasoning=c.reasoning,
            json_schema=c.json_schema and caps.structured_outputs is not False,
            developer_role=c.developer_role,
            default_max_output_tokens=cap,
            stream=c.stream_upstream,
            extra_body=dict(c.extra_body),
            model=caps,
        )

    def reads_input_tokens(self, request: BackendRequest) -> bool:
        return False  # the upstream counts its own prompt; Tether's count is only for usage

    async def prepare(self, request: BackendRequest) -> None:
        if self.dialect is None:
            await self.discover()
        assert self.dialect is not None
        self._authorization(request.tenant)  # a tenant this backend may not serve: refused now
        caps = known_caps(self.dialect, request.model, await self.model_caps(request.model))
        request.prepared = to_chat_request(request, self.mapping_options(self.dialect, caps))

    # -- tenants --------------------------------------------------------------------------------

    def _authorization(self, tenant: str) -> str | None:
        """The `Authorization` header a call of `tenant` goes out with (None: the session's)."""
        key = self._tenant_keys.get(tenant)
        if key is not None:
            return f"Bearer {key}"
        if self.config.isolate_tenants and tenant:
            raise TetherError(
                errors.PERMISSION_DENIED,
                f"backend {self.name!r} keeps tenants apart (isolate_tenants) and has no upstream key "
                "for this API key's tenant (tenant_api_key_envs)",
                param="model",
            )
        return None

    def tenants_sharing_cache(self, tenants: Iterable[str]) -> list[str]:
        """Of `tenants`, those whose calls go out under the same upstream key where the server's
        prompt cache is shared by all calls of one key (`Dialect.shared_prompt_cache`): one can
        time another's cached prefixes. Empty when fewer than two share (or isolation is on)."""
        if self.config.isolate_tenants or self.dialect is None or not self.dialect.shared_prompt_cache:
            return []
        shared = sorted(t for t in tenants if t not in self._tenant_keys)
        return shared if len(shared) > 1 else []

    # -- the call -------------------------------------------------------------------------------

    def _note_ratelimit(self, headers: Mapping[str, str]) -> None:
        rl = {k.lower(): v for k, v in headers.items() if k.lower().startswith("x-ratelimit-")}
        if rl:
            self.ratelimit = rl

    def _count_retry(self, n: int, delay: float, reason: str) -> None:
        self.retries += 1
        log.info("backend %s: retry %d in %.3fs (%s)", self.name, n, delay, reason)
        if self.on_retry is not None:
            try:
                self.on_retry(n, delay, reason)
            except Exception:  # a metrics hook must never break a call
                log.exception("on_retry hook failed")

    def stream(self, request: BackendRequest) -> AsyncGenerator[Chunk, None]:
        return chunks_of(self.stream_runs(request))

    async def stream_runs(self, request: BackendRequest) -> AsyncGenerator[list[Chunk], None]:
        """One run per network read: the chunks of every SSE event it completed."""
        if request.prepared is None:
            await self.prepare(request)
        body: dict[str, Any] = request.prepared
        payload, sent_headers = await self._encode(body, request.tenant)
        url = self.base_url + "/chat/completions"
        c = self.config
        self._last_call = time.monotonic()
        self._called.set()
        attempt = 0
        while True:
            failure: BackendError
            headers: Mapping[str, str] = {}
            try:
                resp = await self._request("POST", url, data=payload, headers=sent_headers)
                async with resp:
                    self._note_ratelimit(resp.headers)
                    if resp.status < 400:
                        emulated = emulated_custom_tools(request.tools, self.dialect)  # type: ignore[arg-type]  # prepare() settled the dialect
                        try:
                            async with contextlib.aclosing(self._read(resp, forces_tool_call(body), emulated, request.sink)) as runs:
                                async for run in runs:
                                    yield run
                        finally:
                            self._note_used()
                        return
                    async with asyncio.timeout(c.stream_idle_timeout_s):
                        raw = await resp.read()
                    message, etype, code = parse_error_body(raw)
                    failure = error_from_status(resp.status, message, code, rate_limit_wait(resp.headers), etype)
                    headers = resp.headers
                    retry = should_retry(failure, resp.headers)
                    reason = f"HTTP {resp.status}"
            except TimeoutError as exc:  # connect, pool, or no response head within the idle timeout
                failure = BackendError(
                    errors.BACKEND_TIMEOUT,
                    f"upstream timed out before responding ({type(exc).__name__})",
                    retryable=True,
                )
                retry, reason = True, type(exc).__name__
            except HttpError as exc:
                failure = BackendError(
                    errors.BACKEND_ERROR,
                    f"upstream connection failed: {type(exc).__name__}",
                    retryable=True,
                )
                retry, reason = True, type(exc).__name__
            if not retry or attempt >= c.max_retries:
                raise failure
            delay = retry_delay(attempt, headers, initial=c.retry_initial_delay_s, maximum=c.retry_max_delay_s)
            attempt += 1
            self._count_retry(attempt, delay, reason)
            await asyncio.sleep(delay)

    async def _encode(self, body: dict[str, Any], tenant: str) -> tuple[bytes, dict[str, str]]:
        """The request body's bytes and the headers they need: gzip past `gzip_min_bytes` (off
        the event loop when large, `tether.offload`), the tenant's own key where it has one."""
        payload = orjson.dumps(body)
        headers: dict[str, str] = {}
        threshold = self.config.gzip_min_bytes
        if threshold and len(payload) >= threshold:
            payload = await offload.run(len(payload), gzip.compress, payload, self.config.gzip_level)
            headers["content-encoding"] = "gzip"
        authorization = self._authorization(tenant)
        if authorization is not None:
            headers["authorization"] = authorization
        return payload, headers

    async def _read(
        self, resp: Response, forced: bool, emulated: frozenset[str], sink: RunSink | None = None
    ) -> AsyncGenerator[list[Chunk], None]:
        """Parse one 2xx upstream response; every transport failure becomes a BackendError here
        (so the caller's retry handlers never see a mid-stream failure). `forced`: the request
        obliged a tool call, and an answer without one fails rather than passing as completed.
        `emulated`: the functions that stand for custom tools (their calls are custom calls).
        With a `sink`, the runs after the first are handed to it in the step that read them
        (`_Push`, `RunSink`)."""
        assert self.dialect is not None
        parser = StreamParser(self.dialect.reasoning_deltas, emulated)
        if resp.headers.get("content-type", "").startswith("application/json"):
            # One chat.completion object (stream_upstream = false, or the server ignored stream=true).
            try:
                async with asyncio.timeout(self.config.stream_idle_timeout_s):
                    raw = await _read_at_most(resp, self.config.max_event_bytes)
            except TimeoutError as exc:
                raise BackendError(errors.BACKEND_TIMEOUT, "upstream stalled") from exc
            except HttpError as exc:
                raise BackendError(errors.BACKEND_ERROR, f"upstream connection broke: {type(exc).__name__}") from exc
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise BackendError(errors.BACKEND_ERROR, "upstream sent invalid JSON") from None
            if not isinstance(obj, dict) or obj.get("error"):
                raise StreamParser.stream_error(obj if isinstance(obj, dict) else {"error": str(obj)})
            run = parser.chunk(obj) + parser.calls_done()
            run.append(await self._finish(parser, forced, []))
            yield run
            return
        decoder = SSEDecoder(self.config.max_event_bytes)
        generated: list[str] = []  # for a count with the model's tokenizer when the stream has none
        seen = 0

        def parse(events: Iterable[tuple[str | None, bytes]]) -> tuple[list[Chunk], BackendError | None]:
            nonlocal seen
            run, failure = self._parse(events, parser, generated)
            seen += len(run)
            return run, failure

        def feed(data: bytes) -> tuple[list[Chunk], BackendError | None]:
            return parse(decoder.feed(data))

        watch = _IdleWatch(resp, self.config.stream_idle_timeout_s)
        stalled = BackendError(
            errors.BACKEND_TIMEOUT, f"upstream stream stalled: no data for {self.config.stream_idle_timeout_s:g}s"
        )
        push = _Push(resp, feed, parser, sink, watch) if sink is not None else None
        try:
            while not parser.done:
                data = resp.read_nowait()
                if data is None:  # the body ended
                    if watch.fired:
                        raise stalled
                    run, failure = parse(decoder.flush())
                    if run:
                        yield run
                    if failure is not None:
                        raise failure
                    break
                if data:
                    watch.since = None  # not waiting on the upstream while this read is handled
                    run, failure = feed(data)
                    if run:
                        yield run
                    if failure is not None:
                        raise failure
                    watch.since = watch.now()
                elif push is None or not seen:  # the first run is always yielded (`RunSink`)
                    await resp.wait()
                else:
                    await push.until_woken()
                    if push.wake:  # the sink's owner must run: it has what was pushed
                        push.wake = False
                        yield []
                    if push.failure is not None:
                        raise push.failure
        except HttpError as exc:
            if watch.fired:
                raise stalled from exc
            raise BackendError(
                errors.BACKEND_ERROR, f"upstream connection broke mid-stream: {type(exc).__name__}"
            ) from exc
        finally:
            watch.cancel()
        if not parser.done:
            where = "after partial output" if seen else "before any output (its log says why)"
            raise BackendError(errors.BACKEND_ERROR, f"upstream stream ended without [DONE], {where}")
        run = parser.calls_done()
        for chunk in run:
            _note_generated(chunk, generated)
        run.append(await self._finish(parser, forced, generated))
        yield run
        # Read to the end of the body so the connection goes back to the pool (normally instant).
        try:
            async with asyncio.timeout(self.drain_timeout_s):
                async for _ in resp:
                    pass
        except (TimeoutError, HttpError):
            pass

    @staticmethod
    def _parse(
        events: Iterable[tuple[str | None, bytes]], parser: StreamParser, generated: list[str]
    ) -> tuple[list[Chunk], BackendError | None]:
        """The chunks of the SSE events one read completed, up to `[DONE]`, and the error an event
        carried (raised after the chunks before it went out)."""
        run: list[Chunk] = []
        for event, payload in events:
            try:
                chunks = parser.feed(event, payload)
            except BackendError as exc:
                return run, exc
            for chunk in chunks:
                _note_generated(chunk, generated)
            run += chunks
            if parser.done:
                break
        return run, None

    async def _finish(self, parser: StreamParser, forced: bool, generated: list[str]) -> Finish:
        finish = parser.finish()
        if forced and not parser.calls:
            raise BackendError(
                errors.BACKEND_ERROR,
                "the model answered without the tool call that tool_choice required "
                f"(the {self.dialect.server if self.dialect else 'upstream'} server did not enforce it)",
            )
        usage = finish.usage or Usage()
        if usage.output_tokens is None and generated:
            counted = await self._count_with_model_tokenizer("".join(generated))
            if counted is not None:
                usage = replace(usage, output_tokens=counted, model_counted=usage.model_counted | {"output"})
                finish = replace(finish, usage=usage)
        return finish

    async def _count_with_model_tokenizer(self, text: str) -> int | None:
        """Tokens of `text` by the server's own tokenizer (the dialect's endpoint), None without one
        or when it fails (the turn then counts with Tether's tokenizer)."""
        path = self.dialect.tokenize_path if self.dialect else None
        if not path:
            return None
        root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        try:
            resp = await self._request(
                "POST", root + path, data=orjson.dumps({"input": text}), headers={"accept": "application/json"}
            )
            async with resp, asyncio.timeout(self.config.stream_idle_timeout_s):
                count = orjson.loads(await resp.read()).get("count") if resp.status == 200 else None
        except (HttpError, TimeoutError, ValueError, AttributeError):
            count = None
        return count if isinstance(count, int) and count >= 0 else None


async def _read_at_most(resp: Response, limit: int) -> bytes:
    """The whole body of `resp`, or BackendError once it passes `limit` bytes."""
    parts, size = [], 0
    async for data in resp:
        size += len(data)
        if size > limit:
            raise BackendError(errors.BACKEND_ERROR, f"upstream sent a reply over {limit} bytes (max_event_bytes)")
        parts.append(data)
    return b"".join(parts)


class _Push:
    """A streamed response's runs handed to a `RunSink` in the step that read them: while the
    reader waits (`until_woken`), each network read is decoded, parsed and taken in the
    upstream connection's `data_received` (no future, no switch to the turn's task: the token's
    one pass of the event loop). The wait ends when the sink asks for its owner's task (`wake`),
    a read fails to parse (`failure`), the stream says `[DONE]`, or the body ends or breaks (the
    reader then finds that with `read_nowait`)."""

    __slots__ = ("_resp", "_feed", "_parser", "_sink", "_watch", "_woken", "wake", "failure")

    def __init__(self, resp: Response, feed: Callable[[bytes], tuple[list[Chunk], BackendError | None]],
                 parser: StreamParser, sink: RunSink, watch: _IdleWatch) -> None:  # fmt: skip
        self._resp = resp
        self._feed = feed  # one read -> its chunks (decoded by `parser`)
        self._parser = parser
        self._sink = sink
        self._watch = watch
        self._woken: asyncio.Future[None] | None = None
        self.wake = False
        self.failure: BaseException | None = None

    async def until_woken(self) -> None:
        self._woken = woken = asyncio.get_running_loop().create_future()
        self._resp.listen(self._on_data)
        try:
            await woken
        finally:
            self._resp.listen(None)
            self._woken = None

    def _stop(self) -> None:
        woken = self._woken
        if woken is not None and not woken.done():
            woken.set_result(None)

    def _on_data(self) -> None:
        if self._woken is None or self._woken.done():
            return
        watch = self._watch
        handled = False
        while True:
            try:
                data = self._resp.read_nowait()
            except HttpError:  # the reader meets it again, where failures are handled
                self._stop()
                return
            if data is None:  # the body ended (perhaps with the bytes just handled)
                self._stop()
                return
            if not data:
                break
            handled, watch.since = True, None
            try:
                run, failure = self._feed(data)
            except Exception as exc:  # noqa: BLE001 - a line over max_event_bytes: raised by the reader
                self.failure = exc
                self._stop()
                return
            if run and not self._sink.take(run):
                self.wake = True
            if failure is not None:
                self.failure = failure
            if self.wake or failure is not None or self._parser.done:
                self._stop()
                return
        if handled:
            watch.since = watch.now()


WARM_TIMEOUT_S = 1.0  # a warming request's limit (the SDK's): it must never hold anything up


class _IdleWatch:
    """The stream's idle timeout: one timer per stream, where a read timeout would arm and cancel
    one per read, ~6% of the CPU of a token streamed from a paced upstream.
    `since` is when the stream began waiting for bytes (None while a read is being handled: a
    consumer that is slow to take a run is not an idle upstream). When the upstream has been silent
    for `idle` seconds the response is closed, which ends the pending read; `fired` says why."""

    __slots__ = ("_loop", "_idle", "_resp", "_handle", "since", "fired", "now")

    def __init__(self, resp: Response, idle: float) -> None:
        self._loop = loop = asyncio.get_running_loop()
        self._idle = idle
        self._resp = resp
        self.now = loop.time
        self.since: float | None = loop.time()
        self.fired = False
        self._handle = loop.call_at(self.since + idle, self._check)

    def _check(self) -> None:
        since = self.since
        now = self._loop.time()
        if since is None or now < since + self._idle:
            self._handle = self._loop.call_at((since if since is not None else now) + self._idle, self._check)
            return
        self.fired = True
        self._resp.close()

    def cancel(self) -> None:
        self._handle.cancel()


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (HTTP(S)_PROXY / ALL_PROXY, minus NO_PROXY), as
    httpx and requests read them; None for none."""
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or urllib.request.proxy_bypass(parts.hostname):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(parts.scheme) or proxies.get("all") or None


_GENERATED_TEXT = (TextDelta, ReasoningDelta, RefusalDelta)  # the chunks whose `text` the model generated


def _note_generated(chunk: Chunk, generated: list[str]) -> None:
    if isinstance(chunk, _GENERATED_TEXT):
        generated.append(chunk.text)
    elif isinstance(chunk, ToolCallDelta):
        generated.append((chunk.name or "") + chunk.arguments)
