"""Configuration: typed dataclasses, loaded from a TOML file, then TETHER_* env vars, then flags.

Everything has an embedded default, so `tether serve` runs with no file and no network: the
simulated backend answers every model name. Every limit the server enforces lives in `Limits`
(one table; README "Limits" documents it).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether import eventloop
from tether.logging_setup import FORMATS as LOG_FORMATS
from tether.process_memory import ALLOCATORS
from tether.prompts import PromptLibrary

# `server.replica_id`: it goes into an HTTP header and into nginx's configuration.
# How long a stopping server may take beyond `server.shutdown_grace_s` (its store writes flushing,
# its listeners closing) before it exits anyway: `tether serve` itself, and the supervisor of
# `server.workers` > 1, which kills the workers still running then.
STOP_EXTRA_S = 10.0

_REPLICA_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass
class Limits:
    # Request shape.
    max_request_bytes: int = 32 * 1024 * 1024  # one create body / WS frame (after decompression)
    max_json_depth: int = 64
    max_input_items: int = 4096  # items in one create
    max_item_bytes: int = 8 * 1024 * 1024  # one item's text
    max_tools: int = 512
    max_metadata_pairs: int = 16
    # One conversation (/v1/conversations): its items, and their protobuf bytes.
    max_conversation_items: int = 10_000
    max_conversation_bytes: int = 32 * 1024 * 1024
    # Tokens (per-model context windows can override max_input_tokens in [models]).
    max_input_tokens: int = 1_000_000
    max_output_tokens: int = 128_000  # also enforced on an upstream that ignores the cap it is sent
    # A turn's generation (its model calls, from the first) must end within this, else the
    # response fails with `backend_timeout` (an upstream that keeps a stream open forever, e.g.
    # with SSE keep-alive comments, cannot hold a turn).
    max_turn_s: float = 1800.0
    # Log probabilities one response carries: output tokens x (1 + top_logprobs). With log
    # probabilities asked for, the output cap is at most this / (1 + top_logprobs) tokens.
    max_logprobs: int = 16_384
    # Connection scope.
    max_lanes: int = 32  # distinct named stream_ids per connection (the default lane not counted)
    max_active_responses: int = 16  # concurrently generating responses per connection
    max_queued_responses: int = 256  # waiting creates per connection before rejecting
    # `response.inject`s waiting for their running response to end (docs/fields.md "Injecting
    # items"), per connection; their bytes count as queued bytes (below) until answered.
    max_pending_injects: int = 64
    # Multi-agent responses (docs/multi-agent.md): the highest `max_concurrent_subagents` a create
    # may ask for, the subagents one response may spawn over its life (its continuations included),
    # and how long a WebSocket or gRPC Session response whose agents all wait for client tool
    # outputs stays open for a `response.inject` before it completes (0: it completes at once).
    max_concurrent_subagents: int = 8
    max_subagents_per_response: int = 32
    multi_agent_inject_wait_s: float = 30.0
    # Bytes of creates accepted and not yet ended (queued, waiting for a slot, or generating), per
    # connection, per API key and per process (tether/core/queued.py); 0 = no bound.
    max_queued_bytes_per_connection: int = 64 * 1024 * 1024
    max_queued_bytes_per_key: int = 256 * 1024 * 1024
    max_queued_bytes_per_process: int = 1024 * 1024 * 1024
    connection_lifetime_s: float = 3600.0
    idle_timeout_s: float = 900.0  # no client event and nothing active
    lifetime_grace_s: float = 60.0  # in-flight turns may finish this long past the lifetime
    cache_responses_per_connection: int = 64  # cached response states (LRU)
    cache_bytes_per_process: int = 2 * 1024**3  # all sessions' cached state; past it the tenant holding most evicts its LRU
    token_cache_bytes: int = 64 * 1024**2  # tokenised texts per process, for stateless resends; 0 = off
    # Streaming.
    outbound_buffer_events: int = 256  # per connection; a slow reader blocks its own generation
    coalesce_ms: float = 8.0  # delta coalescing window; 0 sends every delta as it comes
    # The window widens while many streams generate at once (core/outbox.CoalesceWindow): at most
    # this many delta batches per second across the process's streams (0 = a fixed window) ...
    coalesce_batches_per_s: float = 4000.0
    coalesce_max_ms: float = 32.0  # ... and never wider than this (nor than coalesce_ms, if wider)
    max_coalesced_bytes: int = 64 * 1024
    # Response runs (tether/core/run.py; docs/background.md). A stored response's events are
    # kept in a replay log, for `GET /v1/responses/{id}?stream=true&starting_after=N`: at most
    # this many events and bytes per response (the oldest go first) ...
    replay_max_events: int = 20_000
    replay_max_bytes: int = 4 * 1024 * 1024
    # ... and, once it has ended, for this long: the newest `replay_max_finished_runs` of them,
    # their logs at most `replay_bytes_per_process` together.
    replay_retention_s: float = 600.0
    replay_max_finished_runs: int = 1000
    replay_bytes_per_process: int = 256 * 1024 * 1024
    # What a stored (store=true) response in flight does when its client goes away (WebSocket,
    # SSE or gRPC): "finish" (it runs to its end and is stored) or "cancel" (it ends `cancelled`
    # at once and is stored with the output so far). Either way `GET /v1/responses/{id}` answers.
    on_client_gone: str = "finish"
    # A create whose previous_response_id names a stored response still in flight (on another
    # connection) waits this long for it to end before `previous_response_not_found`.
    continuation_wait_s: float = 30.0
    # Background responses (`background: true` over HTTP): queued or running at once, per API key
    # and per process (past either: 429), and how many run at once (the rest wait `queued`).
    max_background_per_key: int = 64
    max_background_per_process: int = 1024
    max_background_running: int = 64
    # One API key runs at most this share of `max_background_running` at once (at least one; the
    # rest of its runs wait `queued`), and a freed slot goes to the key running the fewest
    # (tether/core/slots.py): another key's queued run starts at the next slot turnover at the latest.
    # A server with one API key sets 1.0 (the cap holds even while no other key waits).
    background_key_share: float = 0.5
    # Replicas sharing a Redis or PostgreSQL store (docs/background.md "Many replicas"): each
    # heartbeats every third of this; a response in flight on a replica silent this long is
    # marked failed (`run_orphaned`) by whichever replica is asked about it.
    run_orphan_after_s: float = 15.0
    # Per API key.
    max_connections_per_key: int = 1000
    requests_per_minute: int = 0  # 0 = unlimited
    tokens_per_minute: int = 0  # 0 = unlimited


@dataclass
class ServerConfig:
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 50051
    bridge_host: str = "127.0.0.1"
    bridge_port: int = 8000
    bridge: bool = True  # serve the JSON bridge in-process next to gRPC
    tls_cert: str | None = None
    tls_key: str | None = None
    api_keys_file: str | None = None
    ws_compression: bool = True  # permessage-deflate when the client offers it
    # With permessage-deflate, messages shorter than this go out uncompressed (token deltas: deflating
    # a ~150-byte delta costs more CPU than the ~100 bytes it saves); 0 compresses every message.
    ws_compress_min_bytes: int = 512
    ws_ping_interval_s: float = 20.0
    # A WebSocket whose peer takes none of the bytes waiting to be sent for this long is aborted
    # (it stopped reading: a graceful close could never be flushed either).
    ws_send_timeout_s: float = 30.0
    # Bytes of WebSocket messages (after permessage-deflate inflation) received and not yet taken
    # by the app, all connections together; a message that would pass it is refused (close 1009).
    ws_receive_budget_bytes: int = 256 * 1024 * 1024
    http_keep_alive_s: float = 5.0
    http_max_header_bytes: int = 16 * 1024
    http_header_timeout_s: float = 10.0  # a request head must arrive within this (slow-loris)
    http_body_timeout_s: float = 60.0  # and its body within this after the head
    shutdown_grace_s: float = 30.0
    workers: int = 1
    metrics_port: int = 0  # 0 = metrics served on the bridge port at /metrics
    # Process memory (tether/process_memory.py): `tether serve`/`tether bridge` re-execute once on this
    # allocator so that memory freed after connections close goes back to the OS: "auto" =
    # jemalloc where the system has it (as fast as pymalloc), else glibc "malloc" (more CPU per
    # turn); "pymalloc" keeps CPython's (fastest, but keeps its peak). PYTHONMALLOC, if set, wins.
    allocator: str = "auto"
    # The event loop `tether serve`/`tether bridge` and every worker run (tether/eventloop.py):
    # "auto" = uvloop where it is installed (less CPU per streamed token), else asyncio's own;
    # "uvloop" refuses to start without it; "asyncio" keeps the standard library's.
    event_loop: str = eventloop.DEFAULT  # "asyncio" | "uvloop" | "auto" (tether/eventloop.py)
    # How often to check whether to give memory back (after at least as many sessions closed as
    # remain open: gc + malloc_trim); 0 = never.
    memory_reclaim_interval_s: float = 10.0
    # How long the event loop was blocked (tether/observability/loop_lag.py,
    # `tether_event_loop_lag_seconds`): measured by the loop's selector on asyncio, by a timer
    # every this many seconds on uvloop; 0 = not measured.
    loop_lag_interval_s: float = 0.05
    # The garbage collector's youngest generation: a collection after this many new container
    # objects (Python's default is 700). A create allocates ~370 and most die within it: at 700,
    # 100 simultaneous creates paid ~0.2 ms each in collections (gen-1 and gen-2 ones included);
    # at 20,000 ~0.07 ms, with the longest pause 7.5 ms instead of 17.5. 0 = Python's default.
    gc_young_threshold: int = 20_000
    # Forward compatibility: create fields Tether does not know that it accepts (and ignores)
    # instead of answering 400 `unknown_parameter` (tether/core/stages/fields.py). Empty: every
    # field must have a declared treatment. Env: comma-separated.
    accept_unknown_parameters: list[str] = field(default_factory=list)
    # The key that signs reasoning items' `encrypted_content` (tether/reasoning_codec.py); set
    # the same value on every replica. None: a random key per process (blobs do not survive a
    # restart); with `workers > 1` the supervisor makes one for the run and every worker gets it
    # (tether/workers.py). Env: TETHER_SERVER__REASONING_KEY.
    reasoning_key: str | None = None
    # The browser console at /console on the bridge (tether/bridge/console): its WebSocket
    # handshakes take a token from POST /console/token that lives `console_token_ttl_s`; the keys
    # of `console_admin_tenants` (comma-separated tenant names) see the server view. An open
    # server (no API keys) has one tenant, which is its admin.
    console: bool = True
    console_token_ttl_s: float = 300.0
    console_admin_tenants: str = ""
    # Which browsers may use the bridge (tether/bridge/origin.py). `allowed_hosts`: HTTP `Host`
    # names answered besides loopback names ("*.example.com" for subdomains, "*" any); empty =
    # loopback names only when bound to loopback, any host otherwise. `allowed_origins`: browser
    # origins allowed besides the server's own (and loopback origins when bound to loopback),
    # exact ("https://app.example.com"; "*" any). Env: comma-separated.
    allowed_hosts: list[str] = field(default_factory=list)
    allowed_origins: list[str] = field(default_factory=list)
    # Logs on stderr (tether/logging_setup.py): "auto" = readable lines on a terminal, JSON lines
    # otherwise; "text" or "json" to choose. Flag: --log-format.
    log_format: str = "auto"
    # Sticky routing for Codex (tether/bridge/turn_state.py, docs/deployment.md): this replica's
    # name (1-64 of A-Z a-z 0-9 _ -), which its HTTP responses and WebSocket upgrades carry in
    # `x-codex-turn-state` for a load balancer to route a turn's follow-ups back here; empty: no
    # header. `turn_state_key` signs it: the same secret on every replica, required with an id.
    # Env: TETHER_SERVER__REPLICA_ID, TETHER_SERVER__TURN_STATE_KEY.
    replica_id: str = ""
    turn_state_key: str | None = None


@dataclass
class BackendSpec:
    kind: str = "simulated"
    options: dict[str, Any] = field(default_factory=dict)
    # `[backends.NAME.pool]`: serve this backend from several replicas (tether/backends/pool.py).
    pool: dict[str, Any] | None = None


@dataclass
class Route:
    backend: str = "sim"
    upstream_model: str | None = None  # default: the requested model name
    context_window: int | None = None  # overrides Limits.max_input_tokens for this model


@dataclass
class SafetyConfig:
    # off | flag | block: flag records findings (logs/metrics), block rejects the request.
    mode: str = "flag"


@dataclass
class McpConfig:
    """`[mcp]`: remote MCP servers a create may name in a `{"type": "mcp"}` tool (docs/mcp.md).

    Off until `allowed_servers` names at least one server. An entry with `://` is a URL prefix
    (`https://mcp.example.com/tools/`, matched up to a `/`, `?` or `#` boundary); any other entry is
    a host, optionally with a port (`mcp.example.com`, `127.0.0.1:8931`). A `server_url` outside
    the list is a 400 naming `tools[i].server_url`. Every address a server's host resolves to (and
    every redirect, which the MCP SDK follows within the server's origin only) is checked again at
    connect time: an address that is not public (loopback, private, link-local, ...) must lie in
    `allow_private_networks` (CIDRs), else the connection is refused."""

    allowed_servers: list[str] = field(default_factory=list)
    allow_private_networks: list[str] = field(default_factory=list)
    connect_timeout_s: float = 10.0  # open the session: connect + initialize
    list_timeout_s: float = 10.0  # the whole listing (tools/list, every page together)
    call_timeout_s: float = 60.0  # one tools/call
    max_servers_per_request: int = 8  # `mcp` tools in one create
    max_tools_per_server: int = 128  # tools a server may offer (more: the listing fails)
    # What a server sends is bounded (more: that listing or call fails, and reading stops there):
    max_list_pages: int = 16  # tools/list pages of one listing
    max_list_bytes: int = 2 * 1024 * 1024  # one listing (all pages); also each tools/list answer as sent
    max_tool_description_bytes: int = 8192  # one tool's description
    max_tool_schema_bytes: int = 32 * 1024  # one tool's input schema (as JSON)
    max_result_bytes: int = 1024 * 1024  # one call's result text; its answer as sent: this + 64 KiB
    max_error_bytes: int = 4096  # a server's error message kept in `mcp_call.error` (longer: cut)
    max_calls_per_response: int = 32  # MCP calls in one response (then the model answers without them)
    max_sessions_per_connection: int = 16  # open MCP sessions a connection keeps (LRU-closed past it)

    @property
    def enabled(self) -> bool:
        return bool(self.allowed_servers)


@dataclass
class TetherConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    limits: Limits = field(default_factory=Limits)
    store: str = "sqlite://tether-data/tether.db"
    # When a store=true response is written: "overlap" (after its terminal event, overlapping the
    # client's next turn; a crash can lose the writes of the last few ms) or "before_terminal"
    # (durable before the client sees completion; use it for replicas sharing a store).
    store_durability: str = "overlap"
    backends: dict[str, BackendSpec] = field(default_factory=lambda: {"sim": BackendSpec()})
    # model name or alias -> route; "*" catches every other name.
    models: dict[str, Route] = field(default_factory=lambda: {"tether-sim": Route(backend="sim"), "*": Route(backend="sim")})
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    mcp: McpConfig = field(default_factory=McpConfig)
    log_level: str = "info"
    log_content: bool = False  # message contents and keys are redacted from logs unless True
    # `[prompts.<id>]`: templates a create names with `prompt` (tether/prompts.py), checked at load.
    prompts: PromptLibrary = field(default_factory=PromptLibrary)


def load_config(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> TetherConfig:
    """TOML file (optional) -> env (`TETHER_SECTION__KEY=value`, e.g. TETHER_SERVER__GRPC_PORT=0)."""
    data: dict[str, Any] = {}
    if path:
        data = tomllib.loads(Path(path).read_text())
    cfg = from_dict(data)
    apply_env(cfg, os.environ if env is None else env)
    validate(cfg)
    return cfg


def from_dict(data: Mapping[str, Any]) -> TetherConfig:
    data = dict(data)
    cfg = TetherConfig()
    for section in ("server", "limits", "safety", "mcp"):
        if section in data:
            setattr(cfg, section, _build(type(getattr(cfg, section)), data.pop(section), section))
    if "backends" in data:
        cfg.backends = {
            name: BackendSpec(
                kind=spec.get("kind", "simulated"),
                options={k: v for k, v in spec.items() if k not in ("kind", "pool")},
                pool=spec.get("pool"),
            )
            for name, spec in _tables(data.pop("backends"), "backends").items()
        }
    if "models" in data:
        cfg.models = {name: _build(Route, spec, f"models.{name}")
                      for name, spec in _tables(data.pop("models"), "models").items()}  # fmt: skip
    elif any(spec.kind != "simulated" for spec in cfg.backends.values()):
        # A real backend and no [models]: names come from the backends' own model lists; an
        # unknown name is model_not_found, never silently answered by the simulated catch-all.
        cfg.models = {}
    if "prompts" in data:
        cfg.prompts = PromptLibrary.from_config(data.pop("prompts"))
    for key in ("store", "store_durability", "log_level", "log_content"):
        if key in data:
            setattr(cfg, key, data.pop(key))
    if "log_format" in data:
        raise ValueError("log_format is a [server] setting: write it under [server]")
    if data:
        raise ValueError(f"unknown configuration keys: {sorted(data)}")
    validate(cfg)
    return cfg


def _tables(section: Any, where: str) -> dict[str, dict[str, Any]]:
    """`[where.NAME]` tables: each entry of `section` must be a table."""
    if not isinstance(section, dict):
        raise ValueError(f"[{where}] must be a table of [{where}.NAME] tables")
    for name, spec in section.items():
        if not isinstance(spec, dict):
            raise ValueError(f"{where}.{name} must be a table ([{where}.{name}]), got {spec!r}")
    return section


def validate(cfg: TetherConfig) -> None:
    """The checks a setting's type cannot express; run after every source (file, env, --set)."""
    for name, route in cfg.models.items():
        if route.backend not in cfg.backends:
            raise ValueError(f"models.{name}.backend: {route.backend!r} is not a configured backend "
                             f"(defined: {', '.join(sorted(cfg.backends)) or 'none'}); add [backends.{route.backend}] "
                             "or name one of those")  # fmt: skip
    if not isinstance(cfg.store, str):
        raise ValueError(f"store must be a URL string, got {cfg.store!r}")
    if cfg.store_durability not in ("overlap", "before_terminal"):
        raise ValueError("store_durability must be 'overlap' or 'before_terminal'")
    if cfg.server.allocator not in ALLOCATORS:
        raise ValueError(f"server.allocator must be one of {', '.join(ALLOCATORS)}")
    eventloop.resolve(cfg.server.event_loop)  # an unknown loop, or uvloop where it is missing
    if cfg.server.log_format not in LOG_FORMATS:
        raise ValueError(f"server.log_format must be one of {', '.join(LOG_FORMATS)}")
    if cfg.server.ws_compress_min_bytes < 0:
        raise ValueError("server.ws_compress_min_bytes must be >= 0")
    if cfg.server.replica_id:
        if not _REPLICA_ID.fullmatch(cfg.server.replica_id):
            raise ValueError("server.replica_id must be 1-64 characters of A-Z, a-z, 0-9, '_' and '-'")
        if not cfg.server.turn_state_key:
            raise ValueError("server.turn_state_key must be set with server.replica_id (the same on every replica)")
    mcp = cfg.mcp
    for name in ("connect_timeout_s", "list_timeout_s", "call_timeout_s"):
        if getattr(mcp, name) <= 0:
            raise ValueError(f"mcp.{name} must be > 0")
    for name in ("max_servers_per_request", "max_tools_per_server", "max_result_bytes", "max_calls_per_response",
                 "max_sessions_per_connection", "max_list_pages", "max_list_bytes", "max_tool_description_bytes",
                 "max_tool_schema_bytes", "max_error_bytes"):  # fmt: skip
        if getattr(mcp, name) < 1:
            raise ValueError(f"mcp.{name} must be >= 1")
    for net in mcp.allow_private_networks:
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError:
            raise ValueError(f"mcp.allow_private_networks: {net!r} is not a CIDR network") from None
    limits = cfg.limits
    for name in ("coalesce_ms", "coalesce_max_ms", "coalesce_batches_per_s", "max_queued_bytes_per_connection",
                 "max_queued_bytes_per_key", "max_queued_bytes_per_process", "max_conversation_items",
                 "max_conversation_bytes", "max_pending_injects", "multi_agent_inject_wait_s"):  # fmt: skip
        if getattr(limits, name) < 0:
            raise ValueError(f"limits.{name} must be >= 0")
    if limits.max_concurrent_subagents < 1 or limits.max_subagents_per_response < 1:
        raise ValueError("limits.max_concurrent_subagents and limits.max_subagents_per_response must be >= 1")
    if not limits.max_turn_s > 0:
        raise ValueError("limits.max_turn_s must be > 0")
    if not limits.run_orphan_after_s > 0:
        raise ValueError("limits.run_orphan_after_s must be > 0 (replicas heartbeat every third of it)")
    if limits.on_client_gone not in ("finish", "cancel"):
        raise ValueError("limits.on_client_gone must be 'finish' or 'cancel'")
    if not 0 < limits.background_key_share <= 1:
        raise ValueError("limits.background_key_share must be > 0 and <= 1")
    if limits.max_logprobs < 1:
        raise ValueError("limits.max_logprobs must be >= 1")
    if cfg.server.loop_lag_interval_s < 0:
        raise ValueError("server.loop_lag_interval_s must be >= 0")
    if cfg.server.gc_young_threshold < 0:
        raise ValueError("server.gc_young_threshold must be >= 0")


def apply_env(cfg: TetherConfig, env: Mapping[str, str]) -> None:
    for name, raw in env.items():
        if not name.startswith("TETHER_") or name == "TETHER_API_KEYS":
            continue
        path = name[len("TETHER_") :].lower().split("__")
        if len(path) == 1 and path[0] in ("store", "store_durability", "log_level", "log_content"):
            set_path(cfg, path, raw)
        elif len(path) == 2 and path[0] in ("server", "limits", "safety", "mcp"):
            set_path(cfg, path, raw)


def set_path(cfg: TetherConfig, path: list[str], raw: Any) -> None:
    """Set `section.key` (or a top-level key) from a string or typed value, coercing by field type."""
    target: Any = cfg
    for part in path[:-1]:
        target = getattr(target, part)
    key = path[-1]
    fields = {f.name: f for f in dataclasses.fields(target)}
    if key not in fields:
        raise ValueError(f"unknown setting {'.'.join(path)}")
    setattr(target, key, _coerce(raw, getattr(target, key), ".".join(path)))


def _build(cls: type, values: Mapping[str, Any], where: str) -> Any:
    obj = cls()
    known = {f.name for f in dataclasses.fields(obj)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown keys in [{where}]: {sorted(unknown)}")
    for key, value in values.items():
        setattr(obj, key, _coerce(value, getattr(obj, key), f"{where}.{key}"))
    return obj


def _coerce(value: Any, current: Any, where: str) -> Any:
    if not isinstance(value, str):
        _check_type(value, current, where)
        return value
    if isinstance(current, str) or current is None:
        return value
    if isinstance(current, list):  # from the environment: comma-separated
        return [part.strip() for part in value.split(",") if part.strip()]
    try:
        if isinstance(current, bool):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if isinstance(current, int):
            return int(value)
        if isinstance(current, float):
            return float(value)
    except ValueError:
        raise ValueError(f"{where}: cannot read {value!r} as {type(current).__name__}") from None
    return value


def _check_type(value: Any, current: Any, where: str) -> None:
    """A value from TOML (or a typed --set) has the setting's type (an int where a float goes)."""
    if current is None or isinstance(current, dict | PromptLibrary):
        return
    if isinstance(current, bool):
        ok = isinstance(value, bool)
    elif isinstance(current, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(current, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif isinstance(current, list):
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    else:
        ok = isinstance(value, type(current))
    if not ok:
        raise ValueError(f"{where} must be {_TYPE_NAMES.get(type(current), type(current).__name__)}, got {value!r}")


_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
               list: "a list of strings"}  # fmt: skip
