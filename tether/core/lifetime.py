"""A connection's time limits as a pure rule: when the watchdog of a session wakes, it asks
`check` what is due, with the time from the session's clock, and sleeps for what `check` says.

- `connection_lifetime_s` after it opened, a connection ends (`websocket_connection_limit_reached`),
  whatever it is doing (its running turns get `lifetime_grace_s` to finish);
- `idle_timeout_s` after its last client event, a connection with nothing queued or running ends
  (`idle_timeout`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# The watchdog looks again at least this often (a clock jump or a limit that changes is noticed)
# and at most this often (no busy loop at a deadline).
MAX_SLEEP_S = 5.0
MIN_SLEEP_S = 0.01


class Ending(enum.Enum):
    LIFETIME = "lifetime"
    IDLE = "idle"


@dataclass(frozen=True)
class Check:
    ending: Ending | None  # what is due now, if anything
    sleep_s: float  # otherwise: how long until the next look


def check(now: float, *, opened_at: float, last_activity: float, idle: bool, lifetime_s: float,
          idle_timeout_s: float) -> Check:  # fmt: skip
    """What is due at `now` for a connection opened at `opened_at`, whose last client event
    came at `last_activity`, with nothing queued or running when `idle`."""
    deadline = opened_at + lifetime_s
    if now >= deadline:
        return Check(Ending.LIFETIME, 0.0)
    idle_at = last_activity + idle_timeout_s
    if idle and now >= idle_at:
        return Check(Ending.IDLE, 0.0)
    wake = min(deadline, idle_at if idle else now + idle_timeout_s)
    return Check(None, max(MIN_SLEEP_S, min(wake - now, MAX_SLEEP_S)))
