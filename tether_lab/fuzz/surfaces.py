"""The three surfaces a campaign drives: WebSocket frames (`fuzz_ws`), HTTP requests (`fuzz_http`)
and the gRPC `Session` stream and unary RPCs (`fuzz_grpc`), each checked by the oracle."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from tether.protocol import json_codec
from tether.protocol.wire import SSE_DONE, TERMINAL_EVENT_TYPES
from tether_lab.fuzz.mutation import Mutator, dumps, mutate_bytes, mutate_proto
from tether_lab.fuzz.oracle import (
    Sdk,
    StreamChecker,
    SurfaceStats,
    answer_of,
    client_kind,
    failed_with_server_error,
    outcome_of,
    sdk_signature,
)

# the gRPC methods the raw-bytes inputs address
SESSION_METHOD = "/tether.responses.v1.ResponsesService/Session"
UNARY_METHODS = (
    "GetResponse", "DeleteResponse", "ListInputItems", "CountInputTokens", "CompactResponse", "ListModels",
    "CreateResponse",
)  # fmt: skip


# -- the WebSocket surface ----------------------------------------------------------------------------


@dataclass
class Target:
    bridge: str  # host:port
    grpc: str  # host:port
    api_key: str
    max_request_bytes: int = 32 * 1024 * 1024
    max_json_depth: int = 64

    @property
    def ws_url(self) -> str:
        return f"ws://{self.bridge}/v1/responses"

    @property
    def http_url(self) -> str:
        return f"http://{self.bridge}"


async def fuzz_ws(target: Target, mutator: Mutator, n: int, stats: SurfaceStats, *, workers: int = 4,
                  deadline_s: float = 15.0, rotate: int = 400) -> None:  # fmt: skip
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    sdk = Sdk()
    inputs = [mutator.ws_input() for _ in range(n)]
    headers = {"Authorization": f"Bearer {target.api_key}"}

    async def worker(w: int, share: list[tuple[str | bytes, str]]) -> None:
        conn = None
        checker = StreamChecker(sdk, stats)
        for i, (frame, how) in enumerate(share):
            if conn is None or i % rotate == 0:
                if conn is not None:
                    await conn.close()
                conn = await connect(
                    target.ws_url, additional_headers=headers, max_size=None, compression=None
                )
                checker = StreamChecker(sdk, stats)
            sentinel = f"fuzzsentinel{w}x{i}"
            kind = client_kind(frame, target.max_request_bytes, target.max_json_depth)
            started = time.perf_counter()
            try:
                answer = await asyncio.wait_for(_ws_one(conn, checker, frame, kind, sentinel), deadline_s)
                stats.outcome(answer)
            except TimeoutError:
                stats.finding("hang", f"{how}: {frame!s:.300}", "ws")
                await conn.close()
                conn = None
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd else None
                if code == 1009 and isinstance(frame, str) and len(frame) > 4 * target.max_request_bytes:
                    stats.outcome("closed:1009")
                else:
                    stats.finding("closed", f"code={code} after {how}: {frame!s:.300}")
                conn = None
            stats.latencies.append(time.perf_counter() - started)
            stats.inputs += 1
        if conn is not None:
            await conn.close()

    shares = [inputs[w::workers] for w in range(workers)]
    await asyncio.gather(*(worker(w, s) for w, s in enumerate(shares)))
    stats.deviations.update(sdk.notes)


async def _ws_one(conn: Any, checker: StreamChecker, frame: str | bytes, kind: str, sentinel: str) -> str:
    await conn.send(frame)
    await conn.send(orjson.dumps({"type": "response.cancel", "response_id": sentinel}).decode())

    async def next_event() -> Any:
        raw = await conn.recv()
        if not isinstance(raw, str):
            checker.stats.finding("malformed", f"binary frame from the server: {raw!r:.100}")
            return {}
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            checker.stats.finding("malformed", raw)
            return {}

    return await answer_of(next_event, checker, sentinel, kind, frame)


# -- the HTTP surface ---------------------------------------------------------------------------------


def http_input(mutator: Mutator) -> tuple[str, str, dict[str, str], bytes | None, str]:
    """(method, path, extra headers, body, label)."""
    r = mutator.rng
    seed = {k: v for k, v in r.choice([s for s in mutator.seeds if s.get("type") == "response.create"]).items()
            if k not in ("type", "stream_id")}  # fmt: skip
    roll = r.random()
    headers: dict[str, str] = {"content-type": "application/json"}
    if r.random() < 0.04:
        headers["authorization"] = r.choice(
            ["", "Bearer", "Bearer wrong-key", "Basic abc", "Bearer " + "x" * 5000]
        )
    if roll < 0.45:
        body = mutator.mutate_obj(seed, r.choice([1, 1, 2, 3]))
        if isinstance(body, dict) and r.random() < 0.4:
            body["stream"] = True
        return "POST", "/v1/responses", headers, dumps(body).encode(), "create-json"
    if roll < 0.60:
        text = orjson.dumps(seed).decode()
        for _ in range(r.choice([1, 2])):
            text = mutator.mutate_text(text)
        return "POST", "/v1/responses", headers, text.encode(), "create-text"
    if roll < 0.66:
        return "POST", "/v1/responses", headers, orjson.dumps(seed), "create-seed"
    if roll < 0.74:
        path = r.choice(["/v1/responses/input_tokens", "/v1/responses/compact"])
        return "POST", path, headers, dumps(mutator.mutate_obj(seed)).encode(), "count-compact"
    if roll < 0.90:
        rid = mutator.string() if r.random() < 0.5 else (r.choice(mutator.ids) if mutator.ids else "resp_x")
        rid = "".join(c if c.isprintable() and c not in "/?#% " else "_" for c in rid)[:300] or "x"
        method, suffix = r.choice([("GET", ""), ("DELETE", ""), ("GET", "/input_items")])
        query = ""
        if suffix and r.random() < 0.7:
            query = "?" + "&".join(
                f"{r.choice(['limit', 'order', 'after', 'include', 'x'])}={r.choice(['0', '1', '100', '101', '-1', 'asc', 'desc', 'up', '', 'abc', rid])}"
                for _ in range(r.randint(1, 3))
            )  # fmt: skip
        return method, f"/v1/responses/{rid}{suffix}{query}", headers, None, "by-id"
    if roll < 0.95:
        path = r.choice(["/v1/models", "/v1", "/", "/v1/responses/a/b/c", "/healthz", "/readyz", "/v1/chat/completions",
                         "/v1/responses/%2e%2e/x", "/metrics"])  # fmt: skip
        method = r.choice(["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"])
        return method, path, headers, b"{}" if method in ("POST", "PUT", "PATCH") else None, "routes"
    return "POST", "/v1/responses", {"content-type": r.choice(["text/plain", "application/x-www-form-urlencoded", ""])}, \
        r.randbytes(r.randint(0, 300)), "bytes"  # fmt: skip


async def fuzz_http(target: Target, mutator: Mutator, n: int, stats: SurfaceStats, *, workers: int = 8,
                    deadline_s: float = 15.0) -> None:  # fmt: skip
    import httpx

    sdk = Sdk()
    inputs = [http_input(mutator) for _ in range(n)]
    queue: asyncio.Queue[tuple[str, str, dict[str, str], bytes | None, str]] = asyncio.Queue()
    for item in inputs:
        queue.put_nowait(item)

    async with httpx.AsyncClient(base_url=target.http_url, timeout=deadline_s,
                                 headers={"authorization": f"Bearer {target.api_key}"}) as client:  # fmt: skip

        async def worker() -> None:
            while not queue.empty():
                method, path, headers, body, how = queue.get_nowait()
                started = time.perf_counter()
                try:
                    r = await asyncio.wait_for(
                        client.request(method, path, headers=headers, content=body), deadline_s
                    )
                    stats.outcome(_check_http(sdk, stats, method, path, r, how))
                except (TimeoutError, httpx.TimeoutException):
                    stats.finding("hang", f"{method} {path} {body!r:.300}", "http")
                except httpx.HTTPError as exc:
                    stats.finding("closed", f"{type(exc).__name__} on {method} {path} {body!r:.200}")
                stats.latencies.append(time.perf_counter() - started)
                stats.inputs += 1

        await asyncio.gather(*(worker() for _ in range(workers)))
    stats.deviations.update(sdk.notes)


def _check_http(sdk: Sdk, stats: SurfaceStats, method: str, path: str, r: Any, how: str) -> str:
    status = r.status_code
    ctype = r.headers.get("content-type", "")
    if status >= 500:
        try:
            code = r.json()["error"]["code"]
        except Exception:  # noqa: BLE001
            code = "?"
        stats.finding("http_5xx", f"{status} {method} {path}: {r.text[:300]}", f"{status}:{code}")
        return f"http:{status}"
    if method == "HEAD":
        return f"http:{status}"
    if status != 200:
        try:
            err = r.json()["error"]
            assert isinstance(err["message"], str) and isinstance(err["type"], str)
            assert err["code"] is None or isinstance(err["code"], str)
            assert err["param"] is None or isinstance(err["param"], str)
        except Exception:  # noqa: BLE001
            stats.finding("malformed", f"{status} {method} {path}: {r.text[:300]}")
            return f"http:{status}"
        if status == 429 and "retry-after" not in r.headers and err["code"] == "rate_limit_exceeded":
            stats.finding("malformed", "429 without Retry-After")
        return f"http:{status}:{err['code']}"
    if ctype.startswith("text/event-stream"):
        return _check_sse(sdk, stats, r.text)
    try:
        obj = r.json()
    except ValueError:
        if path.startswith("/metrics"):
            return "http:200:metrics"
        stats.finding("malformed", f"200 not JSON on {method} {path}: {r.text[:200]}")
        return "http:200"
    if method == "POST" and path == "/v1/responses" or (method == "GET" and obj.get("object") == "response"):
        try:
            sdk.response.validate_python(sdk.lenient(obj))
        except Exception as exc:  # noqa: BLE001
            stats.finding("malformed", f"{exc!s:.1500}", sdk_signature(exc))
        if failed_with_server_error(obj):
            stats.finding("server_error", obj.get("error"), "response.failed")
        return f"http:200:{obj.get('object')}:{obj.get('status')}"
    return f"http:200:{obj.get('object')}"


def _check_sse(sdk: Sdk, stats: SurfaceStats, text: str) -> str:
    events = []
    blocks = [block for block in text.split("\n\n") if block.strip()]
    done = SSE_DONE.decode().strip()
    ended = bool(blocks) and blocks[-1] == done
    if ended:
        blocks.pop()
    for block in blocks:
        if block == done:
            stats.finding("sequence", "SSE [DONE] before the end of the stream", "done-early")
            continue
        lines = block.split("\n")
        if len(lines) < 2 or not lines[0].startswith("event: ") or not lines[1].startswith("data: "):
            stats.finding("malformed", f"SSE block {block[:200]!r}")
            continue
        ev = orjson.loads(lines[1][6:])
        if ev.get("type") != lines[0][7:]:
            stats.finding("malformed", f"SSE event name {lines[0]!r} vs type {ev.get('type')!r}")
        try:
            sdk.sse_event.validate_python(sdk.lenient(ev))
        except Exception as exc:  # noqa: BLE001
            stats.finding("malformed", f"{exc!s:.1500}", sdk_signature(exc))
        events.append(ev)
    if events and events[0].get("type") == "response.created":
        terminal = [e for e in events if e.get("type") in TERMINAL_EVENT_TYPES]
        body = [e for e in events if e.get("type") != "error"]
        if [e.get("sequence_number") for e in body] != list(range(len(body))):
            stats.finding(
                "sequence", f"SSE sequence numbers {[e.get('sequence_number') for e in events][:20]}", "order"
            )
        if len(terminal) != 1 or events[-1] is not terminal[0]:
            stats.finding("sequence", f"SSE stream without one final terminal event: {[e.get('type') for e in events[-3:]]}",
                          "no-terminal" if not terminal else "after-terminal")  # fmt: skip
    if events and ended != (events[-1].get("type") in TERMINAL_EVENT_TYPES or events[-1].get("type") == "error"):
        stats.finding("sequence", f"SSE [DONE] {'after' if ended else 'missing after'} {events[-1].get('type')}",
                      "done-placement")  # fmt: skip
    for e in events:
        if e.get("type") == "error" and e.get("code") == "server_error":
            stats.finding("server_error", e, "error-event")
    return "sse:" + outcome_of(events)


# -- the gRPC surface ---------------------------------------------------------------------------------


async def fuzz_grpc(target: Target, mutator: Mutator, n: int, stats: SurfaceStats, *, deadline_s: float = 15.0,
                    raw_deadline_s: float = 1.0, sessions: int = 4, raw_concurrency: int = 32) -> None:  # fmt: skip
    import grpc

    from tether.responses.v1 import service_pb2

    sdk = Sdk()
    rng = mutator.rng
    seeds = []
    for s in mutator.seeds:
        with contextlib.suppress(Exception):
            seeds.append(json_codec.client_event_from_json(copy.deepcopy(s)))
    n_semantic = int(n * 0.60)
    n_raw = int(n * 0.25)
    n_unary = n - n_semantic - n_raw

    semantic = []
    for _ in range(n_semantic):
        req = service_pb2.SessionRequest()
        req.CopyFrom(rng.choice(seeds))
        for _ in range(rng.choice([1, 1, 2, 3, 5])):
            mutate_proto(rng, req)
        semantic.append(req)
    raw = []
    for _ in range(n_raw):
        base = rng.choice(seeds).SerializeToString()
        raw.append(mutate_bytes(rng, base) if rng.random() < 0.85 else rng.randbytes(rng.randint(0, 200)))
    unary = []
    for _ in range(n_unary):
        method = rng.choice(UNARY_METHODS)
        base = rng.choice(seeds).create.SerializeToString() if rng.random() < 0.5 else b"\x0a\x05resp_"
        data = (
            mutate_bytes(rng, b"\x0a" + bytes([len(base) & 0x7F]) + base)
            if rng.random() < 0.8
            else rng.randbytes(rng.randint(0, 100))
        )
        unary.append((method, data))

    metadata = (("authorization", f"Bearer {target.api_key}"),)
    ident: Callable[[bytes], bytes] = lambda b: b  # noqa: E731

    async with grpc.aio.insecure_channel(
        target.grpc, options=[("grpc.max_receive_message_length", -1)]
    ) as channel:
        # 1. Semantic mutations on long-lived sessions, sentinel-checked like the WebSocket.
        async def session_worker(w: int, share: list[Any]) -> None:
            call = None
            reader: asyncio.Queue[Any] = asyncio.Queue()
            checker = StreamChecker(sdk, stats)

            async def pump(c: Any) -> None:
                try:
                    async for batch in c:
                        for ev in batch.events:
                            await reader.put(ev)
                except grpc.aio.AioRpcError as exc:
                    await reader.put(exc)
                await reader.put(None)

            pump_task = None
            for i, req in enumerate(share):
                if call is None or i % 400 == 0:
                    if call is not None:
                        call.cancel()
                    call = channel.stream_stream(SESSION_METHOD, request_serializer=ident,
                                                 response_deserializer=service_pb2.SessionResponse.FromString)(metadata=metadata)  # fmt: skip
                    reader = asyncio.Queue()
                    pump_task = asyncio.create_task(pump(call))
                    checker = StreamChecker(sdk, stats)
                sentinel = f"fuzzsentinel{w}x{i}"
                cancel = service_pb2.SessionRequest()
                cancel.cancel.response_id = sentinel
                started = time.perf_counter()
                try:
                    answer = await asyncio.wait_for(
                        _grpc_one(call, reader, checker, req, cancel.SerializeToString(), sentinel),
                        deadline_s,
                    )
                    stats.outcome(answer)
                except TimeoutError:
                    stats.finding("hang", f"semantic: {req!s:.300}", "grpc-session")
                    call.cancel()
                    call = None
                except _StreamEnded as exc:
                    stats.finding("closed", f"session ended ({exc}) after {req!s:.300}")
                    call = None
                stats.latencies.append(time.perf_counter() - started)
                stats.inputs += 1
            if call is not None:
                call.cancel()
            if pump_task is not None:
                pump_task.cancel()

        shares = [semantic[w::sessions] for w in range(sessions)]
        await asyncio.gather(*(session_worker(w, s) for w, s in enumerate(shares)))

        # 2. Raw bytes on a fresh Session stream each.
        sem = asyncio.Semaphore(raw_concurrency)
        sentinel_req = service_pb2.SessionRequest()
        sentinel_req.cancel.response_id = "fuzzsentinelraw"

        async def raw_one(data: bytes) -> None:
            async with sem:
                call = channel.stream_stream(
                    SESSION_METHOD, request_serializer=ident, response_deserializer=ident
                )(metadata=metadata)
                started = time.perf_counter()
                try:
                    outcome = await asyncio.wait_for(
                        _raw_session(call, data, sentinel_req.SerializeToString()), raw_deadline_s
                    )
                    stats.outcome(outcome)
                except TimeoutError:
                    stats.finding("hang", f"raw session bytes {data[:120]!r}", "grpc-raw-session")
                finally:
                    call.cancel()
                stats.latencies.append(time.perf_counter() - started)
                stats.inputs += 1

        await asyncio.gather(*(raw_one(d) for d in raw))

        # 3. Raw bytes to the unary RPCs.
        usem = asyncio.Semaphore(8)

        async def unary_one(method: str, data: bytes) -> None:
            async with usem:
                path = f"/tether.responses.v1.ResponsesService/{method}"
                started = time.perf_counter()
                try:
                    if method == "CreateResponse":
                        call = channel.unary_stream(
                            path, request_serializer=ident, response_deserializer=ident
                        )
                        replies = [r async for r in call(data, metadata=metadata, timeout=deadline_s)]
                        for r in replies:
                            service_pb2.CreateResponseResponse.FromString(r)
                        stats.outcome(f"grpc:OK:{method}")
                    else:
                        call = channel.unary_unary(
                            path, request_serializer=ident, response_deserializer=ident
                        )
                        await call(data, metadata=metadata, timeout=deadline_s)
                        stats.outcome(f"grpc:OK:{method}")
                except grpc.aio.AioRpcError as exc:
                    code = exc.code()
                    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                        stats.finding("hang", f"{method} {data[:120]!r}", "grpc-unary")
                    elif code == grpc.StatusCode.INTERNAL:
                        stats.finding("server_error", f"{method}: {exc.details()}", "grpc-internal")
                    else:
                        if code == grpc.StatusCode.UNKNOWN and "DecodeError" in (exc.details() or ""):
                            stats.deviation("undecodable unary request -> UNKNOWN (not INVALID_ARGUMENT)")
                        stats.outcome(f"grpc:{code.name}")
                stats.latencies.append(time.perf_counter() - started)
                stats.inputs += 1

        await asyncio.gather(*(unary_one(m, d) for m, d in unary))
    stats.deviations.update(sdk.notes)


class _StreamEnded(Exception):
    pass


async def _grpc_one(call: Any, reader: asyncio.Queue[Any], checker: StreamChecker, req: Any, sentinel_bytes: bytes,
                    sentinel: str) -> str:  # fmt: skip
    await call.write(req.SerializeToString())
    await call.write(sentinel_bytes)
    kind = req.WhichOneof("event") or "undecodable"

    async def next_event() -> dict[str, Any]:
        ev = await reader.get()
        if ev is None or isinstance(ev, Exception):
            raise _StreamEnded(repr(ev))
        return json_codec.event_to_json(ev, ws=True)

    return await answer_of(next_event, checker, sentinel, kind, req)


async def _raw_session(call: Any, data: bytes, sentinel: bytes) -> str:
    import grpc

    from tether.responses.v1 import service_pb2

    try:
        try:
            await call.write(data)
            await call.write(sentinel)
        except asyncio.InvalidStateError:  # the server ended the stream (a refused message) first
            return f"status:{(await call.code()).name}"
        async for raw in call:
            batch = service_pb2.SessionResponse.FromString(raw)
            for ev in batch.events:
                if ev.WhichOneof("event") == "error" and "fuzzsentinelraw" in ev.error.error.message:
                    return "answered"
        return "stream-ended:OK"
    except grpc.aio.AioRpcError as exc:
        return f"status:{exc.code().name}"
    except asyncio.InvalidStateError:  # the server ended the RPC (a malformed message) before the sentinel went out
        return f"status:{(await call.code()).name}"


