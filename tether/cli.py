"""`tether` command line: serve, bridge, migrate, turn-state, bench, fuzz.

Configuration precedence: embedded defaults < TOML file (--config) < TETHER_* env < flags.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from tether import __version__, eventloop
from tether.config import TetherConfig, load_config, set_path, validate
from tether.extras import MissingExtra, require
from tether.startup import StartupError, open_configured_store


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", metavar="FILE", help="TOML configuration file")
    p.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
        help="override one setting, e.g. --set limits.coalesce_ms=0 (repeatable)",
    )
    p.add_argument("--log-level", help="debug, info, warning, error")
    p.add_argument("--log-format", choices=("auto", "json", "text"),
                   help="logs on stderr: readable lines (text), JSON lines (json), or text on a terminal and "
                        "JSON otherwise (auto, the default; [server] log_format)")  # fmt: skip


def _serve_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="bind address for gRPC and the bridge (default 127.0.0.1)")
    p.add_argument("--grpc-port", type=int, help="gRPC port (default 50051; 0 = any free port)")
    p.add_argument("--port", type=int, help="HTTP/WebSocket bridge port (default 8000; 0 = any)")
    p.add_argument("--store", help="store URL: sqlite:///path.db, memory://, postgresql://..., redis://...")
    p.add_argument("--api-keys-file", help="file of 'key tenant' lines (also TETHER_API_KEYS)")
    p.add_argument("--tls-cert", help="certificate (PEM) for https/wss and gRPC TLS")
    p.add_argument("--tls-key", help="private key (PEM) for --tls-cert")
    p.add_argument("--workers", type=int, help="worker processes sharing the ports (SO_REUSEPORT)")


def build_config(args: argparse.Namespace) -> TetherConfig:
    try:
        cfg = load_config(args.config)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"tether: configuration: {exc}") from None
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"tether: --set expects SECTION.KEY=VALUE, got {item!r}")
        try:
            set_path(cfg, key.strip().split("."), value.strip())
            validate(cfg)
        except (ValueError, AttributeError) as exc:
            raise SystemExit(f"tether: --set {item}: {exc}") from None
    server = cfg.server
    if getattr(args, "host", None):
        server.grpc_host = server.bridge_host = args.host
    for flag, attr in (("grpc_port", "grpc_port"), ("port", "bridge_port"), ("api_keys_file", "api_keys_file"),
                       ("tls_cert", "tls_cert"), ("tls_key", "tls_key"), ("workers", "workers")):
        value = getattr(args, flag, None)
        if value is not None:
            setattr(server, attr, value)
    if getattr(args, "store", None):
        cfg.store = args.store
    if args.log_level:
        cfg.log_level = args.log_level
    if getattr(args, "log_format", None):
        cfg.server.log_format = args.log_format
    return cfg


def _as_program(args: argparse.Namespace, cfg: TetherConfig) -> None:
    """When this is the `tether` program itself (not `main([...])` called in-process), switch to
    the configured allocator first: a re-exec, so it must come before anything starts."""
    if args.as_program:
        from tether.process_memory import exec_with_allocator

        exec_with_allocator(cfg.server.allocator)


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    _as_program(args, cfg)
    if args.no_bridge:
        cfg.server.bridge = False
    from tether.logging_setup import setup_logging

    setup_logging(cfg.log_level, cfg.server.log_format, not cfg.log_content)
    from tether.observability.tracing import configure_from_env

    configure_from_env()
    strategy = getattr(args, "strategy", None)
    if cfg.server.workers > 1:
        from tether.workers import run_workers

        return run_workers(cfg, strategy)
    from tether.server import serve_forever

    main = serve_forever(cfg) if strategy is None else serve_forever(cfg, strategy=strategy)
    eventloop.run(main, cfg.server.event_loop)
    return 0


def cmd_bridge(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    _as_program(args, cfg)
    from tether.logging_setup import setup_logging

    setup_logging(cfg.log_level, cfg.server.log_format, not cfg.log_content)
    from tether.observability.tracing import configure_from_env

    configure_from_env()
    from tether.server import serve_remote_forever

    upstream, api_key, tls_ca = args.upstream, args.upstream_api_key, args.upstream_ca
    if args.merge_local_tenants and not api_key:
        print("tether: --merge-local-tenants only means something with --upstream-api-key", file=sys.stderr)
        return 2
    if api_key:  # refused before anything listens (start_remote_bridge checks it again)
        from tether.auth import Authenticator
        from tether.server import check_merged_tenants

        try:
            check_merged_tenants(Authenticator.from_sources(file=cfg.server.api_keys_file), args.merge_local_tenants)
        except ValueError as exc:
            print(f"tether: {exc}", file=sys.stderr)
            return 2
    main = serve_remote_forever(
        cfg, upstream=upstream, api_key=api_key, tls_ca=tls_ca, merge_tenants=args.merge_local_tenants
    )
    eventloop.run(main, cfg.server.event_loop)
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    cfg = build_config(args)

    async def run() -> None:
        store = await open_configured_store(cfg.store)  # opening applies pending migrations
        await store.close()

    asyncio.run(run())
    print(f"tether: store {cfg.store.split('@')[-1]} is at the current schema")
    return 0


def cmd_turn_state(args: argparse.Namespace) -> int:
    """The `x-codex-turn-state` token of the configured replica, for the load balancer's map."""
    from tether.bridge import turn_state

    cfg = build_config(args)
    if args.replica_id:
        cfg.server.replica_id = args.replica_id
        try:
            validate(cfg)
        except ValueError as exc:
            raise SystemExit(f"tether: {exc}") from None
    headers = turn_state.headers(cfg.server)
    if not headers:
        raise SystemExit("tether: no server.replica_id: this replica sets no x-codex-turn-state")
    print(headers[0][1].decode())
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tether",
        description="Tether: the OpenAI Responses API (HTTP + WebSocket mode) over a persistent gRPC session per agent.",
    )
    parser.add_argument("--version", action="version", version=f"tether {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the gRPC service and the HTTP/WebSocket bridge (default: simulated model)")
    _common(p)
    _serve_flags(p)
    p.add_argument("--no-bridge", action="store_true", help="serve gRPC only")
    p.set_defaults(run=cmd_serve)

    p = sub.add_parser("bridge", help="run only the HTTP/WebSocket bridge, in front of a remote Tether over gRPC")
    _common(p)
    _serve_flags(p)
    p.add_argument("--upstream", required=True, metavar="HOST:PORT", help="the Tether gRPC address")
    p.add_argument("--upstream-api-key", help="API key sent upstream (default: the client's own key)")
    p.add_argument("--upstream-ca", help="CA certificate (PEM) to verify an upstream using TLS")
    p.add_argument(
        "--merge-local-tenants",
        action="store_true",
        help="with --upstream-api-key and local keys of several tenants: start anyway, every local tenant "
        "being one tenant upstream (each sees the others' stored data); refused without this flag",
    )
    p.set_defaults(run=cmd_bridge)

    p = sub.add_parser("migrate", help="create or upgrade the store's schema")
    _common(p)
    p.add_argument("--store", help="store URL (default: from config)")
    p.set_defaults(run=cmd_migrate)

    p = sub.add_parser(
        "turn-state",
        help="print the x-codex-turn-state token a replica sets (server.replica_id signed with "
        "server.turn_state_key), for deploy/nginx/tether.conf",
    )
    _common(p)
    p.add_argument("--replica-id", help="the replica's id (default: server.replica_id)")
    p.set_defaults(run=cmd_turn_state)

    # Listed for --help; main() hands their arguments to their own parsers.
    sub.add_parser("bench", help="transport comparison experiments (run `tether bench --help`)", add_help=False)
    sub.add_parser("fuzz", help="fuzz every surface of a running Tether (run `tether fuzz --help`)", add_help=False)
    return parser


# Commands whose own parser takes every argument after the command name.
_DELEGATED = {"bench": "tether_lab.bench", "fuzz": "tether_lab.fuzz.campaign"}


def main(argv: list[str] | None = None, *, strategy: Any = None) -> int:
    """The `tether` program (`argv` None: the command line of this process), or one command run
    in-process with `argv` (which never re-executes the process; see `_as_program`). `strategy`:
    the kind of turn `serve` runs (a `tether.core.turn.TurnStrategy`; the lab's prototype server
    passes one), default the standard turn."""
    as_program = argv is None
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in _DELEGATED:  # argparse's REMAINDER would reject a leading --flag
            return require(_DELEGATED[argv[0]], "lab").main(argv[1:])
        args = make_parser().parse_args(argv)
        args.as_program = as_program
        args.strategy = strategy
        return args.run(args)
    except (MissingExtra, StartupError) as exc:  # one line, no traceback (tether/startup.py)
        print(f"tether: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
