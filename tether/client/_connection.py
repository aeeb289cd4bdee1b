"""One connection: one bidi `Session` call, the creates sent on it, and how its events find them.

How events find their create. The server runs the creates of one lane (`stream_id`) in order
and stamps every event of a response with its `response_id` and lane. A connection keeps at most
one create per lane *unacknowledged* (sent, no `response.created` and no error yet); the next
create of that lane is sent when the previous one is acknowledged. So the first event of an
unknown response id on lane L acknowledges L's unacknowledged create, and an `error` event
without a response id on lane L answers it too. Lanes run concurrently; this gating only orders
the sending within one lane, which the server serialises anyway.

When a connection ends it hands what it never started back to its owner (the client session,
which resends with backoff), hands what was generating and is stored (`store` not false) to the
owner to resume (the server runs it on: `StreamResponse` from the last sequence number seen), and
ends the rest with `ConnectionLost`. The owner is a narrow interface (`Owner`): the connection
never reaches into the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any, Protocol, cast

import grpc

from tether import errors
from tether.client._streams import Pending
from tether.errors import CONNECTION_LOST, TetherError
from tether.protocol import wire
from tether.protocol.wire import TERMINAL_ARMS, error_from_rpc
from tether.responses.v1 import events_pb2, service_pb2

log = logging.getLogger("tether.client")

# In-band codes that mean "this connection is going away: continue on a new one".
RETRY_CODES = frozenset({errors.SERVER_SHUTTING_DOWN, errors.CONNECTION_LIMIT_REACHED})
_CONNECTION_CODES = RETRY_CODES | {errors.IDLE_TIMEOUT}
RETRYABLE_STATUS = frozenset({grpc.StatusCode.UNAVAILABLE})

CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    *wire.CHANNEL_OPTIONS,
    # Come back quickly after a server restart (the defaults wait up to 120 s between tries).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and jitter.

    `max_attempts` bounds the sends of one create, the tries of one connect and of one unary
    call, and `run_tool_loop`'s tries of one turn."""

    max_attempts: int = 6
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed try number `attempt` (1-based)."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** max(0, attempt - 1))
        return base * (1.0 + random.uniform(-self.jitter, self.jitter))


class ConnectionLost(TetherError):
    """The connection ended while the response was being generated. The response did not finish
    and was not stored; `reason` is the server's code when it gave one (`server_shutting_down`,
    ...). Sending the same create again (on the session, which reconnects) redoes it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(CONNECTION_LOST, message)
        self.reason = reason


class Owner(Protocol):
    """What a connection asks of the client session that opened it."""

    closed: bool

    def resubmit(self, p: Pending, *, delay: float | None, cause: TetherError | None = None) -> None:
        """Send `p` again on a (new) connection (`delay` None: the backoff for its attempts)."""

    def lane_completed(self, lane: str, response_id: str) -> None:
        """`response_id` completed on `lane`: what the lane's next chained create continues."""

    def resume(self, p: Pending, *, cause: TetherError) -> None:
        """Follow the stored response `p` was generating from its last event on a new call;
        end it with `cause` when that cannot be done."""

    def unrouted(self, ev: events_pb2.ServerEvent) -> None:
        """An event no create of this connection is waiting for (steer events, late errors)."""

    def connection_ending(self, conn: Connection, err: TetherError) -> None:
        """The server said `conn` is going away (`err`); new creates should go elsewhere."""

    def connection_ended(self, conn: Connection) -> None:
        """`conn`'s call is over."""


class Connection:
    """One bidi `Session` call and the creates on it (see the module notes)."""

    def __init__(self, owner: Owner, call: grpc.aio.StreamStreamCall, number: int) -> None:
        self.owner = owner
        self.call = call
        self.number = number
        self.unacked: dict[str, Pending] = {}
        self.waiting: defaultdict[str, deque[Pending]] = defaultdict(deque)
        self.active: dict[str, Pending] = {}  # response id -> pending
        self.lane_active: defaultdict[str, deque[Pending]] = defaultdict(deque)
        self.draining = False  # takes no new creates; closes once idle
        self.closed = False
        self.end_error: TetherError | None = None  # the server's connection-level error, if any
        self._cancelled_by_us = False
        self._outq: asyncio.Queue[service_pb2.SessionRequest] = asyncio.Queue()
        self._writer = asyncio.create_task(self._write_loop(), name=f"tether-client-write-{number}")
        self.reader = asyncio.create_task(self._read_loop(), name=f"tether-client-read-{number}")

    @property
    def usable(self) -> bool:
        return not (self.draining or self.closed)

    @property
    def idle(self) -> bool:
        return not (self.unacked or self.active or any(self.waiting.values()))

    def submit(self, p: Pending) -> None:
        self.waiting[p.lane].append(p)
        self._pump(p.lane)

    def withdraw(self, p: Pending) -> bool:
        """Take back `p` if it is still waiting to be sent here."""
        queue = self.waiting.get(p.lane)
        if queue and p in queue:
            queue.remove(p)
            return True
        return False

    def send(self, request: service_pb2.SessionRequest) -> None:
        if not self.closed:
            self._outq.put_nowait(request)

    def _pump(self, lane: str) -> None:
        if not self.usable or lane in self.unacked:
            return
        queue = self.waiting.get(lane)
        if not queue:
            return
        p = queue.popleft()
        self.unacked[lane] = p
        p.attempts += 1
        p.carrier = self
        self._outq.put_nowait(service_pb2.SessionRequest(create=p.params))

    def retire(self) -> None:
        """Take no more creates: hand the unsent ones back to the owner, close once idle."""
        if self.draining:
            return
        self.draining = True
        for queue in self.waiting.values():
            while queue:
                self.owner.resubmit(queue.popleft(), delay=0.0)
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if self.draining and self.idle and not self.closed:
            self.cancel()

    def cancel(self) -> None:
        self._cancelled_by_us = True
        self.call.cancel()

    async def _write_loop(self) -> None:
        try:
            while True:
                request = await self._outq.get()
                await self.call.write(request)
        except asyncio.CancelledError:
            return
        except Exception:  # noqa: BLE001 - the call ended (AioRpcError, UsageError, ...): the reader reports why
            return

    async def _read_loop(self) -> None:
        error: TetherError | None = None
        retryable = True
        try:
            while True:
                message = await self.call.read()
                if message is grpc.aio.EOF:
                    break
                for ev in cast(service_pb2.SessionResponse, message).events:  # grpc's stubs type a read as object
                    self._dispatch(ev)
        except grpc.aio.AioRpcError as exc:
            if not (self._cancelled_by_us and exc.code() == grpc.StatusCode.CANCELLED):
                error = error_from_rpc(exc)
                retryable = exc.code() in RETRYABLE_STATUS
        except asyncio.CancelledError:
            pass
        except Exception:  # noqa: BLE001 - a dispatch bug must not leave streams hanging
            log.exception("tether client: reading the session failed")
            error = TetherError(errors.SERVER_ERROR, "The client failed to read the session.")
            retryable = False
        finally:
            self._ended(error, retryable)

    # -- routing ----------------------------------------------------------------------------------

    def _dispatch(self, ev: events_pb2.ServerEvent) -> None:
        arm = ev.WhichOneof("event")
        lane = ev.stream_id
        rid = ev.response_id
        if arm in ("inject_created", "inject_failed"):  # the answer to a `ResponseStream.inject`
            target = self.active.get(getattr(ev, arm).response_id)
            if target is not None:
                target.stream._feed(ev)
            else:  # its response has ended: the session's unrouted events
                self.owner.unrouted(ev)
            return
        if rid:
            p = self.active.get(rid)
            if p is None:
                p = self.unacked.pop(lane, None)
                if p is None:
                    self.owner.unrouted(ev)
                    return
                self.active[rid] = p
                self.lane_active[lane].append(p)
                p.stream._ack(rid)
                if p.cancel_requested:
                    self.send(service_pb2.SessionRequest(cancel=service_pb2.CancelRequest(response_id=rid)))
                self._pump(lane)
            p.stream._feed(ev)
            if arm in TERMINAL_ARMS:
                response = getattr(ev, arm).response
                del self.active[rid]
                with contextlib.suppress(ValueError):
                    self.lane_active[lane].remove(p)
                if response.status in ("completed", "incomplete"):
                    self.owner.lane_completed(lane, rid)
                if arm == "failed" and response.error.code in RETRY_CODES:
                    # The server ended the connection mid-generation: the turn is to be redone.
                    p.stream._end(error=ConnectionLost(response.error.code, response.error.message))
                else:
                    p.stream._end(response=response)
                self._close_if_idle()
            return
        if arm != "error":
            self.owner.unrouted(ev)  # steer events and future connection-scoped events
            return
        err = TetherError.from_proto(ev.error.error)
        p = self.unacked.get(lane)
        if err.code in _CONNECTION_CODES:
            self.end_error = err
            if p is not None and err.code in RETRY_CODES:
                del self.unacked[lane]
                self.owner.resubmit(p, delay=None)  # never started here: send it elsewhere
            self.retire()
            self.owner.connection_ending(self, err)
            return
        if p is None and self.lane_active.get(lane):
            p = self.lane_active[lane][0]  # an error after `created` (a crashed turn)
            self.lane_active[lane].popleft()
            self.active.pop(p.stream.id or "", None)
        elif p is not None:
            del self.unacked[lane]
        if p is None:
            self.owner.unrouted(ev)
            return
        p.stream._feed(ev)
        p.stream._end(error=err, error_event=True)
        self._pump(lane)
        self._close_if_idle()

    def _ended(self, error: TetherError | None, retryable: bool) -> None:
        self.closed = True
        self._writer.cancel()
        owner = self.owner
        reason = self.end_error or error
        unsent = [*self.unacked.values(), *(p for q in self.waiting.values() for p in q)]
        self.unacked.clear()
        self.waiting.clear()
        for p in unsent:
            if owner.closed:
                p.stream._end(error=ConnectionLost(CONNECTION_LOST, "The client session was closed."))
            elif retryable:
                owner.resubmit(p, delay=None, cause=reason)
            else:
                p.stream._end(error=error or ConnectionLost(CONNECTION_LOST, "The connection ended."))
        if self.active:
            code = reason.code if reason else CONNECTION_LOST
            message = (
                "The client session was closed." if owner.closed
                else f"The connection ended while the response was generating ({reason.message if reason else 'no reason given'})."
            )
            for p in list(self.active.values()):
                lost = ConnectionLost(code, message)
                stored = not p.params.HasField("store") or p.params.store
                # An unannounced drop: the server runs a stored response on. (One that announced
                # its end, e.g. `server_shutting_down`, ends its responses with the connection.)
                if stored and not owner.closed and p.stream.id and self.end_error is None:
                    owner.resume(p, cause=lost)
                else:
                    p.stream._end(error=lost)
            self.active.clear()
            self.lane_active.clear()
        owner.connection_ended(self)
