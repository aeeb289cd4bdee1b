"""Scale-out measurements: store hydration vs history, 1 vs N workers, the nginx hop, and how soon
another replica sees a store=true response.

    python -m tether_lab.scaleout                 # every part, default sizes (~2 minutes)
    python -m tether_lab.scaleout --parts nginx,visibility --quick

Parts (each prints one table; a part whose prerequisite is missing says so and is skipped):

- `hydrate`: `load_context` time of the last response of a chain of 10/50/200 turns, for every
  store that answers (memory, SQLite, PostgreSQL, Redis), via `tether_lab.bench_hydrate`. One
  read per hydration whatever the length; the time grows only with the bytes read.
- `throughput`: `tether serve --workers 1` vs `--workers N` (SQLite store, instant simulated
  model): many concurrent short gRPC rollouts (open a Session, a few chained turns, close) from
  several client processes for a fixed time; turns/s and server CPU-ms per turn.
- `nginx`: sequential WebSocket and gRPC turns on one connection, straight to a replica vs
  through nginx (deploy/nginx/tether.conf); the difference is the hop's cost per turn.
- `visibility`: two replicas sharing a store; store=true turns alternate between them, each
  continuing the other replica's response the moment its `response.completed` arrived: how often
  that gets previous_response_not_found, how long until a retry succeeds, and the turn latency,
  with `store_durability = "overlap"` (the write follows the terminal event) and
  `"before_terminal"` (the write precedes it).

The process harness below (free ports, a Tether subprocess, nginx as a foreground subprocess with
a private prefix, /proc socket ownership) is also what tests/scaleout uses.

PostgreSQL and Redis URLs: TETHER_TEST_PG_URL (default postgresql://postgres@127.0.0.1:5432/test)
and TETHER_TEST_REDIS_URL (default redis://127.0.0.1:6379/0); each run uses a fresh schema / key
prefix and removes it afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import multiprocessing
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tether import eventloop
from tether.bridge import turn_state
from tether.config import load_config
from tether.protocol.wire import TERMINAL_ARMS
from tether_lab.metrics import ProcStat
from tether_lab.processes import (
    ServerProcess,
    free_ports,
    toml_value,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
NGINX_TEMPLATE = REPO_ROOT / "deploy" / "nginx" / "tether.conf"
PG_URL = os.environ.get("TETHER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("TETHER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

# -- configuration ------------------------------------------------------------------------------------

FAST_SIM = {"ttft_ms": 0, "tokens_per_s": 0, "output_tokens": 12, "tick_ms": 1}


def write_config(
    path: Path,
    store: str,
    *,
    durability: str | None = None,
    sim: dict | None = None,
    server: dict | None = None,
) -> Path:
    """A TOML config: `store` (and `store_durability` when given), an instant simulated model for
    every name, quick shutdown."""
    sim = {**FAST_SIM, **(sim or {})}
    server = {"shutdown_grace_s": 3, "log_format": "json", **(server or {})}

    lines = [f"store = {toml_value(store)}"]
    if durability:
        lines.append(f"store_durability = {toml_value(durability)}")
    lines += ["", "[server]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in server.items()]
    lines += ["", "[limits]", "coalesce_ms = 0", "", "[backends.sim]", 'kind = "simulated"']
    lines += [f"{k} = {toml_value(v)}" for k, v in sim.items()]
    lines += ["", '[models."*"]', 'backend = "sim"', ""]
    path.write_text("\n".join(lines))
    return path


# -- nginx --------------------------------------------------------------------------------------------


def nginx_binary() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    for candidate in ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def nginx_version(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "-v"], capture_output=True, text=True).stderr
    m = re.search(r"nginx/(\d+(?:\.\d+)*)", out)
    return tuple(int(x) for x in m.group(1).split(".")) if m else (0,)


def render_template(text: str, values: dict[str, str]) -> str:
    """Substitute `${NAME}` for the given names only (like `envsubst '${NAME} ...'`), so nginx's
    own `$variables` stay; every `${TETHER_...}` must be given."""
    for name, value in values.items():
        text = text.replace("${" + name + "}", value)
    left = sorted(set(re.findall(r"\$\{(TETHER_[A-Z0-9_]+)\}", text)))
    if left:
        raise ValueError(f"unrendered placeholders: {left}")
    return text


def with_slots(template: str, count: int) -> str:
    """deploy/nginx/tether.conf with `count` upstream slots: its two, plus a copy of each second
    `server` line per further replica (what the file says to do for more replicas)."""
    lines = []
    for line in template.splitlines(keepends=True):
        lines.append(line)
        for name in ("TETHER_BRIDGE_2", "TETHER_GRPC_2"):
            if "${" + name + "}" in line:
                stem = name.removesuffix("2")
                lines += [line.replace("${" + name + "}", "${" + f"{stem}{i}" + "}") for i in range(3, count + 1)]
    return "".join(lines)


def nginx_values(http_port: int, grpc_port: int, replicas: Sequence[ServerProcess]) -> dict[str, str]:
    """Values for deploy/nginx/tether.conf (`with_slots` for more than two replicas; one replica
    fills both slots)."""
    slots = list(replicas) * (2 if len(replicas) == 1 else 1)
    values = {"TETHER_HTTP_LISTEN": f"127.0.0.1:{http_port}", "TETHER_GRPC_LISTEN": f"127.0.0.1:{grpc_port}"}
    for i, r in enumerate(slots, 1):
        values[f"TETHER_BRIDGE_{i}"] = f"{r.host}:{r.bridge_port}"
        values[f"TETHER_GRPC_{i}"] = f"{r.host}:{r.grpc_port}"
        # The map's keys must differ: a slot whose replica sets no token (or fills both slots)
        # gets a key no replica sends.
        token = turn_state_of(r) if i == 1 or slots[0] is not r else ""
        values[f"TETHER_TURN_STATE_{i}"] = token or f"no-turn-state-{i}"
    return values


def turn_state_of(replica: ServerProcess) -> str:
    """The `x-codex-turn-state` token `replica` sets (its config and environment), or ""."""
    cfg = load_config(replica.config, env={**os.environ, **replica.env})
    headers = turn_state.headers(cfg.server)
    return headers[0][1].decode() if headers else ""


@dataclass
class Nginx:
    """nginx in the foreground with a private prefix (config, pid file, logs, temp dirs all under
    `workdir`), running deploy/nginx/tether.conf rendered for the given replicas."""

    workdir: Path
    http_port: int
    grpc_port: int
    replicas: Sequence[ServerProcess]
    template: Path = NGINX_TEMPLATE
    proc: subprocess.Popen | None = None
    binary: str | None = field(default_factory=nginx_binary)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v1"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        site = render_template(
            with_slots(self.template.read_text(), len(self.replicas)),
            nginx_values(self.http_port, self.grpc_port, self.replicas),
        )
        (self.workdir / "tether.conf").write_text(site)
        w = self.workdir
        temp = "\n".join(
            f"    {kind}_temp_path {w / ('tmp_' + kind)};"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        main = f"""# generated by tether_lab.scaleout
{"user root;" if os.geteuid() == 0 else ""}
daemon off;
worker_processes 1;
pid {w / "nginx.pid"};
error_log {w / "error.log"} notice;
events {{ worker_connections 4096; }}
http {{
    access_log off;
{temp}
    include {w / "tether.conf"};
}}
"""
        path = w / "nginx.conf"
        path.write_text(main)
        return path

    def start(self, timeout: float = 15.0) -> Nginx:
        if self.binary is None:
            raise FileNotFoundError("nginx is not installed (Debian/Ubuntu: apt-get install -y nginx)")
        conf = self.write_config()
        cmd = [self.binary, "-p", str(self.workdir), "-c", str(conf)]
        if nginx_version(self.binary) >= (1, 19, 5):  # -e: the error log before the config is read
            cmd += ["-e", str(self.workdir / "error.log")]
        check = subprocess.run([*cmd, "-t"], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"nginx -t failed:\n{check.stderr}")
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / "stderr.log", "wb"),
        )
        deadline = time.monotonic() + timeout
        while not all(_accepts(p) for p in (self.http_port, self.grpc_port)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not start:\n{self.logs()}")
            time.sleep(0.05)
        return self

    def logs(self) -> str:
        with contextlib.suppress(OSError):
            return (self.workdir / "error.log").read_text(errors="replace")[-4000:]
        return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGQUIT)  # graceful
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _accepts(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


# -- shared stores for a run --------------------------------------------------------------------------


def pg_reachable(url: str = PG_URL) -> str | None:
    """None when PostgreSQL answers at `url`, else why not."""

    async def probe() -> None:
        import asyncpg

        conn = await asyncpg.connect(url, timeout=3)
        await conn.close()

    try:
        asyncio.run(probe())
        return None
    except Exception as exc:  # noqa: BLE001
        return f"PostgreSQL not reachable at {url} ({type(exc).__name__}: {exc})"


def redis_reachable(url: str = REDIS_URL) -> str | None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=5)
    try:
        client.ping()
        return None
    except Exception as exc:  # noqa: BLE001
        return f"Redis not reachable at {url} ({type(exc).__name__}: {exc})"
    finally:
        client.close()


@contextlib.contextmanager
def scratch_store(kind: str, workdir: Path) -> Iterator[str]:
    """A store URL private to this run (fresh SQLite file / PostgreSQL schema / Redis prefix),
    cleaned up afterwards."""
    tag = f"scaleout_{secrets.token_hex(4)}"
    if kind == "sqlite":
        yield f"sqlite:///{workdir / (tag + '.db')}"
    elif kind == "memory":
        yield "memory://"
    elif kind == "postgres":
        sep = "&" if "?" in PG_URL else "?"
        try:
            yield f"{PG_URL}{sep}schema={tag}"
        finally:

            async def drop() -> None:
                import asyncpg

                conn = await asyncpg.connect(PG_URL, timeout=5)
                try:
                    await conn.execute(f'DROP SCHEMA IF EXISTS "{tag}" CASCADE')
                finally:
                    await conn.close()

            with contextlib.suppress(Exception):
                asyncio.run(drop())
    elif kind == "redis":
        sep = "&" if "?" in REDIS_URL else "?"
        try:
            yield f"{REDIS_URL}{sep}prefix={tag}"
        finally:
            import redis

            client = redis.Redis.from_url(REDIS_URL, socket_timeout=10)
            try:
                keys = list(client.scan_iter(match=f"{tag}:*", count=1000))
                for i in range(0, len(keys), 500):
                    client.delete(*keys[i : i + 500])
            finally:
                client.close()
    else:
        raise ValueError(kind)


# -- clients -------------------------------------------------------------------------------------------


def grpc_session_request(**create: object):
    """A SessionRequest carrying one create (strings for `input` become input_text)."""
    from tether.responses.v1 import service_pb2

    req = service_pb2.SessionRequest()
    for key, value in create.items():
        if key == "input":
            req.create.input_text = value  # type: ignore[assignment]
        else:
            setattr(req.create, key, value)
    return req




async def grpc_turn(call, queue: asyncio.Queue, **create: object):
    """Send one create on an open Session call and return its terminal (or error) event;
    `queue` receives the call's events (see `grpc_reader`)."""
    await call.write(grpc_session_request(**create))
    while True:
        ev = await queue.get()
        if ev is None:
            raise EOFError("session ended")
        arm = ev.WhichOneof("event")
        if arm in TERMINAL_ARMS or arm == "error":
            return ev


async def grpc_reader(call, queue: asyncio.Queue) -> None:
    """Put the call's events on `queue`, then None when the call ends (an RPC error or our own
    `call.cancel()` included: the caller sees the end, `call.code()` says why)."""
    import grpc

    try:
        async for batch in call:
            for ev in batch.events:
                queue.put_nowait(ev)
    except grpc.aio.AioRpcError:
        pass
    except asyncio.CancelledError:
        if not call.cancelled():
            raise
    finally:
        queue.put_nowait(None)


async def ws_turn(conn, **create: object) -> dict:
    """Send one `response.create` on a raw `websockets` connection; return its terminal event."""
    import orjson

    await conn.send(orjson.dumps({"type": "response.create", **create}).decode())
    while True:
        ev = orjson.loads(await conn.recv())
        kind = ev.get("type", "")
        if kind in ("response.completed", "response.failed", "response.incomplete", "error"):
            return ev


# -- part: hydration ------------------------------------------------------------------------------------


def part_hydrate(args: argparse.Namespace, workdir: Path) -> None:
    from tether_lab import bench_hydrate

    turns = [10, 50, 200]
    print(
        f"\n## Hydration: one load_context of the last response, chain of N turns ({args.repeat} reads each)"
    )
    print(f"{'store':<10} " + " ".join(f"{f'{n} turns':>22}" for n in turns))
    print(f"{'':<10} " + " ".join(f"{'mean us (us/item)':>22}" for _ in turns))
    for kind in ("memory", "sqlite", "postgres", "redis"):
        why = pg_reachable() if kind == "postgres" else redis_reachable() if kind == "redis" else None
        if why:
            print(f"{kind:<10} skipped: {why}")
            continue
        with scratch_store(kind, workdir) as url:
            rows = eventloop.run(bench_hydrate.run(url, turns, args.repeat, 200, out=io.StringIO()))
        cells = [f"{r['mean_us']:>10.0f} ({r['mean_us'] / max(r['items'], 1):>5.1f})" for r in rows]
        print(f"{kind:<10} " + " ".join(f"{c:>22}" for c in cells), flush=True)


# -- part: throughput ---------------------------------------------------------------------------------


def _load_client(target: str, concurrency: int, turns: int, duration: float, start_at: float, out) -> None:
    """One client process: `concurrency` loops of short gRPC rollouts until `duration` passes."""
    import grpc

    from tether.responses.v1 import service_pb2_grpc

    async def main() -> tuple[int, int, list[float]]:
        done_turns = rollouts = 0
        latencies: list[float] = []
        async with grpc.aio.insecure_channel(target) as channel:
            stub = service_pb2_grpc.ResponsesServiceStub(channel)
            await asyncio.sleep(max(0.0, start_at - time.time()))
            stop = time.monotonic() + duration

            async def loop() -> None:
                nonlocal done_turns, rollouts
                while time.monotonic() < stop:
                    call = stub.Session()
                    queue: asyncio.Queue = asyncio.Queue()
                    reader = asyncio.create_task(grpc_reader(call, queue))
                    previous = ""
                    for t in range(turns):
                        t0 = time.perf_counter()
                        ev = await grpc_turn(
                            call, queue, model="tether-sim", input=f"step {t}", store=False,
                            previous_response_id=previous,
                        )  # fmt: skip
                        latencies.append(time.perf_counter() - t0)
                        arm = ev.WhichOneof("event")
                        if arm != "completed":
                            raise RuntimeError(f"turn ended with {arm}: {ev}")
                        previous = ev.completed.response.id
                        done_turns += 1
                    call.cancel()  # the server keeps a Session open after a half-close
                    await reader
                    rollouts += 1

            await asyncio.gather(*(loop() for _ in range(concurrency)))
        return done_turns, rollouts, latencies

    out.send(eventloop.run(main()))
    out.close()


def run_load(target: str, *, clients: int, concurrency: int, turns: int, duration: float) -> dict:
    """Drive `target` from `clients` processes; turns/s and latency percentiles."""
    ctx = multiprocessing.get_context("spawn")
    start_at = time.time() + 2.0  # every client connected and imported before the clock starts
    pipes, procs = [], []
    per = max(1, concurrency // clients)
    for _ in range(clients):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_load_client, args=(target, per, turns, duration, start_at, send))
        p.start()
        pipes.append(recv)
        procs.append(p)
    results = [r.recv() for r in pipes]
    for p in procs:
        p.join()
    total = sum(r[0] for r in results)
    lat = sorted(x for r in results for x in r[2])
    return {
        "turns": total,
        "rollouts": sum(r[1] for r in results),
        "turns_per_s": total / duration,
        "p50_ms": lat[len(lat) // 2] * 1000 if lat else float("nan"),
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else float("nan"),
    }


def part_throughput(args: argparse.Namespace, workdir: Path) -> None:
    cores = os.cpu_count() or 1
    print(
        f"\n## Throughput: gRPC rollouts of {args.rollout_turns} turns (store=false, instant model), "
        f"{args.concurrency} concurrent from {args.clients} client processes, {args.duration:.0f} s each; "
        f"{cores} CPU cores on this machine (clients included)"
    )
    print(f"{'workers':>7} {'turns/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'server CPU ms/turn':>19}")
    for workers in args.workers:
        with scratch_store("sqlite", workdir) as url:
            cfg = write_config(workdir / f"tp{workers}.toml", url)
            grpc_port, bridge_port = free_ports(2)
            server = ServerProcess(cfg, workdir, grpc_port, bridge_port, workers=workers, name=f"tp{workers}")
            server.start().wait_ready()
            try:
                pids = server.serving_pids()
                cpu0 = sum(ProcStat(p).cpu_seconds() for p in pids)
                row = run_load(
                    server.grpc_target, clients=args.clients, concurrency=args.concurrency,
                    turns=args.rollout_turns, duration=args.duration,
                )  # fmt: skip
                cpu = sum(ProcStat(p).cpu_seconds() for p in pids) - cpu0
            finally:
                server.stop()
        print(
            f"{workers:>7} {row['turns_per_s']:>9.0f} {row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f}"
            f" {cpu * 1000 / max(row['turns'], 1):>19.2f}",
            flush=True,
        )


# -- part: the nginx hop ------------------------------------------------------------------------------


async def _ws_latencies(url: str, n: int) -> list[float]:
    from websockets.asyncio.client import connect

    out = []
    async with connect(url, compression=None, max_size=None) as conn:
        previous = ""
        for i in range(n + 20):
            t0 = time.perf_counter()
            ev = await ws_turn(
                conn, model="tether-sim", input=f"turn {i}", store=False, previous_response_id=previous
            )
            dt = time.perf_counter() - t0
            if ev["type"] != "response.completed":
                raise RuntimeError(ev)
            previous = ev["response"]["id"]
            if i >= 20:  # warm-up
                out.append(dt)
            if i % 40 == 39:
                previous = ""  # keep the context short: this measures the hop, not the history
    return out


async def _grpc_latencies(target: str, n: int) -> list[float]:
    import grpc

    from tether.responses.v1 import service_pb2_grpc

    out = []
    async with grpc.aio.insecure_channel(target) as channel:
        call = service_pb2_grpc.ResponsesServiceStub(channel).Session()
        queue: asyncio.Queue = asyncio.Queue()
        reader = asyncio.create_task(grpc_reader(call, queue))
        previous = ""
        for i in range(n + 20):
            t0 = time.perf_counter()
            ev = await grpc_turn(
                call, queue, model="tether-sim", input=f"turn {i}", store=False, previous_response_id=previous
            )
            dt = time.perf_counter() - t0
            if ev.WhichOneof("event") != "completed":
                raise RuntimeError(ev)
            previous = ev.completed.response.id
            if i >= 20:
                out.append(dt)
            if i % 40 == 39:
                previous = ""
        call.cancel()
        await reader
    return out


def _pcts(samples: list[float]) -> tuple[float, float, float]:
    s = sorted(samples)
    return statistics.median(s) * 1000, s[int(len(s) * 0.95)] * 1000, statistics.fmean(s) * 1000


def part_nginx(args: argparse.Namespace, workdir: Path) -> None:
    print(
        f"\n## The nginx hop: {args.turns} sequential turns on one connection (instant model, store=false, "
        f"replica with --workers {args.hop_workers})"
    )
    if nginx_binary() is None:
        print("skipped: nginx is not installed (apt-get install -y nginx)")
        return
    with scratch_store("sqlite", workdir) as url:
        cfg = write_config(workdir / "hop.toml", url)
        grpc_port, bridge_port, lb_http, lb_grpc = free_ports(4)
        replica = ServerProcess(cfg, workdir, grpc_port, bridge_port, workers=args.hop_workers, name="hop")
        replica.start().wait_ready()
        lb = Nginx(workdir / "nginx-hop", lb_http, lb_grpc, [replica]).start()
        try:
            rows = []
            for label, coro in (
                ("WebSocket direct", _ws_latencies(replica.ws_url, args.turns)),
                ("WebSocket via nginx", _ws_latencies(f"ws://127.0.0.1:{lb_http}/v1/responses", args.turns)),
                ("gRPC direct", _grpc_latencies(replica.grpc_target, args.turns)),
                ("gRPC via nginx", _grpc_latencies(lb.grpc_target, args.turns)),
            ):
                rows.append((label, _pcts(eventloop.run(coro))))
        finally:
            lb.stop()
            replica.stop()
    print(f"{'path':<22} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8}")
    for label, (p50, p95, mean) in rows:
        print(f"{label:<22} {p50:>8.3f} {p95:>8.3f} {mean:>8.3f}")
    for i, name in ((0, "WebSocket"), (2, "gRPC")):
        print(
            f"nginx hop, {name}: +{rows[i + 1][1][0] - rows[i][1][0]:.3f} ms p50, "
            f"+{rows[i + 1][1][2] - rows[i][1][2]:.3f} ms mean per turn"
        )


# -- part: cross-replica visibility ---------------------------------------------------------------------


async def _visibility(a: ServerProcess, b: ServerProcess, n: int) -> tuple[int, list[float], list[float]]:
    """Alternate store=true turns between A and B over gRPC, each continuing the previous turn's
    response the moment its terminal event arrived on the other replica. Returns (misses, lags,
    turn latencies): a miss is previous_response_not_found; its lag is how long until a retry
    succeeded; a turn latency is create -> terminal event of a turn that did not miss."""
    import grpc

    from tether.responses.v1 import service_pb2_grpc

    misses = 0
    lags: list[float] = []
    turns: list[float] = []
    async with grpc.aio.insecure_channel(a.grpc_target) as ca, grpc.aio.insecure_channel(b.grpc_target) as cb:
        sessions = []
        for channel in (ca, cb):
            call = service_pb2_grpc.ResponsesServiceStub(channel).Session()
            queue: asyncio.Queue = asyncio.Queue()
            sessions.append((call, queue, asyncio.create_task(grpc_reader(call, queue))))
        previous = ""
        for i in range(n):
            call, queue, _ = sessions[i % 2]
            done = time.perf_counter()
            missed = False
            while True:
                t0 = time.perf_counter()
                ev = await grpc_turn(
                    call,
                    queue,
                    model="tether-sim",
                    input=f"turn {i}",
                    store=True,
                    previous_response_id=previous,
                )
                if ev.WhichOneof("event") == "completed":
                    break
                if ev.WhichOneof("event") != "error" or ev.error.error.code != "previous_response_not_found":
                    raise RuntimeError(f"unexpected: {ev}")
                missed = True
                if time.perf_counter() - done > 10:
                    raise RuntimeError(f"{previous} not visible on the other replica after 10 s")
                await asyncio.sleep(0.001)
            if missed:
                misses += 1
                lags.append(time.perf_counter() - done)
            elif i:
                turns.append(time.perf_counter() - t0)
            previous = ev.completed.response.id if i % 20 != 19 else ""
        for call, _, reader in sessions:
            call.cancel()
            await reader
    return misses, lags, turns


def part_visibility(args: argparse.Namespace, workdir: Path) -> None:
    n = args.visibility_samples
    print(
        f"\n## Cross-replica continuation: {n} store=true gRPC turns alternating between replicas A and B, "
        "each continuing the other's response the moment response.completed arrived"
    )
    print(
        f"{'store':<9} {'store_durability':<16} {'previous_response_not_found':>28} "
        f"{'until visible, max ms':>22} {'turn p50 ms':>12}"
    )
    for kind in ("sqlite", "postgres", "redis"):
        why = pg_reachable() if kind == "postgres" else redis_reachable() if kind == "redis" else None
        if why:
            print(f"{kind:<9} skipped: {why}")
            continue
        for durability in ("overlap", "before_terminal"):
            with scratch_store(kind, workdir) as url:
                cfg = write_config(workdir / f"vis-{kind}-{durability}.toml", url, durability=durability)
                ports = free_ports(4)
                a = ServerProcess(cfg, workdir, ports[0], ports[1], name=f"vis-{kind}-a").start()
                b = ServerProcess(cfg, workdir, ports[2], ports[3], name=f"vis-{kind}-b").start()
                try:
                    a.wait_ready()
                    b.wait_ready()
                    misses, lags, turns = eventloop.run(_visibility(a, b, n))
                finally:
                    a.stop()
                    b.stop()
            worst = f"{max(lags) * 1000:.2f}" if lags else "-"
            p50 = f"{statistics.median(turns) * 1000:.2f}" if turns else "-"
            print(f"{kind:<9} {durability:<16} {f'{misses}/{n}':>28} {worst:>22} {p50:>12}", flush=True)


# -- main ----------------------------------------------------------------------------------------------

PARTS = {
    "hydrate": part_hydrate,
    "throughput": part_throughput,
    "nginx": part_nginx,
    "visibility": part_visibility,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tether_lab.scaleout", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {', '.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--repeat", type=int, default=200, help="hydrate: timed reads per chain length")
    parser.add_argument("--workers", default="1,2", help="throughput: worker counts to compare")
    parser.add_argument("--clients", type=int, default=2, help="throughput: load-generating processes")
    parser.add_argument("--concurrency", type=int, default=64, help="throughput: concurrent rollouts in all")
    parser.add_argument("--rollout-turns", type=int, default=4, help="throughput: turns per rollout")
    parser.add_argument("--duration", type=float, default=10.0, help="throughput: seconds per worker count")
    parser.add_argument("--turns", type=int, default=300, help="nginx: timed turns per path")
    parser.add_argument("--hop-workers", type=int, default=1, help="nginx: worker processes of the replica")
    parser.add_argument("--visibility-samples", type=int, default=100, help="visibility: turns per store")
    args = parser.parse_args(argv)
    args.workers = [int(w) for w in str(args.workers).split(",") if w.strip()]
    if args.quick:
        args.repeat, args.duration, args.turns, args.visibility_samples = 30, 3.0, 60, 20
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts: {unknown}")
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so every part stops what it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"tether scale-out bench: {os.cpu_count()} CPU cores, python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="tether-scaleout-") as tmp:
        for name in parts:
            PARTS[name](args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
