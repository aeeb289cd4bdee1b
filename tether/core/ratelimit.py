"""Per-API-key (tenant) rate limits: token buckets for requests and tokens per minute.

A create (or a `POST /v1/responses/compact`) is admitted when both buckets can pay (1 request,
its input tokens); output tokens are charged when the response finishes (the bucket may go
negative, which delays the next create, the way upstream providers account for reserved output).
A compaction inside a turn (`context_management`) is one more model call: its request and input
tokens are charged without a check (`charge`), its output tokens like a response's. Refusals are 429
`rate_limit_exceeded` with the seconds until the request would be admitted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tether import errors
from tether.errors import TetherError


@dataclass
class Bucket:
    per_minute: float
    level: float = field(init=False)
    stamp: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.level = self.per_minute

    def refill(self, now: float) -> None:
        elapsed = max(0.0, now - self.stamp)  # a new bucket is stamped after `now` was read
        self.level = min(self.per_minute, self.level + elapsed * self.per_minute / 60.0)
        self.stamp = max(self.stamp, now)

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` can be paid (0 when it can be paid now)."""
        if self.level >= amount:
            return 0.0
        return (min(amount, self.per_minute) - self.level) * 60.0 / self.per_minute


class RateLimiter:
    def __init__(self, requests_per_minute: int, tokens_per_minute: int) -> None:
        self._rpm = requests_per_minute
        self._tpm = tokens_per_minute
        self._requests: dict[str, Bucket] = {}
        self._tokens: dict[str, Bucket] = {}

    @property
    def enabled(self) -> bool:
        return bool(self._rpm or self._tpm)

    @property
    def charges_input_tokens(self) -> bool:
        """Whether `admit` needs the exact input token count (a tokens-per-minute budget is set)."""
        return bool(self._tpm)

    def admit(self, tenant: str, input_tokens: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        buckets = []
        if self._rpm:
            buckets.append((self._bucket(self._requests, tenant, self._rpm, now), 1.0, "requests"))
        if self._tpm:
            buckets.append((self._bucket(self._tokens, tenant, self._tpm, now), float(input_tokens), "tokens"))
        for bucket, amount, kind in buckets:
            wait = bucket.wait_for(amount)
            if wait > 0:
                raise TetherError(
                    errors.RATE_LIMIT_EXCEEDED,
                    f"Rate limit reached for {kind} per minute. Please try again in {wait:.3g}s.",
                    retry_after=wait,
                )
        for bucket, amount, _ in buckets:
            bucket.level -= amount

    def charge_output(self, tenant: str, output_tokens: int) -> None:
        bucket = self._tokens.get(tenant)
        if bucket is not None:
            bucket.level -= output_tokens

    def charge(self, tenant: str, input_tokens: int) -> None:
        """A model call the tenant did not ask for separately (in-turn compaction): one request and
        its input tokens are paid without a check (the buckets may go negative, which delays the
        tenant's next create), like output tokens."""
        if not self.enabled:
            return
        now = time.monotonic()
        if self._rpm:
            self._bucket(self._requests, tenant, self._rpm, now).level -= 1.0
        if self._tpm:
            self._bucket(self._tokens, tenant, self._tpm, now).level -= float(input_tokens)

    @staticmethod
    def _bucket(table: dict[str, Bucket], tenant: str, per_minute: int, now: float) -> Bucket:
        bucket = table.get(tenant)
        if bucket is None:
            bucket = table[tenant] = Bucket(float(per_minute))
        bucket.refill(now)
        return bucket
