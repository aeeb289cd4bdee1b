"""The bytes of creates a server holds before they are done: bounded per connection, per API key
and per process, so that one tenant's backlog cannot take the memory every tenant shares.

A create is charged its size as received (a WebSocket frame's or an HTTP body's JSON text; over
gRPC its protobuf size, `ByteSize()`) when its connection accepts it, and released when its turn
ends: while it waits in a lane, for a free `max_active_responses` slot, and while it generates
(its input is held until then). Counts (`max_queued_responses`, `max_active_responses`) bound how many; these
bound how much:

- `max_queued_bytes_per_connection`: one WebSocket or gRPC session (an HTTP create is a session
  of one turn);
- `max_queued_bytes_per_key`: every connection of one API key together;
- `max_queued_bytes_per_process`: everything the process holds.

A create that does not fit what is left is refused with 429 `too_many_queued_bytes` (retry once
some turns have ended); one larger than a whole budget could never be accepted and is 413
`request_too_large`. 0 turns a bound off.
"""

from __future__ import annotations

from collections import Counter

from tether import errors
from tether.config import Limits
from tether.errors import TetherError


class QueuedBytes:
    """The per-key and per-process counts (one per engine); each session keeps its own count and
    passes it to `admit`."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.total = 0
        self._per_key: Counter[str] = Counter()

    def of_key(self, tenant: str) -> int:
        return self._per_key.get(tenant, 0)

    def admit(self, tenant: str, connection_bytes: int, nbytes: int) -> None:
        """Charge `nbytes` to `tenant` (whose connection holds `connection_bytes` already), or
        raise the refusal. Nothing is charged when it raises."""
        limits = self.limits
        scopes = (
            ("connection", limits.max_queued_bytes_per_connection, connection_bytes),
            ("API key", limits.max_queued_bytes_per_key, self.of_key(tenant)),
            ("server", limits.max_queued_bytes_per_process, self.total),
        )
        for scope, limit, _ in scopes:
            if limit and nbytes > limit:
                raise TetherError(
                    errors.REQUEST_TOO_LARGE,
                    f"This request is {nbytes} bytes; the {scope} holds at most {limit} bytes of pending requests.",
                )
        for scope, limit, held in scopes:
            if limit and held + nbytes > limit:
                raise TetherError(
                    errors.QUEUED_BYTES_FULL,
                    f"Too many bytes of requests pending on this {scope} ({held} held, limit {limit}); "
                    "retry once earlier responses have finished.",
                )
        self.charge(tenant, nbytes)

    def charge(self, tenant: str, nbytes: int) -> None:
        """Charge without a check (a steer's successor: the server made it, not the client)."""
        self._per_key[tenant] += nbytes
        self.total += nbytes

    def release(self, tenant: str, nbytes: int) -> None:
        left = self._per_key[tenant] - nbytes
        if left > 0:
            self._per_key[tenant] = left
        else:
            self._per_key.pop(tenant, None)
        self.total -= nbytes
