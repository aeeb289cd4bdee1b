"""The blocking facade: the async client on a private event loop thread, for scripts.

    with tether.client.connect_sync("127.0.0.1:50051") as s:
        print(s.create(model="tether-sim", input="hello").text())

Every method blocks until the async one finishes; streams iterate synchronously. Tool functions
given to `run_tool_loop` may be plain functions (run in worker threads) or coroutines.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar, cast

from tether.client._connection import RetryPolicy
from tether.client._params import InputLike
from tether.client._session import DEFAULT_TARGET, ClientLane, ClientSession, connect
from tether.client._streams import ResponseStream
from tether.responses.v1 import events_pb2, items_pb2, response_pb2, service_pb2

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="tether-client-loop", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking tether client call from inside its own loop thread would deadlock")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def iterate(self, it: AsyncIterator[T]) -> Iterator[T]:
        """An async iterator of the loop, read item by item from this thread."""
        while True:
            ok, item = self.run(_next(it))
            if not ok:
                return
            yield cast(T, item)  # ok: an item, not _next's None

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


async def _next(it: AsyncIterator[T]) -> tuple[bool, T | None]:
    try:
        return True, await it.__anext__()
    except StopAsyncIteration:
        return False, None


class SyncResponseStream:
    """The blocking view of a `ResponseStream` (`for ev in stream: ...`)."""

    def __init__(self, stream: ResponseStream, runner: _LoopThread) -> None:
        self.aio = stream
        self._runner = runner
        self._run = runner.run

    @property
    def id(self) -> str | None:
        return self.aio.id

    @property
    def stream_id(self) -> str:
        return self.aio.stream_id

    def __iter__(self) -> Iterator[events_pb2.ServerEvent]:
        return self._runner.iterate(self.aio)

    def wait_created(self) -> str:
        return self._run(self.aio.wait_created())

    def final_response(self) -> response_pb2.Response:
        return self._run(self.aio.final_response())

    def text(self) -> str:
        return self._run(self.aio.text())

    def text_deltas(self) -> Iterator[str]:
        return self._runner.iterate(self.aio.text_deltas())

    def cancel(self) -> None:
        self._run(self.aio.cancel())


class SyncClientLane:
    """The blocking twin of `ClientLane`."""

    def __init__(self, lane: ClientLane, runner: _LoopThread) -> None:
        self.aio = lane
        self._runner = runner
        self._run = runner.run

    @property
    def name(self) -> str:
        return self.aio.name

    @property
    def last_response_id(self) -> str:
        return self.aio.last_response_id

    def create(self, model: str, input: InputLike = None, **kwargs: Any) -> SyncResponseStream:
        return SyncResponseStream(self._run(self.aio.create(model, input, **kwargs)), self._runner)

    def warmup(self, model: str, **kwargs: Any) -> str:
        return self._run(self.aio.warmup(model, **kwargs))

    def run_tool_loop(self, model: str, input: InputLike = None, **kwargs: Any) -> response_pb2.Response:
        return self._run(self.aio.run_tool_loop(model, input, **kwargs))


class SyncClientSession:
    """The blocking twin of `tether.client.ClientSession` (same methods, same arguments)."""

    def __init__(self, session: ClientSession, runner: _LoopThread) -> None:
        self.aio = session
        self._runner = runner
        self._run = runner.run

    def __enter__(self) -> SyncClientSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def reconnects(self) -> int:
        return self.aio.reconnects

    @property
    def connections_opened(self) -> int:
        return self.aio.connections_opened

    def create(self, model: str, input: InputLike = None, **kwargs: Any) -> SyncResponseStream:
        return SyncResponseStream(self._run(self.aio.create(model, input, **kwargs)), self._runner)

    def warmup(self, model: str, **kwargs: Any) -> str:
        return self._run(self.aio.warmup(model, **kwargs))

    def run_tool_loop(
        self, model: str, input: InputLike = None, *, tools: dict[str, Callable[..., Any]], **kwargs: Any
    ) -> response_pb2.Response:
        return self._run(self.aio.run_tool_loop(model, input, tools=tools, **kwargs))

    def lane(self, name: str) -> SyncClientLane:
        return SyncClientLane(self.aio.lane(name), self._runner)

    def reconnect(self) -> None:
        self._run(self.aio.reconnect())

    def get(self, response_id: str) -> response_pb2.Response:
        return self._run(self.aio.get(response_id))

    def delete(self, response_id: str) -> bool:
        return self._run(self.aio.delete(response_id))

    def list_input_items(self, response_id: str, **kwargs: Any) -> service_pb2.ListInputItemsResponse:
        return self._run(self.aio.list_input_items(response_id, **kwargs))

    def iter_input_items(self, response_id: str, *, order: str = "asc", page_size: int = 100) -> Iterator[items_pb2.Item]:
        return self._runner.iterate(self.aio.iter_input_items(response_id, order=order, page_size=page_size))

    def count_input_tokens(self, model: str = "", input: InputLike = None, **fields: Any) -> int:
        return self._run(self.aio.count_input_tokens(model, input, **fields))

    def compact(self, model: str, input: InputLike = None, **fields: Any) -> service_pb2.CompactResponseResponse:
        return self._run(self.aio.compact(model, input, **fields))

    def list_models(self) -> list[service_pb2.Model]:
        return self._run(self.aio.list_models())

    def close(self) -> None:
        try:
            self._run(self.aio.aclose())
        finally:
            self._runner.stop()


def connect_sync(
    target: str = DEFAULT_TARGET,
    *,
    api_key: str | None = None,
    tls_ca: str | None = None,
    tls: bool = False,
    retry: RetryPolicy | None = None,
    metadata: tuple[tuple[str, str], ...] = (),
    timeout_s: float | None = 60.0,
    verify: bool = True,
) -> SyncClientSession:
    """`connect()` for blocking code: returns an open `SyncClientSession` (use `with` or `close()`)."""
    runner = _LoopThread()
    connector = connect(
        target, api_key=api_key, tls_ca=tls_ca, tls=tls, retry=retry, metadata=metadata, timeout_s=timeout_s,
        verify=verify,
    )
    try:
        session = runner.run(connector.open())
    except BaseException:
        runner.stop()
        raise
    return SyncClientSession(session, runner)
