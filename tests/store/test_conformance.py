"""The store contract (tether/store/base.py), proven against every engine: memory, sqlite,
postgres, redis (see conftest.py for how the servers are found and isolated)."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from tether.config import Limits
from tether.core.conversations import Conversations
from tether.responses.v1 import items_pb2, response_pb2, service_pb2
from tether.store._common import FencedWrite, MissingItemError
from tether.store.base import Hydrated, KeyedItem, ResponseRecord, UsageRecord

T1, T2 = "tenant-a", "tenant-b"


# -- builders ------------------------------------------------------------------------------


def msg(item_id: str, role: str = "user", text: str | None = None) -> items_pb2.Item:
    return items_pb2.Item(
        message=items_pb2.Message(id=item_id, role=role, status="completed", content_text=text or item_id)
    )


def call(item_id: str) -> items_pb2.Item:
    return items_pb2.Item(
        function_call=items_pb2.FunctionCall(id=item_id, call_id=f"call_{item_id}", name="f", arguments="{}")
    )


def response(
    rid: str, *outputs: items_pb2.Item, prev: str = "", status: str = "completed"
) -> response_pb2.Response:
    return response_pb2.Response(
        id=rid,
        created_at=1_700_000_000,
        status=status,
        model="test-model",
        previous_response_id=prev,
        store=True,
        output=list(outputs),
        metadata={"k": "v"},
    )


class Chain:
    """Builds ResponseRecords the way the session core does: each turn's input is the parent's
    whole input + output plus the new input; only the new items are `new_items`."""

    def __init__(self, tenant: str = T1, prefix: str = "c") -> None:
        self.tenant = tenant
        self.prefix = prefix
        self.context: list[KeyedItem] = []  # parent input + parent output
        self.last: str = ""
        self.turn = 0

    def next(
        self, n_inputs: int = 1, n_outputs: int = 1, tokens: int = 0, replica: str = ""
    ) -> tuple[ResponseRecord, list, list]:
        t, p = self.turn, self.prefix
        self.turn += 1
        rid = f"resp_{p}_{t}"
        new_in = [KeyedItem(f"{p}:{t}:in{j}", msg(f"msg_{p}_{t}_in{j}")) for j in range(n_inputs)]
        outs = [
            KeyedItem(
                f"{p}:{t}:out{j}",
                call(f"fc_{p}_{t}_{j}") if j % 2 else msg(f"msg_{p}_{t}_out{j}", "assistant"),
            )
            for j in range(n_outputs)
        ]
        inputs = self.context + new_in
        record = ResponseRecord(
            tenant=self.tenant,
            response=response(rid, *[k.item for k in outs], prev=self.last),
            input_keys=[k.key for k in inputs],
            output_keys=[k.key for k in outs],
            new_items=new_in + outs,
            conversation_tokens=tokens,
            replica=replica,
        )
        self.context = inputs + outs
        self.last = rid
        return record, inputs, outs


def assert_hydrated(h: Hydrated | None, record: ResponseRecord, inputs: list, outputs: list) -> None:
    assert h is not None
    assert h.response == record.response
    assert [k.key for k in h.inputs] == [k.key for k in inputs]
    assert [k.item for k in h.inputs] == [k.item for k in inputs]
    assert [k.key for k in h.outputs] == [k.key for k in outputs]
    assert [k.item for k in h.outputs] == [k.item for k in outputs]
    assert h.conversation_tokens == record.conversation_tokens
    assert h.replica == record.replica


def usage(tenant: str, rid: str, **kw) -> UsageRecord:
    base = dict(
        tenant=tenant,
        response_id=rid,
        model="test-model",
        backend="fake",
        input_tokens=10,
        cached_tokens=4,
        output_tokens=5,
        reasoning_tokens=1,
        status="completed",
        created_at=1_700_000_000.25,
    )
    base.update(kw)
    return UsageRecord(**base)


# -- basics --------------------------------------------------------------------------------


async def test_ping(store):
    assert await store.ping() is True


async def test_put_get_and_load(store):
    chain = Chain()
    record, inputs, outs = chain.next(n_inputs=2, n_outputs=3, tokens=123)
    await store.put_response(record)
    got = await store.get_response(T1, record.response.id)
    assert got == record.response
    assert_hydrated(await store.load_context(T1, record.response.id), record, inputs, outs)


async def test_serving_replica_is_recorded_and_replaced(store):
    """The backend-pool replica that served a response comes back with it (chain-affine routing
    after a reconnect), per response of a chain, and a rewrite of the response replaces it."""
    chain = Chain()
    first, _, _ = chain.next(replica="http://10.0.0.1:8080/v1")
    second, inputs, outs = chain.next(replica="pool/1")
    unpooled, _, _ = chain.next()
    for record in (first, second, unpooled):
        await store.put_response(record)
    assert (await store.load_context(T1, first.response.id)).replica == "http://10.0.0.1:8080/v1"
    assert_hydrated(await store.load_context(T1, second.response.id), second, inputs, outs)
    assert (await store.load_context(T1, unpooled.response.id)).replica == ""
    moved = ResponseRecord(
        tenant=T1,
        response=second.response,
        input_keys=second.input_keys,
        output_keys=second.output_keys,
        new_items=[],
        replica="pool/3",
    )
    await store.put_response(moved)
    assert (await store.load_context(T1, second.response.id)).replica == "pool/3"
    assert (await store.load_context(T2, second.response.id)) is None  # tenant-scoped as ever


async def test_unknown_ids(store):
    assert await store.get_response(T1, "resp_nope") is None
    assert await store.load_context(T1, "resp_nope") is None
    assert await store.list_input_items(T1, "resp_nope", after=None, limit=10, order="asc") is None
    assert await store.delete_response(T1, "resp_nope") is False


async def test_chain_continuation(store):
    chain = Chain()
    for _ in range(5):
        record, inputs, outs = chain.next(n_inputs=2, n_outputs=2, tokens=chain.turn)
        await store.put_response(record)
    assert_hydrated(await store.load_context(T1, record.response.id), record, inputs, outs)
    assert len(inputs) == 4 * 4 + 2
    assert await store.item_count(T1) == 5 * 4  # every item stored once


async def test_empty_lists(store):
    record = ResponseRecord(
        tenant=T1, response=response("resp_empty"), input_keys=[], output_keys=[], new_items=[]
    )
    await store.put_response(record)
    h = await store.load_context(T1, "resp_empty")
    assert h is not None and list(h.inputs) == [] and list(h.outputs) == []
    page = await store.list_input_items(T1, "resp_empty", after=None, limit=5, order="desc")
    assert page is not None and list(page.items) == [] and page.has_more is False


async def test_put_idempotent(store):
    chain = Chain()
    record, inputs, outs = chain.next(n_inputs=2, n_outputs=2)
    await store.put_response(record)
    await store.put_response(record)
    assert await store.item_count(T1) == 4
    assert_hydrated(await store.load_context(T1, record.response.id), record, inputs, outs)

    # Same id again: the response row is replaced; new_items under existing keys are ignored.
    changed = ResponseRecord(
        tenant=T1,
        response=response(record.response.id, status="incomplete"),
        input_keys=record.input_keys,
        output_keys=record.output_keys,
        new_items=[KeyedItem(k.key, msg("msg_other", text="different")) for k in record.new_items],
        conversation_tokens=99,
    )
    await store.put_response(changed)
    h = await store.load_context(T1, record.response.id)
    assert h is not None and h.response.status == "incomplete" and h.conversation_tokens == 99
    assert [k.item for k in h.inputs] == [k.item for k in inputs]  # first content kept
    assert await store.item_count(T1) == 4


async def test_replace_collects_dropped_items(store):
    chain = Chain()
    record, inputs, outs = chain.next(n_inputs=1, n_outputs=2)
    await store.put_response(record)
    new_out = KeyedItem("c:0:out-new", msg("msg_new", "assistant"))
    replaced = ResponseRecord(
        tenant=T1,
        response=response(record.response.id, outs[0].item, new_out.item),
        input_keys=record.input_keys,
        output_keys=[outs[0].key, new_out.key],
        new_items=[new_out],
    )
    await store.put_response(replaced)
    h = await store.load_context(T1, record.response.id)
    assert [k.key for k in h.outputs] == [outs[0].key, new_out.key]
    assert await store.item_count(T1) == 3  # outs[1] was referenced by nothing else


async def test_put_with_unknown_key_fails_and_writes_nothing(store):
    record = ResponseRecord(
        tenant=T1,
        response=response("resp_bad"),
        input_keys=["k:new", "k:never-stored"],
        output_keys=[],
        new_items=[KeyedItem("k:new", msg("msg_new"))],
    )
    with pytest.raises(MissingItemError):
        await store.put_response(record)
    assert await store.get_response(T1, "resp_bad") is None
    assert await store.item_count(T1) == 0


async def test_a_write_with_a_stale_fencing_token_is_refused_and_writes_nothing(store):
    """A response written by a newer owner (a higher epoch: a replica that ended the run for an
    owner that stopped) is final: the stale owner's later write is refused in the same write and
    leaves the response, its items and their references as they were; the same epoch rewrites."""
    chain = Chain()
    owner, inputs, outs = chain.next(n_inputs=1, n_outputs=2)
    owner = dataclasses.replace(owner, epoch=1)
    failed = dataclasses.replace(owner, response=response(owner.response.id, status="failed"), input_keys=[],
                                 output_keys=[], new_items=[], epoch=2)  # fmt: skip
    await store.put_response(failed)
    with pytest.raises(FencedWrite):
        await store.put_response(owner)
    assert (await store.get_response(T1, owner.response.id)).status == "failed"
    assert await store.item_count(T1) == 0  # none of the stale write's items
    await store.put_response(failed)  # the same epoch rewrites
    newer = dataclasses.replace(owner, epoch=3)
    await store.put_response(newer)
    assert_hydrated(await store.load_context(T1, owner.response.id), newer, inputs, outs)
    with pytest.raises(FencedWrite):
        await store.put_response(failed)
    assert (await store.get_response(T1, owner.response.id)).status == "completed"


async def test_returned_protos_are_copies(store):
    record, _, _ = Chain().next()
    await store.put_response(record)
    got = await store.get_response(T1, record.response.id)
    got.status = "mutated"
    h = await store.load_context(T1, record.response.id)
    h.inputs[0].item.message.role = "mutated"
    again = await store.load_context(T1, record.response.id)
    assert again.response.status == "completed"
    assert again.inputs[0].item.message.role == "user"


# -- deletion --------------------------------------------------------------------------------


async def test_delete_once(store):
    record, _, _ = Chain().next()
    await store.put_response(record)
    assert await store.delete_response(T1, record.response.id) is True
    assert await store.delete_response(T1, record.response.id) is False
    assert await store.get_response(T1, record.response.id) is None
    assert await store.load_context(T1, record.response.id) is None
    assert await store.item_count(T1) == 0


async def test_delete_parent_keeps_child(store):
    chain = Chain()
    parent, _, _ = chain.next(n_inputs=2, n_outputs=2)
    child, c_in, c_out = chain.next(n_inputs=1, n_outputs=1)
    await store.put_response(parent)
    await store.put_response(child)
    assert await store.delete_response(T1, parent.response.id) is True
    assert await store.load_context(T1, parent.response.id) is None
    assert_hydrated(await store.load_context(T1, child.response.id), child, c_in, c_out)
    assert await store.item_count(T1) == 6  # all still referenced by the child
    page = await store.list_input_items(T1, child.response.id, after=None, limit=100, order="asc")
    assert [item_id(i) for i in page.items] == [item_id(k.item) for k in c_in]
    assert await store.delete_response(T1, child.response.id) is True
    assert await store.item_count(T1) == 0


async def test_delete_child_keeps_parent(store):
    chain = Chain()
    parent, p_in, p_out = chain.next(n_inputs=2, n_outputs=2)
    child, _, _ = chain.next()
    await store.put_response(parent)
    await store.put_response(child)
    assert await store.delete_response(T1, child.response.id) is True
    assert_hydrated(await store.load_context(T1, parent.response.id), parent, p_in, p_out)
    assert await store.item_count(T1) == 4  # the child's own two items are gone


async def test_delete_middle_of_branches(store):
    # A parent with two children (a fork): deleting one child keeps the shared items.
    root = Chain(prefix="r")
    parent, _, _ = root.next(n_inputs=1, n_outputs=1)
    await store.put_response(parent)
    forks = []
    for name in ("x", "y"):
        fork = Chain(prefix=name)
        fork.context, fork.last = list(root.context), root.last
        rec, ins, outs = fork.next()
        await store.put_response(rec)
        forks.append((rec, ins, outs))
    await store.delete_response(T1, parent.response.id)
    await store.delete_response(T1, forks[0][0].response.id)
    assert_hydrated(await store.load_context(T1, forks[1][0].response.id), *forks[1])
    assert await store.item_count(T1) == 4


# -- list_input_items ------------------------------------------------------------------------


def item_id(item: items_pb2.Item) -> str:
    arm = item.WhichOneof("item")
    return getattr(item, arm).id


async def _seven_inputs(store) -> tuple[str, list[str]]:
    chain = Chain()
    first, _, _ = chain.next(n_inputs=3, n_outputs=2)  # 3 inputs, 2 outputs
    second, inputs, _ = chain.next(n_inputs=2, n_outputs=1)  # 3 + 2 + 2 = 7 inputs
    await store.put_response(first)
    await store.put_response(second)
    ids = [item_id(k.item) for k in inputs]
    assert len(ids) == 7
    return second.response.id, ids


async def test_list_input_items_asc(store):
    rid, ids = await _seven_inputs(store)
    page = await store.list_input_items(T1, rid, after=None, limit=3, order="asc")
    assert [item_id(i) for i in page.items] == ids[0:3] and page.has_more
    page = await store.list_input_items(T1, rid, after=ids[2], limit=3, order="asc")
    assert [item_id(i) for i in page.items] == ids[3:6] and page.has_more
    page = await store.list_input_items(T1, rid, after=ids[5], limit=3, order="asc")
    assert [item_id(i) for i in page.items] == ids[6:] and not page.has_more
    page = await store.list_input_items(T1, rid, after=ids[3], limit=3, order="asc")
    assert [item_id(i) for i in page.items] == ids[4:7] and not page.has_more  # exactly the rest
    page = await store.list_input_items(T1, rid, after=ids[6], limit=3, order="asc")
    assert list(page.items) == [] and not page.has_more
    page = await store.list_input_items(T1, rid, after=None, limit=100, order="asc")
    assert [item_id(i) for i in page.items] == ids and not page.has_more


async def test_list_input_items_desc(store):
    rid, ids = await _seven_inputs(store)
    newest_first = ids[::-1]
    page = await store.list_input_items(T1, rid, after=None, limit=4, order="desc")
    assert [item_id(i) for i in page.items] == newest_first[:4] and page.has_more
    page = await store.list_input_items(T1, rid, after=newest_first[3], limit=4, order="desc")
    assert [item_id(i) for i in page.items] == newest_first[4:] and not page.has_more
    page = await store.list_input_items(T1, rid, after="", limit=7, order="desc")
    assert [item_id(i) for i in page.items] == newest_first and not page.has_more


async def test_list_input_items_full_items_and_edge_cases(store):
    rid, ids = await _seven_inputs(store)
    h = await store.load_context(T1, rid)
    page = await store.list_input_items(T1, rid, after=None, limit=7, order="asc")
    assert list(page.items) == [k.item for k in h.inputs]
    page = await store.list_input_items(T1, rid, after="msg_unknown", limit=3, order="asc")
    assert list(page.items) == [] and not page.has_more
    with pytest.raises(ValueError):
        await store.list_input_items(T1, rid, after=None, limit=3, order="sideways")
    with pytest.raises(ValueError):
        await store.list_input_items(T1, rid, after=None, limit=0, order="asc")


async def test_list_input_items_without_ids(store):
    items = [
        KeyedItem(f"k{j}", items_pb2.Item(message=items_pb2.Message(role="user", content_text=str(j))))
        for j in range(3)
    ]
    other = KeyedItem(
        "k-other",
        items_pb2.Item(
            other=items_pb2.OtherItem(type="web_search_call", json='{"type":"web_search_call","id":"ws_1"}')
        ),
    )
    record = ResponseRecord(
        tenant=T1,
        response=response("resp_noids"),
        input_keys=[k.key for k in [*items, other]],
        output_keys=[],
        new_items=[*items, other],
    )
    await store.put_response(record)
    page = await store.list_input_items(T1, "resp_noids", after=None, limit=10, order="asc")
    assert list(page.items) == [k.item for k in [*items, other]]
    page = await store.list_input_items(T1, "resp_noids", after="ws_1", limit=10, order="desc")
    assert list(page.items) == [k.item for k in items[::-1]]


# -- usage ledger ----------------------------------------------------------------------------


async def test_usage_ledger(store):
    await store.record_usage(usage(T1, "resp_1"))
    await store.record_usage(usage(T1, "resp_1", input_tokens=999))  # ignored: same response id
    await store.record_usage(usage(T2, "resp_1"))  # another tenant's id is its own record
    await store.record_usage(usage(T1, "resp_2", status="incomplete", created_at=1.5))
    everything = await store.usage_records()
    assert everything == [
        usage(T1, "resp_1"),
        usage(T2, "resp_1"),
        usage(T1, "resp_2", status="incomplete", created_at=1.5),
    ]
    assert await store.usage_records(T1) == [everything[0], everything[2]]
    assert await store.usage_records(T2) == [everything[1]]
    assert await store.usage_records("nobody") == []


async def test_usage_concurrent_duplicates(store):
    await asyncio.gather(*[store.record_usage(usage(T1, "resp_dup", output_tokens=i)) for i in range(20)])
    records = await store.usage_records(T1)
    assert len(records) == 1


# -- tenant isolation ------------------------------------------------------------------------


async def test_tenant_isolation_every_method(store):
    chain = Chain(tenant=T1)
    record, inputs, outs = chain.next(n_inputs=2, n_outputs=1)
    await store.put_response(record)
    rid = record.response.id

    assert await store.get_response(T2, rid) is None
    assert await store.load_context(T2, rid) is None
    assert await store.list_input_items(T2, rid, after=None, limit=10, order="asc") is None
    assert await store.delete_response(T2, rid) is False
    assert await store.item_count(T2) == 0
    # Referencing another tenant's item keys does not reach them.
    stolen = ResponseRecord(
        tenant=T2, response=response("resp_x"), input_keys=record.input_keys, output_keys=[], new_items=[]
    )
    with pytest.raises(MissingItemError):
        await store.put_response(stolen)
    # T1 is untouched by all of that.
    assert_hydrated(await store.load_context(T1, rid), record, inputs, outs)

    # The same response id and item keys under T2 are a separate response with separate items.
    other = Chain(tenant=T2)
    rec2, in2, out2 = other.next(n_inputs=1, n_outputs=1)
    rec2 = ResponseRecord(
        tenant=T2,
        response=response(rid, *[k.item for k in out2], status="failed"),
        input_keys=record.input_keys[:1],
        output_keys=record.output_keys,
        new_items=[
            KeyedItem(record.input_keys[0], msg("msg_t2")),
            KeyedItem(record.output_keys[0], msg("msg_t2_out", "assistant")),
        ],
    )
    await store.put_response(rec2)
    h2 = await store.load_context(T2, rid)
    assert h2.response.status == "failed" and h2.inputs[0].item == msg("msg_t2")
    assert_hydrated(await store.load_context(T1, rid), record, inputs, outs)
    assert (await store.get_response(T1, rid)).status == "completed"

    # Deleting in T2 leaves T1's response and items.
    assert await store.delete_response(T2, rid) is True
    assert await store.item_count(T2) == 0
    assert_hydrated(await store.load_context(T1, rid), record, inputs, outs)
    assert await store.item_count(T1) == 3

    await store.record_usage(usage(T1, rid))
    assert await store.usage_records(T2) == []


async def test_tenant_names_cannot_collide(store):
    # Tenants whose names contain separators must not alias each other's keys.
    a, b = "x}:i:y", "x"
    ka = KeyedItem("z", msg("msg_a"))
    kb = KeyedItem("y}:i:z", msg("msg_b"))
    await store.put_response(
        ResponseRecord(tenant=a, response=response("r"), input_keys=["z"], output_keys=[], new_items=[ka])
    )
    await store.put_response(
        ResponseRecord(tenant=b, response=response("r2"), input_keys=[kb.key], output_keys=[], new_items=[kb])
    )
    assert (await store.load_context(a, "r")).inputs[0].item == msg("msg_a")
    assert (await store.load_context(b, "r2")).inputs[0].item == msg("msg_b")
    assert await store.get_response("", "r") is None


# -- long chains: hydration is one read ------------------------------------------------------


async def test_200_turn_chain_hydrates_in_one_read(store, engine):
    chain = Chain(prefix="long")
    for _ in range(200):
        record, inputs, outs = chain.next(n_inputs=1, n_outputs=1)
        await store.put_response(record)
    assert len(inputs) == 399

    statements: list[str] = []
    if engine.name in ("sqlite", "postgres"):
        await store.set_trace(statements.append)
    h = await store.load_context(T1, record.response.id)
    if engine.name in ("sqlite", "postgres"):
        await asyncio.sleep(0)  # asyncpg delivers query-log records with call_soon
        await asyncio.sleep(0)
        await store.set_trace(None)
        assert len(statements) == 1, statements
        assert statements[0].lstrip().upper().startswith("SELECT")
    assert_hydrated(h, record, inputs, outs)
    # The item ids come back in conversation order.
    assert [item_id(k.item) for k in h.inputs][:3] == ["msg_long_0_in0", "msg_long_0_out0", "msg_long_1_in0"]


# -- concurrency -----------------------------------------------------------------------------


async def test_concurrent_chains(store):
    chains = [Chain(prefix=f"p{j}") for j in range(12)]

    async def drive(chain: Chain) -> None:
        for _ in range(8):
            record, inputs, outs = chain.next(n_inputs=1, n_outputs=2)
            await store.put_response(record)
            # Read back concurrently with the other writers.
            assert_hydrated(await store.load_context(T1, record.response.id), record, inputs, outs)
            if chain.turn > 1:
                assert await store.load_context(T1, f"resp_{chain.prefix}_{chain.turn - 2}") is not None

    await asyncio.gather(*[drive(c) for c in chains])
    assert await store.item_count(T1) == 12 * 8 * 3


async def test_concurrent_same_id_puts(store):
    record, inputs, outs = Chain().next(n_inputs=2, n_outputs=2)
    await asyncio.gather(*[store.put_response(record) for _ in range(10)])
    assert_hydrated(await store.load_context(T1, record.response.id), record, inputs, outs)
    assert await store.item_count(T1) == 4
    assert await store.delete_response(T1, record.response.id) is True
    assert await store.item_count(T1) == 0


async def test_delete_racing_continuation_never_dangles(store):
    """A delete of the parent races the child's write. Either the write wins (the child hydrates
    completely, the parent's items live on under it) or the delete wins: then the write raises
    `MissingItemError` and writes nothing, the parent's items are collected, and the child
    written again self-contained (every item it references, what post-inference does) hydrates
    completely. Both branches assert; no round passes without a check."""
    rng = random.Random(7)
    for round_ in range(8):
        chain = Chain(prefix=f"race{round_}")
        parent, _, _ = chain.next(n_inputs=2, n_outputs=1)
        await store.put_response(parent)
        child, c_in, c_out = chain.next()
        before = await store.item_count(T1)
        ops = [store.delete_response(T1, parent.response.id), store.put_response(child)]
        if rng.random() < 0.5:
            ops.reverse()
        results = await asyncio.gather(*ops, return_exceptions=True)
        put_result = results[1] if ops[1].__qualname__.endswith("put_response") else results[0]
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, MissingItemError):
                raise result
        assert await store.get_response(T1, parent.response.id) is None  # the delete always happens
        if isinstance(put_result, MissingItemError):
            assert put_result.response_id == child.response.id
            assert await store.get_response(T1, child.response.id) is None  # nothing half-written
            assert await store.item_count(T1) == before - 3  # the parent's 3 items, collected
            await store.put_response(dataclasses.replace(child, new_items=[*c_in, *c_out]))
        else:
            assert put_result is None
        assert_hydrated(await store.load_context(T1, child.response.id), child, c_in, c_out)
        assert await store.delete_response(T1, child.response.id) is True
        assert await store.item_count(T1) == before - 3


async def test_two_instances_share_data(store, engine):
    """A second store object on the same data (another process/replica) sees the writes."""
    record, inputs, outs = Chain().next()
    other = engine.new()
    await other.open()
    try:
        await other.put_response(record)
        assert_hydrated(await store.load_context(T1, record.response.id), record, inputs, outs)
        assert await store.delete_response(T1, record.response.id) is True
        assert await other.get_response(T1, record.response.id) is None
    finally:
        if other is not store:
            await other.close()


# -- conversations ---------------------------------------------------------------------------


def conversation(cid: str, **metadata: str) -> service_pb2.Conversation:
    return service_pb2.Conversation(id=cid, created_at=1_700_000_000, metadata=metadata)


async def test_conversation_lifecycle(store):
    assert await store.get_conversation(T1, "conv_1") is None
    assert await store.conversation_items(T1, "conv_1") is None
    assert not await store.append_conversation_items(T1, "conv_1", [msg("msg_x")])
    await store.put_conversation(T1, conversation("conv_1", k="v"))
    assert await store.conversation_items(T1, "conv_1") == []
    assert await store.append_conversation_items(T1, "conv_1", [msg("msg_a"), call("fc_b")])
    assert await store.append_conversation_items(T1, "conv_1", [msg("msg_c", "assistant")])
    # Replacing the row (metadata update) keeps the items.
    assert await store.update_conversation(T1, conversation("conv_1", k="w"))
    got = await store.get_conversation(T1, "conv_1")
    assert got == conversation("conv_1", k="w")
    items = await store.conversation_items(T1, "conv_1")
    assert items == [msg("msg_a"), call("fc_b"), msg("msg_c", "assistant")]
    assert await store.delete_conversation_item(T1, "conv_1", "fc_b")
    assert not await store.delete_conversation_item(T1, "conv_1", "fc_b")
    assert not await store.delete_conversation_item(T1, "conv_2", "msg_a")
    assert await store.conversation_items(T1, "conv_1") == [msg("msg_a"), msg("msg_c", "assistant")]
    assert await store.append_conversation_items(T1, "conv_1", [msg("msg_d")])
    assert [i.message.id for i in await store.conversation_items(T1, "conv_1")] == ["msg_a", "msg_c", "msg_d"]
    assert await store.delete_conversation(T1, "conv_1")
    assert not await store.delete_conversation(T1, "conv_1")
    assert await store.get_conversation(T1, "conv_1") is None
    assert await store.conversation_items(T1, "conv_1") is None
    # A new conversation with the same id starts empty.
    await store.put_conversation(T1, conversation("conv_1"))
    assert await store.conversation_items(T1, "conv_1") == []


async def test_an_update_never_brings_a_deleted_conversation_back(store):
    assert not await store.update_conversation(T1, conversation("conv_gone", k="v"))
    assert await store.get_conversation(T1, "conv_gone") is None
    await store.put_conversation(T1, conversation("conv_gone"))
    assert await store.delete_conversation(T1, "conv_gone")
    assert not await store.update_conversation(T1, conversation("conv_gone", k="v"))
    assert await store.get_conversation(T1, "conv_gone") is None
    assert await store.conversation_items(T1, "conv_gone") is None
    assert not await store.update_conversation(T2, conversation("conv_gone"))


async def test_a_metadata_update_racing_a_delete_leaves_it_deleted(store):
    """`POST /v1/conversations/{id}` and `DELETE` at once: whichever order they run in, a delete
    that succeeded leaves no conversation (before, the update's write re-created it)."""
    conversations = Conversations(store, Limits())
    for n in range(20):
        cid = f"conv_race_{n}"
        await store.put_conversation(T1, conversation(cid))
        update = service_pb2.UpdateConversationRequest(conversation_id=cid, metadata={"k": "v"})
        _, deleted = await asyncio.gather(
            conversations.UpdateConversation(T1, update), store.delete_conversation(T1, cid), return_exceptions=True
        )
        assert deleted is True
        assert await store.get_conversation(T1, cid) is None, f"round {n}: the deleted conversation came back"


async def test_conversations_are_tenant_scoped(store):
    await store.put_conversation(T1, conversation("conv_t", owner="a"))
    await store.append_conversation_items(T1, "conv_t", [msg("msg_t")])
    assert await store.get_conversation(T2, "conv_t") is None
    assert await store.conversation_items(T2, "conv_t") is None
    assert not await store.append_conversation_items(T2, "conv_t", [msg("msg_evil")])
    assert not await store.delete_conversation_item(T2, "conv_t", "msg_t")
    assert not await store.delete_conversation(T2, "conv_t")
    assert await store.conversation_items(T1, "conv_t") == [msg("msg_t")]


async def test_concurrent_appends_keep_every_item(store):
    await store.put_conversation(T1, conversation("conv_c"))
    await asyncio.gather(
        *(store.append_conversation_items(T1, "conv_c", [msg(f"msg_{n}_0"), msg(f"msg_{n}_1")]) for n in range(8))
    )
    ids = [i.message.id for i in await store.conversation_items(T1, "conv_c")]
    assert sorted(ids) == sorted(f"msg_{n}_{j}" for n in range(8) for j in range(2))
    for n in range(8):  # each append's items stay together and in order
        first = ids.index(f"msg_{n}_0")
        assert ids[first + 1] == f"msg_{n}_1"
