"""A lane: the FIFO of creates on one `stream_id` of a connection (the session runs each lane's
turns in order, lanes concurrently), and the steers that wait for a continuation on it."""

from __future__ import annotations

import asyncio
from collections import deque

from tether.core.checked import CheckedCreate
from tether.responses.v1 import items_pb2, request_pb2

# A queued create: its params (checked already when its entry checked them: a stateless create's),
# the client's event id and the bytes charged to its connection's pending bytes (tether.core.queued).
Queued = tuple[request_pb2.ResponseCreateParams | CheckedCreate, str, int]


class Lane:
    def __init__(self, name: str) -> None:
        self.name = name
        self.queue: deque[Queued] = deque()
        self.worker: asyncio.Task | None = None
        self.last_response_id = ""
        # Steers accepted for a response that stopped for tool output: merged into the next
        # create that continues that response.
        self.pending_steers: dict[str, list[list[items_pb2.Item]]] = {}

    @property
    def busy(self) -> bool:
        return bool(self.queue) or (self.worker is not None and not self.worker.done())

    def take_pending_steer(self, previous_response_id: str) -> list[list[items_pb2.Item]]:
        return self.pending_steers.pop(previous_response_id, []) if previous_response_id else []
