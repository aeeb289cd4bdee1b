"""The turn's parts as pure code, no server: the chain (nodes, open calls, the connection cache and
the process budget), the output builder (chunks -> events -> output), the item stage (open calls),
truncation, and the per-connection memos of the render and route stages."""

from __future__ import annotations

import asyncio

import pytest

from tether import errors, render
from tether.backends.base import Finish, TextDelta, ToolCallDelta
from tether.config import Limits, Route
from tether.core.builder import OutputBuilder
from tether.core.chain import CacheBudget, CachedResponse, Node, ResponseCache, Segment
from tether.core.items import user_message
from tether.core.stages import validate
from tether.core.stages.route import Router
from tether.core.turn import truncate
from tether.errors import TetherError
from tether.responses.v1 import items_pb2, response_pb2


def call(call_id: str, name: str = "read_file") -> items_pb2.Item:
    item = items_pb2.Item()
    item.function_call.call_id, item.function_call.name, item.function_call.arguments = call_id, name, "{}"
    return item


def output(call_id: str) -> items_pb2.Item:
    item = items_pb2.Item()
    item.function_call_output.call_id, item.function_call_output.output_text = call_id, "ok"
    return item


def seg(item: items_pb2.Item, key: str = "k") -> Segment:
    return Segment.of(key, item)


# -- chain ------------------------------------------------------------------------------------------


def test_a_node_counts_the_whole_chain_and_tracks_open_calls():
    first = Node.continue_with(None, (seg(user_message("list the files")), seg(call("c1"))), findings=1)
    second = Node.continue_with(first, (seg(output("c1")), seg(call("c2"))))
    assert first.open_calls == {"c1"} and second.open_calls == {"c2"}
    assert second.length == 4 and second.findings == 1
    texts = [user_message("list the files"), call("c1"), output("c1"), call("c2")]
    assert second.token_count == sum(len(render.encode(render.render_item(i))) for i in texts)
    assert [s.item for s in second.all_segments()] == texts and second.parent is first


def entry(rid: str, nbytes: int) -> CachedResponse:
    return CachedResponse(response=response_pb2.Response(id=rid), input_node=None, context_node=None,
                          lane="", store=False, tenant="t", nbytes=nbytes)  # fmt: skip


def test_the_connection_cache_evicts_its_least_recently_used_past_its_capacity():
    evicted: list[str] = []
    cache = ResponseCache(2, CacheBudget(1 << 20), on_evict=evicted.append)
    cache.put(entry("a", 10))
    cache.put(entry("b", 10))
    assert cache.get("a") is not None  # a is now the most recent
    cache.put(entry("c", 10))
    assert "b" not in cache and "a" in cache and "c" in cache
    assert evicted == ["connection_capacity"]


def test_the_process_budget_evicts_across_connections_oldest_first():
    budget = CacheBudget(25)
    one, two = ResponseCache(8, budget), ResponseCache(8, budget)
    one.put(entry("a", 10))
    two.put(entry("b", 10))
    one.put(entry("c", 10))  # 30 > 25: the oldest of the process goes, whichever connection holds it
    assert "a" not in one and "b" in two and "c" in one
    assert budget.used == 20
    two.clear()
    assert budget.used == 10


def test_the_process_budget_gives_each_tenant_a_fair_share():
    budget = CacheBudget(40)
    quiet = ResponseCache(8, budget, tenant="b")
    quiet.put(entry("b1", 10))
    noisy = [ResponseCache(8, budget, tenant="a") for _ in range(3)]
    for i in range(12):  # tenant a's warm-ups, on several connections, long after b's entry
        noisy[i % 3].put(entry(f"a{i}", 10))
    # b holds 10 bytes, under its fair share (40 / 2 tenants): only a's own entries were evicted.
    assert "b1" in quiet and budget.used_by("b") == 10
    assert budget.used_by("a") == 30 and budget.used == 40
    assert sum(len(c) for c in noisy) == 3 and "a11" in noisy[2]  # a's most recent three are kept
    # Past the bound, the tenant holding the most bytes pays: first a, then b for itself.
    quiet.put(entry("b2", 10))  # a: 30, b: 20 -> a's oldest goes
    assert budget.used_by("a") == 20 and budget.used_by("b") == 20 and "b1" in quiet
    quiet.put(entry("b3", 10))  # a: 20, b: 30 -> b's own oldest goes
    assert "b1" not in quiet and budget.used_by("b") == 20 and budget.used_by("a") == 20
    quiet.clear()
    assert budget.used_by("b") == 0 and budget.used == 20


def test_the_process_budget_keeps_the_entry_just_charged_even_alone_over_it():
    budget = CacheBudget(5)
    cache = ResponseCache(8, budget, tenant="a")
    cache.put(entry("big", 10))
    assert "big" in cache and budget.used == 10


# -- builder ----------------------------------------------------------------------------------------


def arms(events) -> list[str]:
    return [getattr(ev, "arm", None) or ev.WhichOneof("event") for ev in events]


def test_the_builder_turns_a_stream_into_events_and_an_output_that_agree():
    b = OutputBuilder()
    events = b.feed([TextDelta("Reading "), TextDelta("it."), ToolCallDelta(0, '{"pa', "c1", "read_file"),
                     ToolCallDelta(0, 'th": "a"}'), Finish(reason="tool_calls")])  # fmt: skip
    events += b.close_all()
    assert arms(events) == [
        "output_item_added", "content_part_added", "output_text_delta",  # the message, one delta
        "output_text_done", "content_part_done", "output_item_done",  # closed when the call starts
        "output_item_added", "function_call_arguments_delta",  # one wake-up's fragments: one delta
        "function_call_arguments_done", "output_item_done",
    ]  # fmt: skip
    assert b.finish == Finish(reason="tool_calls")
    message, fc = b.output
    assert message.message.content[0].output_text.text == "Reading it."
    assert (fc.function_call.call_id, fc.function_call.arguments) == ("c1", '{"path": "a"}')
    added = [ev.output_item_added.output_index for ev in events if arms([ev]) == ["output_item_added"]]
    assert added == [0, 1] and b.next_index == 2


def test_the_builder_refuses_calls_past_max_tool_calls():
    b = OutputBuilder(max_tool_calls=1)
    b.feed([ToolCallDelta(0, "{}", "c1", "a"), ToolCallDelta(1, "{}", "c2", "b")])
    b.close_all()
    assert b.capped and [i.function_call.call_id for i in b.output] == ["c1"]


# -- the item stage ----------------------------------------------------------------------------------


def test_an_output_must_answer_an_open_call_of_the_chain_or_of_the_same_input():
    limits = Limits()
    validate.validate_items([output("c1")], frozenset({"c1"}), limits)
    validate.validate_items([call("c9"), output("c9")], frozenset(), limits)
    with pytest.raises(TetherError) as refused:
        validate.validate_items([user_message("hi"), output("c1")], frozenset(), limits)
    assert (refused.value.code, refused.value.param) == (errors.UNKNOWN_CALL_ID, "input[1].call_id")


# -- truncation -------------------------------------------------------------------------------------


def test_truncation_drops_whole_oldest_items_and_an_orphaned_output_with_its_call():
    items = [user_message("one " * 50), call("c1"), output("c1"), user_message("last")]
    node = Node.continue_with(None, tuple(seg(i) for i in items))
    last = len(render.encode(render.render_item(items[-1])))
    answer = len(render.encode(render.render_item(items[2])))
    kept = truncate(node, budget=answer + last)  # the output and the last item would fit...
    assert kept.items() == [items[-1]]  # ...but the output goes with its dropped call
    assert truncate(node, budget=last - 1) is node  # the last item alone does not fit: unchanged
    assert truncate(node, budget=node.token_count).items() == items  # it fits: nothing dropped


# -- per-connection memos ---------------------------------------------------------------------------


def test_the_memo_tokenises_a_header_once_and_resolves_a_model_once():
    from tether.core.context import Memo

    class Services:  # the two parts a Memo reads
        token_cache = render.TokenCache(1 << 20)
        router = Router({"m": Route(backend="b")}, {"b": object()}, 1000)  # type: ignore[dict-item]

    memo = Memo("t", Services())  # type: ignore[arg-type]
    count, cached, last = asyncio.run(memo.header("be brief", []))
    assert not cached and count == len(render.encode(render.render_header("be brief", [])))
    assert last is not None  # small: kept as the connection's last header
    assert asyncio.run(memo.header("be brief", [])) == (count, True, last)  # the same record: not hashed again
    assert asyncio.run(memo.header(None, []))[2] is not last  # no instructions is another header
    other = asyncio.run(memo.header("be terse", []))
    assert not other[1] and other[2] is not last
    again = asyncio.run(memo.header("be brief", []))  # not the last any more: found by its key
    assert again[:2] == (count, True) and again[2] is not last
    assert memo.route("m") is memo.route("m")


def test_the_memo_keeps_a_copy_of_the_last_header_only_up_to_its_bound():
    """A connection keeps its last header (to compare the next one with, and its echo) only when
    it is at most `Memo.RETAIN_BYTES`; a larger one is counted and memoised by digest alone."""
    from tether.core.context import Memo

    class Services:
        token_cache = render.TokenCache(1 << 20)

    memo = Memo("t", Services())  # type: ignore[arg-type]
    at_edge = "x" * Memo.RETAIN_BYTES
    count, cached, last = asyncio.run(memo.header(at_edge, []))
    assert not cached and last is not None and last.source.instructions == at_edge
    past = "y" * (Memo.RETAIN_BYTES + 1)
    count, cached, last = asyncio.run(memo.header(past, []))
    assert not cached and last is None and count == len(render.encode(render.render_header(past, [])))
    assert asyncio.run(memo.header(past, [])) == (count, True, None)  # memoised all the same
