"""Redis store (`store = "redis://host:6379/0?ttl_s=2592000"`), on redis.asyncio.

Layout (P = the `prefix` option, default "tether"; T = the tenant, percent-encoded so it holds no
`:` or `}`; every key of a tenant shares the hash tag `{t:T}`, so they live in one Cluster slot):

* `P:{t:T}:i:<item key>`: a hash per item: `d` serialized Item proto, `i` API item id, `r` the
  number of stored responses referencing it.
* `P:{t:T}:r:<response id>`: a hash per response: `d` serialized Response proto, `tok`
  conversation tokens, `in` / `out` the ordered key lists as JSON arrays, `ca` created_at, `rep`
  the backend-pool replica that served it, `ep` its writer's fencing token: a write with a lower
  one than this, or than its run's (`P:{t:T}:run:<id>`, field `ep`, `redis_runs`), is refused
  (`FencedWrite`).
* `P:{usage}:stream`: the usage ledger, a stream (XADD, one entry per response, fields as in
  UsageRecord); `P:{usage}:seen`: the idempotency set, members `[tenant, response_id]` as JSON.
  A Lua script does `SADD seen member` and XADDs only when the member is new (the "SETNX on the
  response id"), atomically, so a record is never half-written and never duplicated. Neither key
  expires: the ledger is durable.

Every operation is one network round trip: each is a single command or a single EVALSHA of a
Lua script (the scripts are loaded by `open()`; redis-py reloads one transparently after a
server restart flushed the script cache). Hydration (`load_context`) is one EVALSHA: the script
reads the response hash, decodes the key lists with cjson and HGETs every item server-side,
returning [response, tokens, n_inputs, replica, key1, item1, key2, item2, ...]. Lua scripts run
atomically, so hydration is a consistent snapshot and writes are all-or-nothing. The scripts
touch keys they compute from the response's key lists rather than keys declared in KEYS: fine
on standalone / Sentinel Redis (what the tests run); on Cluster all of a tenant's keys share one
slot thanks to the hash tag.

TTL (`ttl_s`, default 30 days; 0 = never expire): a response hash gets `ttl_s` when written;
items it references get `ttl_s` too, refreshed (extended, never shortened) whenever a newer
response references them, so an item always lives at least as long as every live response that
references it. With ttl_s = 0 referenced items are made persistent.

* `P:{t:T}:c:<conversation id>`: the serialized Conversation proto; `P:{t:T}:ci:<conversation
  id>`: its items, a list of `<API item id> NUL <serialized Item>` entries in order. Appends and
  item deletion are Lua scripts (all-or-nothing, and an append to a deleted conversation writes
  nothing); conversations do not expire.

Deletion: `delete_response` decrements the reference count of each distinct key of the response
and deletes items that reach zero. A response that *expires* does not decrement its items'
counts; those items then simply expire on their own TTL once no newer response refreshes them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import quote

import redis.asyncio as aioredis

from tether.logging_setup import redact_url
from tether.responses.v1 import items_pb2, response_pb2, service_pb2

from ._common import (
    USAGE_FIELDS,
    FencedWrite,
    MissingItemError,
    check_page_args,
    item_api_id,
    parse_items,
    split_query_options,
    usage_from_mapping,
    usage_to_row,
)
from .base import Hydrated, ItemPage, KeyedItem, ResponseRecord, UsageRecord

DEFAULT_TTL_S = 30 * 24 * 3600
URL_OPTIONS = ("ttl_s", "prefix")

# KEYS[1] response hash; ARGV[1] item key prefix.
# -> false | {response, tokens, n_inputs, replica, key, item, key, item, ...} (a missing item is nil)
_HYDRATE_LUA = """
local r = redis.call('HMGET', KEYS[1], 'd', 'tok', 'in', 'out', 'rep')
if not r[1] then return false end
local ins = cjson.decode(r[3])
local outs = cjson.decode(r[4])
local res = {r[1], r[2], #ins, r[5] or ''}
for _, list in ipairs({ins, outs}) do
  for _, k in ipairs(list) do
    res[#res + 1] = k
    res[#res + 1] = redis.call('HGET', ARGV[1] .. k, 'd')
  end
end
return res
"""

# KEYS[1] response hash, KEYS[2] its run's hash (redis_runs); ARGV: item prefix, ttl, response
# bytes, tokens, in json, out json, created_at, replica, epoch, then (key, item_id, item bytes)
# per new item. -> {1} | {0, missing key} | {2} (fenced: the response was written, or its run is
# owned, with a higher epoch)
_PUT_LUA = """
local prefix, ttl, epoch = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[9])
if tonumber(redis.call('HGET', KEYS[1], 'ep') or '0') > epoch then return {2} end
if tonumber(redis.call('HGET', KEYS[2], 'ep') or '0') > epoch then return {2} end
local new = {}
for j = 10, #ARGV, 3 do new[ARGV[j]] = j end
local refs, order = {}, {}
for _, list in ipairs({cjson.decode(ARGV[5]), cjson.decode(ARGV[6])}) do
  for _, k in ipairs(list) do
    if not refs[k] then refs[k] = true; order[#order + 1] = k end
  end
end
for _, k in ipairs(order) do
  if not new[k] and redis.call('EXISTS', prefix .. k) == 0 then return {0, k} end
end
local created = {}
for k, j in pairs(new) do
  local ik = prefix .. k
  if redis.call('EXISTS', ik) == 0 then
    redis.call('HSET', ik, 'd', ARGV[j + 2], 'i', ARGV[j + 1], 'r', 0)
    created[k] = true
  end
end
for _, k in ipairs(order) do
  local ik = prefix .. k
  redis.call('HINCRBY', ik, 'r', 1)
  if ttl <= 0 then
    redis.call('PERSIST', ik)
  elseif created[k] then
    redis.call('EXPIRE', ik, ttl)
  else
    local left = redis.call('TTL', ik)
    if left >= 0 and left < ttl then redis.call('EXPIRE', ik, ttl) end
  end
end
if ttl > 0 then
  for k, _ in pairs(created) do
    if not refs[k] then redis.call('EXPIRE', prefix .. k, ttl) end
  end
end
local old = redis.call('HMGET', KEYS[1], 'in', 'out')
if old[1] then
  local seen = {}
  for _, list in ipairs({cjson.decode(old[1]), cjson.decode(old[2] or '[]')}) do
    for _, k in ipairs(list) do
      if not seen[k] then
        seen[k] = true
        local ik = prefix .. k
        if redis.call('EXISTS', ik) == 1 and redis.call('HINCRBY', ik, 'r', -1) <= 0 then
          redis.call('DEL', ik)
        end
      end
    end
  end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'd', ARGV[3], 'tok', ARGV[4], 'in', ARGV[5], 'out', ARGV[6], 'ca', ARGV[7], 'rep', ARGV[8],
           'ep', ARGV[9])
if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
return {1}
"""

# KEYS[1] response hash; ARGV[1] item prefix. -> 1 deleted | 0 no such response
_DELETE_LUA = """
local old = redis.call('HMGET', KEYS[1], 'in', 'out')
if not old[1] then return 0 end
local seen = {}
for _, list in ipairs({cjson.decode(old[1]), cjson.decode(old[2] or '[]')}) do
  for _, k in ipairs(list) do
    if not seen[k] then
      seen[k] = true
      local ik = ARGV[1] .. k
      if redis.call('EXISTS', ik) == 1 and redis.call('HINCRBY', ik, 'r', -1) <= 0 then
        redis.call('DEL', ik)
      end
    end
  end
end
redis.call('DEL', KEYS[1])
return 1
"""

# KEYS[1] response hash; ARGV: item prefix, after ('' = none), limit, order.
# -> false | {has_more, item, item, ...} | {-1, missing key}
_PAGE_LUA = """
local r = redis.call('HGET', KEYS[1], 'in')
if not r then return false end
local ins = cjson.decode(r)
local limit = tonumber(ARGV[3])
local first, last, step = 1, #ins, 1
if ARGV[4] == 'desc' then first, last, step = #ins, 1, -1 end
local res = {0}
local started = ARGV[2] == ''
local count = 0
for idx = first, last, step do
  local ik = ARGV[1] .. ins[idx]
  if not started then
    if redis.call('HGET', ik, 'i') == ARGV[2] then started = true end
  else
    if count == limit then res[1] = 1; break end
    local d = redis.call('HGET', ik, 'd')
    if not d then return {-1, ins[idx]} end
    res[#res + 1] = d
    count = count + 1
  end
end
return res
"""

# KEYS[1] conversation, KEYS[2] its item list; ARGV: entries. -> 0 (no conversation) | 1
_CONV_APPEND_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if #ARGV > 0 then redis.call('RPUSH', KEYS[2], unpack(ARGV)) end
return 1
"""

# KEYS[1] conversation item list; ARGV[1] "<item id>\0". -> 1 deleted | 0 not found
_CONV_DELETE_ITEM_LUA = """
local n = string.len(ARGV[1])
for _, entry in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  if string.sub(entry, 1, n) == ARGV[1] then
    redis.call('LREM', KEYS[1], 1, entry)
    return 1
  end
end
return 0
"""

# KEYS[1] idempotency set, KEYS[2] stream; ARGV[1] member, then field, value, ...
_USAGE_LUA = """
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
local args = {'XADD', KEYS[2], '*'}
for i = 2, #ARGV do args[#args + 1] = ARGV[i] end
redis.call(unpack(args))
return 1
"""


class RedisStore:
    def __init__(self, url: str, *, ttl_s: int = DEFAULT_TTL_S, prefix: str = "tether") -> None:
        self.url = url
        self.ttl_s = int(ttl_s)
        if self.ttl_s < 0:
            raise ValueError(f"ttl_s must be >= 0 (0 = never expire), not {ttl_s!r}")
        if not prefix:
            raise ValueError("prefix must not be empty")
        self.prefix = prefix
        self._client: aioredis.Redis | None = None
        self._scripts: dict[str, Any] = {}

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisStore:
        clean, url_options = split_query_options(url, URL_OPTIONS)
        return cls(clean, **{**url_options, **options})

    # -- key names (public for tests and operators) --------------------------------------

    def _tenant_tag(self, tenant: str) -> str:
        return f"{self.prefix}:{{t:{quote(tenant, safe='')}}}"

    def response_key(self, tenant: str, response_id: str) -> str:
        return f"{self._tenant_tag(tenant)}:r:{response_id}"

    def run_key(self, tenant: str, response_id: str) -> str:
        """The hash of the response's run shared between replicas (`redis_runs`): its `ep` field
        is the run's fencing token, which `put_response` checks."""
        return f"{self._tenant_tag(tenant)}:run:{response_id}"

    def item_prefix(self, tenant: str) -> str:
        return f"{self._tenant_tag(tenant)}:i:"

    def item_key(self, tenant: str, key: str) -> str:
        return self.item_prefix(tenant) + key

    def conversation_key(self, tenant: str, conversation_id: str) -> str:
        return f"{self._tenant_tag(tenant)}:c:{conversation_id}"

    def conversation_items_key(self, tenant: str, conversation_id: str) -> str:
        return f"{self._tenant_tag(tenant)}:ci:{conversation_id}"

    @property
    def usage_stream_key(self) -> str:
        return f"{self.prefix}:{{usage}}:stream"

    @property
    def usage_seen_key(self) -> str:
        return f"{self.prefix}:{{usage}}:seen"

    # -- plumbing ------------------------------------------------------------------------

    @property
    def client(self) -> aioredis.Redis:
        if self._client is None:
            raise RuntimeError("RedisStore is not open")
        return self._client

    async def open(self) -> None:
        if self._client is not None:
            return
        client = aioredis.from_url(self.url, decode_responses=False)
        try:
            await client.ping()
            scripts = {
                "hydrate": _HYDRATE_LUA,
                "put": _PUT_LUA,
                "delete": _DELETE_LUA,
                "page": _PAGE_LUA,
                "usage": _USAGE_LUA,
                "conv_append": _CONV_APPEND_LUA,
                "conv_delete_item": _CONV_DELETE_ITEM_LUA,
            }
            registered = {}
            for name, source in scripts.items():
                script = client.register_script(source)
                await client.script_load(source)  # so the first EVALSHA needs no retry
                registered[name] = script
        except (OSError, aioredis.RedisError) as exc:
            await client.aclose()
            raise ConnectionError(f"cannot connect to Redis at {redact_url(self.url)}: {exc}") from exc
        self._scripts = registered
        self._client = client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def ping(self) -> bool:
        if self._client is None:
            return False
        try:
            return bool(await self._client.ping())
        except Exception:
            return False

    # -- responses -----------------------------------------------------------------------

    async def put_response(self, record: ResponseRecord) -> None:
        tenant, rid = record.tenant, record.response.id
        if not rid:
            raise ValueError("response.id is empty")
        args: list[Any] = [
            self.item_prefix(tenant),
            self.ttl_s,
            record.response.SerializeToString(),
            record.conversation_tokens,
            json.dumps(list(record.input_keys), ensure_ascii=False, separators=(",", ":")),
            json.dumps(list(record.output_keys), ensure_ascii=False, separators=(",", ":")),
            record.response.created_at,
            record.replica,
            record.epoch,
        ]
        for keyed in record.new_items:
            args += [keyed.key, item_api_id(keyed.item), keyed.item.SerializeToString()]
        result = await self._scripts["put"](
            keys=[self.response_key(tenant, rid), self.run_key(tenant, rid)], args=args, client=self.client
        )
        if int(result[0]) == 0:
            raise MissingItemError(tenant, rid, result[1].decode())
        if int(result[0]) == 2:
            raise FencedWrite(tenant, rid, record.epoch)

    async def get_response(self, tenant: str, response_id: str) -> response_pb2.Response | None:
        data = await self.client.hget(self.response_key(tenant, response_id), "d")
        return None if data is None else response_pb2.Response.FromString(cast(bytes, data))  # decode_responses=False

    async def load_context(self, tenant: str, response_id: str) -> Hydrated | None:
        res = await self._scripts["hydrate"](
            keys=[self.response_key(tenant, response_id)], args=[self.item_prefix(tenant)], client=self.client
        )
        if res is None:
            return None
        n_inputs = int(res[2])
        keyed: list[KeyedItem] = []
        parse = items_pb2.Item.FromString
        for j in range(4, len(res), 2):
            key = res[j].decode()
            if res[j + 1] is None:
                raise MissingItemError(tenant, response_id, key)
            keyed.append(KeyedItem(key, parse(res[j + 1])))
        return Hydrated(
            response=response_pb2.Response.FromString(res[0]),
            inputs=keyed[:n_inputs],
            outputs=keyed[n_inputs:],
            conversation_tokens=int(res[1] or 0),
            replica=res[3].decode() if isinstance(res[3], bytes) else str(res[3] or ""),
        )

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        res = await self._scripts["delete"](
            keys=[self.response_key(tenant, response_id)], args=[self.item_prefix(tenant)], client=self.client
        )
        return int(res) == 1

    async def list_input_items(
        self, tenant: str, response_id: str, *, after: str | None, limit: int, order: str
    ) -> ItemPage | None:
        after = check_page_args(after, limit, order)
        res = await self._scripts["page"](
            keys=[self.response_key(tenant, response_id)],
            args=[self.item_prefix(tenant), after or "", limit, order],
            client=self.client,
        )
        if res is None:
            return None
        if int(res[0]) == -1:
            raise MissingItemError(tenant, response_id, res[1].decode())
        return ItemPage([items_pb2.Item.FromString(d) for d in res[1:]], int(res[0]) == 1)

    # -- usage ledger --------------------------------------------------------------------

    async def record_usage(self, record: UsageRecord) -> None:
        member = json.dumps([record.tenant, record.response_id], ensure_ascii=False)
        args: list[Any] = [member]
        for name, value in zip(USAGE_FIELDS, usage_to_row(record), strict=True):
            args += [name, repr(value) if isinstance(value, float) else value]
        await self._scripts["usage"](
            keys=[self.usage_seen_key, self.usage_stream_key], args=args, client=self.client
        )

    async def usage_records(self, tenant: str | None = None) -> list[UsageRecord]:
        records: list[UsageRecord] = []
        start = "-"
        while True:
            batch = cast(  # decode_responses=False: ids and fields are bytes (redis-py types either mode)
                list[tuple[bytes, dict[bytes, bytes]]],
                await self.client.xrange(self.usage_stream_key, min=start, max="+", count=1000),
            )
            if not batch:
                break
            for _, fields in batch:
                record = usage_from_mapping({k.decode(): v for k, v in fields.items()})
                if tenant is None or record.tenant == tenant:
                    records.append(record)
            if len(batch) < 1000:
                break
            last = batch[-1][0]
            start = "(" + (last.decode() if isinstance(last, bytes) else last)
        return records

    # -- conversations -------------------------------------------------------------------

    async def put_conversation(self, tenant: str, conversation: service_pb2.Conversation) -> None:
        await self.client.set(self.conversation_key(tenant, conversation.id), conversation.SerializeToString())

    async def update_conversation(self, tenant: str, conversation: service_pb2.Conversation) -> bool:
        key = self.conversation_key(tenant, conversation.id)
        return bool(await self.client.set(key, conversation.SerializeToString(), xx=True))  # only if it exists

    async def get_conversation(self, tenant: str, conversation_id: str) -> service_pb2.Conversation | None:
        data = await self.client.get(self.conversation_key(tenant, conversation_id))
        return None if data is None else service_pb2.Conversation.FromString(cast(bytes, data))  # decode_responses=False

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        conv = self.conversation_key(tenant, conversation_id)
        async with self.client.pipeline(transaction=True) as pipe:
            gone, _ = await pipe.delete(conv).delete(self.conversation_items_key(tenant, conversation_id)).execute()  # type: ignore[attr-defined]  # a Pipeline's command returns the pipeline (redis-py types it as the client's)
        return int(gone) == 1

    async def append_conversation_items(
        self, tenant: str, conversation_id: str, items: Sequence[items_pb2.Item]
    ) -> bool:
        entries = [item_api_id(i).encode() + b"\0" + i.SerializeToString() for i in items]
        keys = [self.conversation_key(tenant, conversation_id), self.conversation_items_key(tenant, conversation_id)]
        return int(await self._scripts["conv_append"](keys=keys, args=entries, client=self.client)) == 1

    async def conversation_items(self, tenant: str, conversation_id: str) -> list[items_pb2.Item] | None:
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.exists(self.conversation_key(tenant, conversation_id))
            pipe.lrange(self.conversation_items_key(tenant, conversation_id), 0, -1)
            exists, entries = await pipe.execute()
        if not exists:
            return None
        return await parse_items([entry.split(b"\0", 1)[1] for entry in entries])

    async def delete_conversation_item(self, tenant: str, conversation_id: str, item_id: str) -> bool:
        res = await self._scripts["conv_delete_item"](
            keys=[self.conversation_items_key(tenant, conversation_id)],
            args=[item_id.encode() + b"\0"],
            client=self.client,
        )
        return int(res) == 1

    # -- test aids -----------------------------------------------------------------------

    async def item_count(self, tenant: str) -> int:
        pattern = _glob_escape(self.item_prefix(tenant)) + "*"
        return sum([1 async for _ in self.client.scan_iter(match=pattern, count=1000)])


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
