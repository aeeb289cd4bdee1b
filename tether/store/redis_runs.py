"""The run bus on Redis (`tether.store.runbus`), on the store's own client and key prefix P.

Keys (T: the tenant's hash tag, as the store's other keys of that tenant):

* `P:{t:T}:run:<id>`: a hash: `owner` (replica id), `ep` (its fencing token: the ownership
  epoch, raised by a takeover and by an orphan's ending), `state`, `resp` (serialized Response as
  it stands), `next` (the next sequence number).
* `P:{t:T}:run:<id>:ev`: a Stream, one entry per event, field `e` the serialized ServerEvent,
  entry id `0-<sequence_number + 1>`: "the events above N" is `XREAD ... 0-<N + 1>`. It holds at
  most `replay_max_events` events and `replay_max_bytes` bytes of them (the hash's `nb` counts
  them): the publish script drops the oldest past either bound.
* `P:{runs}:replica:<replica id>`: a heartbeat, SET with a TTL of `run_orphan_after_s` every
  third of it; gone means the replica stopped.
* channel `P:{runs}:cancel`: cancels, `[tenant, run id]` as JSON; every replica listens and the
  owner acts.
* `P:{runs}:queued`: a sorted set of the hash keys of queued background runs (their hash holds
  `params`, `t` and `id` besides; `params` goes once the run leaves `queued`): a replica with capacity takes over one whose owner's
  heartbeat is gone (`claim`, a Lua script: one replica gets it); entries no longer queued are
  dropped as it scans.

Both keys of a run expire `replay_retention_s` after it ends, and at the latest
`live_ttl_s` after its last event while it runs (a run whose every replica died is gone then).
Writes are Lua scripts (all-or-nothing; a run already final never changes, and a write whose
epoch is not the run's is refused: fencing), one round trip per published batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis.asyncio as aioredis

from .runbus import Claimed, RunInfo

log = logging.getLogger("tether.store.redis_runs")

_FINAL_LUA = "local final = {completed = true, incomplete = true, failed = true, cancelled = true}\n"

# KEYS: hash, stream, queued index; ARGV: owner, state, response ('' keeps it), next, maxlen,
# ttl, params ('' none), score, maxbytes, epoch, then (seq, event) pairs. -> 1 written | 0
# refused: the run is already final, or another owner holds it (its epoch is not this one's).
# The oldest events go while the log holds more than maxlen of them or more than maxbytes bytes
# (at least the newest stays).
_PUBLISH_LUA = _FINAL_LUA + """
local r = redis.call('HMGET', KEYS[1], 'state', 'ep')
if r[1] and final[r[1]] then return 0 end
if r[2] and tonumber(r[2]) ~= tonumber(ARGV[10]) then return 0 end
local added = 0
for i = 11, #ARGV, 2 do
  redis.call('XADD', KEYS[2], '0-' .. (tonumber(ARGV[i]) + 1), 'e', ARGV[i + 1])
  added = added + #ARGV[i + 1]
end
if added > 0 then
  local nb = redis.call('HINCRBY', KEYS[1], 'nb', added)
  local maxlen, maxbytes = tonumber(ARGV[5]), tonumber(ARGV[9])
  local len = redis.call('XLEN', KEYS[2])
  while len > 1 and (len > maxlen or nb > maxbytes) do
    local oldest = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)[1]
    redis.call('XDEL', KEYS[2], oldest[1])
    nb = nb - #oldest[2][2]
    len = len - 1
  end
  redis.call('HSET', KEYS[1], 'nb', nb)
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'state', ARGV[2], 'next', ARGV[4], 'ep', ARGV[10])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'resp', ARGV[3]) end
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[1], 'params', ARGV[7])
  redis.call('ZADD', KEYS[3], ARGV[8], KEYS[1])
elseif ARGV[2] ~= 'queued' then
  redis.call('HDEL', KEYS[1], 'params')
end
redis.call('EXPIRE', KEYS[1], ARGV[6])
if #ARGV >= 11 then redis.call('EXPIRE', KEYS[2], ARGV[6]) end
return 1
"""

# KEYS: queued index; ARGV: replica key prefix, this replica, limit, scan.
# -> {tenant, id, params, response, epoch, ...} of the runs taken over (each one's epoch raised)
_CLAIM_LUA = """
local out, taken = {}, 0
for _, key in ipairs(redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[4]) - 1)) do
  local r = redis.call('HMGET', key, 'state', 'owner', 'params', 'resp', 't', 'id')
  if r[1] ~= 'queued' or not r[3] then
    redis.call('ZREM', KEYS[1], key)
  elseif taken < tonumber(ARGV[3]) and redis.call('EXISTS', ARGV[1] .. (r[2] or '')) == 0 then
    redis.call('HSET', key, 'owner', ARGV[2])
    local ep = redis.call('HINCRBY', key, 'ep', 1)
    taken = taken + 1
    out[#out + 1] = r[5]; out[#out + 1] = r[6]; out[#out + 1] = r[3]; out[#out + 1] = r[4] or ''
    out[#out + 1] = ep
  end
end
return out
"""

# KEYS: hash; ARGV: replica key prefix. -> false | {owner, state, resp, next, alive}
_INFO_LUA = """
local r = redis.call('HMGET', KEYS[1], 'owner', 'state', 'resp', 'next')
if not r[2] then return false end
local alive = redis.call('EXISTS', ARGV[1] .. (r[1] or ''))
return {r[1] or '', r[2], r[3] or '', r[4] or '0', alive}
"""

# KEYS: hash, stream; ARGV: next, event, response, ttl. -> 1 done (the epoch raised) | 0
_ORPHAN_LUA = _FINAL_LUA + """
local r = redis.call('HMGET', KEYS[1], 'state', 'next')
if not r[1] or final[r[1]] or tonumber(r[2] or '0') ~= tonumber(ARGV[1]) then return 0 end
redis.call('XADD', KEYS[2], '0-' .. (tonumber(ARGV[1]) + 1), 'e', ARGV[2])
redis.call('HSET', KEYS[1], 'state', 'failed', 'resp', ARGV[3], 'next', tonumber(ARGV[1]) + 1)
redis.call('HINCRBY', KEYS[1], 'ep', 1)
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return 1
"""


class RedisRunBus:
    def __init__(self, store: Any, *, orphan_after_s: float, max_events: int, retention_s: float,
                 live_ttl_s: float, max_bytes: int = 1 << 62, replica: str | None = None) -> None:  # fmt: skip
        self.store = store  # a RedisStore, open
        self.replica = replica or secrets.token_hex(8)
        self.orphan_after_s = orphan_after_s
        self.max_events = max(1, max_events)
        self.max_bytes = max(1, max_bytes)
        self.retention_s = max(1, int(retention_s))
        self.live_ttl_s = max(self.retention_s, int(live_ttl_s))
        prefix = store.prefix
        self.replica_prefix = f"{prefix}:{{runs}}:replica:"
        self.channel = f"{prefix}:{{runs}}:cancel"
        self.queued_key = f"{prefix}:{{runs}}:queued"  # a sorted set of queued runs' hash keys
        client: aioredis.Redis = store.client
        self._client = client
        self._publish = client.register_script(_PUBLISH_LUA)
        self._info = client.register_script(_INFO_LUA)
        self._orphan = client.register_script(_ORPHAN_LUA)
        self._claim = client.register_script(_CLAIM_LUA)
        self._tasks: list[asyncio.Task] = []
        self._pubsub: Any = None

    def _keys(self, tenant: str, run_id: str) -> list[str]:
        base = self.store.run_key(tenant, run_id)
        return [base, base + ":ev"]

    async def start(self, on_cancel: Callable[[str, str], None]) -> None:
        await self._beat()
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        await self._pubsub.subscribe(self.channel)
        self._tasks = [
            asyncio.create_task(self._heartbeat(), name="tether-run-heartbeat"),
            asyncio.create_task(self._listen(on_cancel), name="tether-run-cancels"),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
            self._pubsub = None
        with contextlib.suppress(Exception):  # a clean stop is no orphan: its runs ended first
            await self._client.delete(self.replica_prefix + self.replica)

    async def _beat(self) -> None:
        await self._client.set(self.replica_prefix + self.replica, b"1", px=max(1, int(self.orphan_after_s * 1000)))

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.orphan_after_s / 3)
            try:
                await self._beat()
            except Exception as exc:  # noqa: BLE001 - Redis away: try again next beat
                log.warning("run heartbeat failed: %s", exc)

    async def _listen(self, on_cancel: Callable[[str, str], None]) -> None:
        while True:
            try:
                message = await self._pubsub.get_message(timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                log.warning("run cancel listener: %s", exc)
                await asyncio.sleep(1.0)
                continue
            if message is None or message.get("type") != "message":
                continue
            try:
                tenant, run_id = json.loads(message["data"])
            except (ValueError, TypeError):
                continue
            on_cancel(tenant, run_id)

    async def publish(self, tenant: str, run_id: str, events: Sequence[tuple[int, bytes]], *, state: str,
                      response: bytes | None, next_seq: int, epoch: int, params: bytes | None = None) -> bool:  # fmt: skip
        ttl = self.retention_s if state in ("completed", "incomplete", "failed", "cancelled") else self.live_ttl_s
        keys = [*self._keys(tenant, run_id), self.queued_key]
        if params:  # the run's tenant and id, for a replica that takes it over
            await self._client.hset(keys[0], mapping={"t": tenant, "id": run_id})
        args: list[Any] = [self.replica, state, response or b"", next_seq, self.max_events, ttl, params or b"",
                           time.time(), self.max_bytes, epoch]  # fmt: skip
        for seq, data in events:
            args += [seq, data]
        return int(await self._publish(keys=keys, args=args, client=self._client)) == 1

    async def claim(self, limit: int) -> list[Claimed]:
        if limit <= 0:
            return []
        res = await self._claim(keys=[self.queued_key], args=[self.replica_prefix, self.replica, limit, 64],
                                client=self._client)  # fmt: skip
        return [Claimed(res[i].decode(), res[i + 1].decode(), bytes(res[i + 2]), bytes(res[i + 3]), int(res[i + 4]))
                for i in range(0, len(res), 5)]  # fmt: skip

    async def info(self, tenant: str, run_id: str) -> RunInfo | None:
        res = await self._info(keys=self._keys(tenant, run_id)[:1], args=[self.replica_prefix], client=self._client)
        if not res:
            return None
        owner, state, response, next_seq, alive = res
        return RunInfo(owner=owner.decode(), state=state.decode(), response=bytes(response),
                       next_seq=int(next_seq), owner_alive=int(alive) == 1)  # fmt: skip

    async def read(self, tenant: str, run_id: str, after: int, block_s: float) -> list[tuple[int, bytes]]:
        stream = self._keys(tenant, run_id)[1]
        block = int(block_s * 1000) if block_s > 0 else None
        res = cast(  # decode_responses=False: the reply is bytes throughout (redis-py types either mode)
            list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]] | None,
            await self._client.xread({stream: f"0-{after + 1}"}, count=1000, block=block),
        )
        out: list[tuple[int, bytes]] = []
        for _, entries in res or ():
            for entry_id, fields in entries:
                seq = int(entry_id.split(b"-")[1]) - 1
                out.append((seq, fields[b"e"]))
        return out

    async def cancel(self, tenant: str, run_id: str) -> None:
        await self._client.publish(self.channel, json.dumps([tenant, run_id]))

    async def fail_orphan(self, tenant: str, run_id: str, next_seq: int, event: bytes, response: bytes) -> bool:
        res = await self._orphan(keys=self._keys(tenant, run_id), args=[next_seq, event, response, self.retention_s],
                                 client=self._client)  # fmt: skip
        return int(res) == 1
