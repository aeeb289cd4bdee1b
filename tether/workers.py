"""`tether serve --workers N`: N worker processes sharing the gRPC and bridge ports.

Process model (see docs/deployment.md, "Several workers on one machine"):

- The parent is a small supervisor. It never creates a gRPC object (gRPC's fork rules): it checks
  the configuration, reserves the two ports, opens the store once (creating or migrating the
  schema, so workers do not race on it), then starts each worker as a fresh interpreter (`python -c ...worker_main()`, the
  configuration sent as a pickle over the child's stdin). Nothing is inherited but stdout/stderr.
- Every worker runs the normal server, `tether.server.serve_forever`, on the configured event loop
  (`server.event_loop`, tether/eventloop.py), and binds both ports itself with SO_REUSEPORT: gRPC
  through the `grpc.so_reuseport` option (set when `server.workers > 1`), the bridge through its
  own listening socket (see `_bridge_reuse_port`). The kernel spreads new TCP connections over
  the workers' listening sockets; a connection then stays on the worker that accepted it for its
  whole life, which is all the stickiness a WebSocket or a gRPC `Session` stream needs (their
  state is connection-scoped).
- State shared between workers lives in the store, so N > 1 refuses `memory://` (each worker
  would have its own private store: a reconnect landing on another worker could not continue a
  store=true response). SQLite in WAL mode is fine on one machine (one file, local disk, several
  processes); PostgreSQL or Redis are fine anywhere.
- Supervision: SIGTERM/SIGINT are forwarded to every worker as SIGTERM (each drains gracefully:
  in-flight turns finish, WebSockets close 1001, gRPC streams end UNAVAILABLE, post-inference
  writes flush); the parent waits `shutdown_grace_s` + 10 s, SIGKILLs stragglers, and exits 0 when
  every worker stopped on its own. A second signal kills the workers at once. A worker that exits
  while the parent is not stopping is restarted after a backoff (0.5 s doubling to 10 s); more than
  `RESTART_LIMIT` exits of one worker slot within `RESTART_WINDOW_S` stops everything (exit 1),
  so a worker that cannot start (port taken by someone else, store down) does not loop forever.
- Workers get SIGTERM when the parent dies (Linux `PR_SET_PDEATHSIG`), so a killed supervisor
  does not leave orphans serving the ports.

Ports: a fixed port that something else already listens on is refused up front (a plain bind
probe without SO_REUSEPORT), so N workers never silently join another server's port group. Port
0 is resolved once in the parent (it keeps the bound, non-listening socket while it lives) and
every worker binds that same port.

Reasoning key: the workers share `server.reasoning_key`; without one the supervisor makes a key
for the run and passes it down in the configuration (`share_reasoning_key`), so a stateless
client's sealed reasoning opens on every worker. It prints which, with a fingerprint of the key.

Observability: the supervisor prints one line per worker start, `tether: worker <i> started
(pid <pid>)`; worker log records carry `worker` (its index) and `pid` fields. Each worker has its
own metrics registry: with `server.metrics_port = P` worker i serves its metrics on port P + i;
with the default (metrics on the bridge port) a scrape reaches one worker at random.

Durability: workers share the store but not their post-inference queues, so a client that
reconnects to another worker right after `response.completed` can miss a store=true response
whose write is still queued (or lost with a crashed worker). Set `store_durability =
"before_terminal"` to write before the terminal event (docs/deployment.md measures both).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import os
import pickle
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from tether import eventloop
from tether.config import STOP_EXTRA_S, TetherConfig
from tether.startup import BRIDGE, GRPC, Listener, StartupError, check_tls, listen_error, probe_port

log = logging.getLogger("tether.workers")

RESTART_LIMIT = 5  # exits of one worker slot within the window before the supervisor gives up
RESTART_WINDOW_S = 60.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0
POLL_S = 0.1

_WORKER_CMD = "import tether.workers as w; w.worker_main()"


class WorkerConfigError(StartupError, ValueError):
    """The configuration cannot run with several workers (said in one line, exit status 1)."""


def check_config(cfg: TetherConfig) -> None:
    """Raise WorkerConfigError when `cfg` cannot be served by `server.workers` processes."""
    n = cfg.server.workers
    if n < 1:
        raise WorkerConfigError(f"server.workers must be >= 1, got {n}")
    scheme = cfg.store.partition("://")[0].lower()
    if n > 1 and not hasattr(socket, "SO_REUSEPORT"):
        raise WorkerConfigError("--workers > 1 needs SO_REUSEPORT (Linux); run one process per port instead")
    if n > 1 and scheme == "memory":
        raise WorkerConfigError(
            "--workers > 1 needs a store the workers share: memory:// is private to each process. "
            "Use sqlite:///path.db (WAL, one machine), postgresql://... or redis://..."
        )


# -- ports -------------------------------------------------------------------------------------------


def reserve_port(listener: Listener, host: str, port: int) -> socket.socket:
    """A bound, non-listening SO_REUSEPORT socket on (host, port) for `listener`
    (`tether.startup.GRPC` or `BRIDGE`): resolves port 0 to a concrete port the workers then
    share, and refuses a fixed port some other server already listens on (`probe_port`)."""
    probe_port(listener, host, port)
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise listen_error(listener, host, port, exc) from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise listen_error(listener, host, port, exc) from None
    return sock


# -- the reasoning key ------------------------------------------------------------------------------


def share_reasoning_key(cfg: TetherConfig) -> str:
    """Give every worker the same `server.reasoning_key` (it travels in the pickled configuration):
    a stateless client's sealed reasoning (`tether.reasoning_codec`) must open on whichever worker
    its next connection lands. Without a configured key one is made here for this run. Returns
    the startup line that says which (a fingerprint, never the key)."""
    server = cfg.server
    made = not server.reasoning_key
    if made:
        server.reasoning_key = secrets.token_hex(32)
    fingerprint = key_fingerprint(server.reasoning_key or "")
    if made:
        return (
            f"no server.reasoning_key set: the {server.workers} workers share one made for this run "
            f"(fingerprint {fingerprint}); sealed reasoning does not survive a restart (docs/deployment.md)"
        )
    return f"the {server.workers} workers share server.reasoning_key (fingerprint {fingerprint})"


def key_fingerprint(key: str) -> str:
    """The first 12 hex digits of the key's SHA-256: enough to compare keys across processes."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


# -- supervisor ---------------------------------------------------------------------------------------


@dataclass
class _Slot:
    index: int
    proc: subprocess.Popen | None = None
    exits: collections.deque = field(default_factory=collections.deque)  # monotonic times
    restart_at: float | None = None


class Supervisor:
    """Starts, watches and stops the workers. `command` is the worker's argv (the worker reads
    `(index, cfg)` pickled on stdin, `(index, cfg, strategy)` when a turn strategy is given); the
    restart policy is per instance so tests can shrink it."""

    def __init__(
        self,
        cfg: TetherConfig,
        *,
        command: list[str] | None = None,
        restart_limit: int = RESTART_LIMIT,
        restart_window_s: float = RESTART_WINDOW_S,
        backoff_first_s: float = BACKOFF_FIRST_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        stop_extra_s: float = STOP_EXTRA_S,
        strategy: Any = None,
    ) -> None:
        self.cfg = cfg
        self.strategy = strategy  # the workers' TurnStrategy (picklable), None: the standard turn
        self.command = command or [sys.executable, "-c", _WORKER_CMD]
        self.restart_limit = restart_limit
        self.restart_window_s = restart_window_s
        self.backoff_first_s = backoff_first_s
        self.backoff_max_s = backoff_max_s
        self.stop_extra_s = stop_extra_s
        self.slots = [_Slot(i) for i in range(cfg.server.workers)]
        self.starts = 0
        self.signals: list[int] = []
        self.gave_up = False

    # signals only record; the loop acts on them
    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)

    def _spawn(self, slot: _Slot) -> None:
        proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, close_fds=True)
        self.starts += 1
        assert proc.stdin is not None
        try:
            payload = (slot.index, self.cfg) if self.strategy is None else (slot.index, self.cfg, self.strategy)
            proc.stdin.write(pickle.dumps(payload))
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it died already; the loop sees the exit
        slot.proc = proc
        slot.restart_at = None
        print(f"tether: worker {slot.index} started (pid {proc.pid})", flush=True)

    def _reap(self, now: float) -> None:
        for slot in self.slots:
            proc = slot.proc
            if proc is None or proc.poll() is None:
                continue
            slot.proc = None
            slot.exits.append(now)
            while slot.exits and now - slot.exits[0] > self.restart_window_s:
                slot.exits.popleft()
            recent = len(slot.exits)
            if recent > self.restart_limit:
                log.error(
                    "worker keeps exiting; stopping",
                    extra={
                        "worker": slot.index,
                        "pid": proc.pid,
                        "returncode": proc.returncode,
                        "exits": recent,
                        "window_s": self.restart_window_s,
                    },
                )
                print(
                    f"tether: worker {slot.index} exited {recent} times in {self.restart_window_s:.0f} s; giving up",
                    file=sys.stderr,
                    flush=True,
                )
                self.gave_up = True
                return
            delay = min(self.backoff_max_s, self.backoff_first_s * 2 ** (recent - 1))
            slot.restart_at = now + delay
            log.warning(
                "worker exited; restarting",
                extra={"worker": slot.index, "pid": proc.pid, "returncode": proc.returncode, "in_s": delay},
            )
            print(
                f"tether: worker {slot.index} (pid {proc.pid}) exited with {proc.returncode}; "
                f"restarting in {delay:.1f} s",
                file=sys.stderr,
                flush=True,
            )

    def _stop(self) -> int:
        """Forward SIGTERM, wait for the workers, kill stragglers. 0 when all stopped by themselves."""
        live = [s.proc for s in self.slots if s.proc is not None and s.proc.poll() is None]
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.server.shutdown_grace_s + self.stop_extra_s
        seen = len(self.signals)
        killed = False
        while any(p.poll() is None for p in live):
            hurry = len(self.signals) > seen  # a second signal: no more waiting
            if hurry or time.monotonic() > deadline:
                for proc in live:
                    if proc.poll() is None:
                        with contextlib.suppress(ProcessLookupError):
                            proc.kill()
                        killed = True
                for proc in live:
                    proc.wait()
                break
            time.sleep(POLL_S)
        codes = {p.pid: p.returncode for p in live}
        log.info("workers stopped", extra={"returncodes": codes, "killed": killed})
        return 1 if killed else 0

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for slot in self.slots:
                self._spawn(slot)
            while not self.signals and not self.gave_up:
                now = time.monotonic()
                self._reap(now)
                if self.gave_up:
                    break
                for slot in self.slots:
                    if slot.proc is None and slot.restart_at is not None and now >= slot.restart_at:
                        self._spawn(slot)
                time.sleep(POLL_S)
            if self.signals:
                log.info("stopping workers", extra={"signal": signal.Signals(self.signals[0]).name})
            code = self._stop()
            return 1 if self.gave_up else code
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


async def _prepare_store(url: str) -> None:
    """Open the store once (creates or migrates the schema) and close it, before any worker."""
    from tether.startup import open_configured_store

    store = await open_configured_store(url)
    await store.close()


def run_workers(cfg: TetherConfig, strategy: Any = None) -> int:
    """Serve `cfg` with `cfg.server.workers` processes (each running `strategy`'s turns, default
    the standard turn); returns the process exit status."""
    server = cfg.server
    reserved: list[socket.socket] = []
    try:  # a StartupError or MissingExtra: `tether.cli.main` says it in one line
        check_config(cfg)
        check_tls(server)  # once here, not N times in the workers
        reserved.append(reserve_port(GRPC, server.grpc_host, server.grpc_port))
        server.grpc_port = reserved[0].getsockname()[1]
        if server.bridge:
            reserved.append(reserve_port(BRIDGE, server.bridge_host, server.bridge_port))
            server.bridge_port = reserved[-1].getsockname()[1]
        asyncio.run(_prepare_store(cfg.store))
    except BaseException:
        for sock in reserved:
            sock.close()
        raise
    print(
        f"tether: supervisor pid {os.getpid()}, {server.workers} workers on gRPC {server.grpc_host}:{server.grpc_port}"
        + (f", HTTP/WebSocket http://{server.bridge_host}:{server.bridge_port}/v1" if server.bridge else "")
        + (
            f", metrics on ports {server.metrics_port}-{server.metrics_port + server.workers - 1}"
            if server.metrics_port
            else ""
        ),
        flush=True,
    )
    print(f"tether: {share_reasoning_key(cfg)}", flush=True)
    if cfg.store_durability != "before_terminal":
        log.warning(
            "several workers share the store with store_durability = %r: a client reconnecting to another "
            "worker right after response.completed can miss that response; set store_durability = "
            '"before_terminal" (docs/deployment.md)',
            cfg.store_durability,
        )
    try:
        return Supervisor(cfg, strategy=strategy).run()
    finally:
        for sock in reserved:
            sock.close()


# -- worker side --------------------------------------------------------------------------------------


class _WorkerFields(logging.Filter):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.index
        record.pid = record.process
        return True


def _die_with_parent() -> None:
    """Linux: SIGTERM this worker when the supervisor dies."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def worker_main() -> None:
    """Entry point of one worker process (started by `Supervisor`)."""
    index, cfg, *strategy = pickle.load(sys.stdin.buffer)
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    _die_with_parent()
    from tether.logging_setup import setup_logging

    setup_logging(cfg.log_level, cfg.server.log_format, not cfg.log_content)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_WorkerFields(index))
    os.environ["TETHER_WORKER_INDEX"] = str(index)
    if cfg.server.metrics_port:  # a standalone metrics port per worker: metrics_port + index
        cfg.server.metrics_port += index
    from tether.server import serve_forever

    try:
        announce = index == 0  # the supervisor printed the addresses; one banner says the rest
        main = serve_forever(cfg, strategy=strategy[0], announce=announce) if strategy else serve_forever(cfg, announce=announce)
        eventloop.run(main, cfg.server.event_loop)
    except KeyboardInterrupt:
        pass
    except StartupError as exc:  # e.g. a metrics port in use: one line, and the supervisor decides
        print(f"tether: worker {index}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
