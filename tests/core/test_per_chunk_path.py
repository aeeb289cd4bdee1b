"""The per-chunk path: a backend wake-up's chunks become one event, deltas travel as plain
strings, and JSON is encoded straight from them (counters and equality, no timing asserts)."""

from __future__ import annotations

import asyncio
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.configs import make_config
from tether import render
from tether.backends.base import Finish, ReasoningDelta, RefusalDelta, TextDelta, ToolCallDelta, runs_of
from tether.bridge import common
from tether.core.builder import OutputBuilder
from tether.core.delta import Delta
from tether.core.outbox import DELTA_ARMS, CoalesceWindow, Outbox
from tether.core.pump import ResponseEnd
from tether.core.wakeups import WakeupReader
from tether.protocol import json_codec
from tether.responses.v1 import service_pb2
from tether.server import build_engine

# -- WakeupReader ---------------------------------------------------------------------------------


async def ticking(log: list[str], runs: list[int], *, fail_after: int | None = None):
    """An async generator that makes `runs[i]` chunks ready per wake-up, sleeping in between."""
    n = 0
    try:
        for run in runs:
            await asyncio.sleep(0.001)
            for _ in range(run):
                if fail_after is not None and n == fail_after:
                    raise RuntimeError("upstream broke")
                yield TextDelta(f"t{n} ")
                n += 1
    finally:
        log.append("closed")


async def test_reader_returns_each_wakeups_ready_chunks_as_one_run():
    log: list[str] = []
    reader = WakeupReader(runs_of(ticking(log, [3, 1, 5])))
    runs = []
    while chunks := await reader.next():
        runs.append([c.text for c in chunks])
    await reader.aclose()
    assert [len(r) for r in runs] == [3, 1, 5]
    assert "".join(t for r in runs for t in r) == "".join(f"t{i} " for i in range(9))
    assert await reader.next() == []  # stays ended
    assert log == ["closed"]


async def test_reader_closed_with_a_pending_step_cancels_it_and_closes_the_stream():
    log: list[str] = []
    reader = WakeupReader(runs_of(ticking(log, [2, 2, 2])))
    assert len(await reader.next()) == 2  # the next step is started and waiting on its sleep
    await reader.aclose()
    assert log == ["closed"]


async def test_reader_is_cancellable_while_waiting_and_releases_the_stream():
    log: list[str] = []

    async def slow():
        try:
            yield TextDelta("a")
            await asyncio.sleep(30)
            yield TextDelta("never")
        finally:
            log.append("closed")

    reader = WakeupReader(runs_of(slow()))

    async def consume():
        try:
            while await reader.next():
                pass
        finally:
            await reader.aclose()

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.01)
    task.cancel()
    try:
        await asyncio.wait_for(task, 5)
    except asyncio.CancelledError:
        pass
    assert log == ["closed"]


async def test_reader_raises_the_streams_error_after_the_chunks_before_it():
    log: list[str] = []
    reader = WakeupReader(runs_of(ticking(log, [2, 3], fail_after=3)))
    assert len(await reader.next()) == 2
    try:
        await reader.next()
    except RuntimeError as exc:
        assert "upstream broke" in str(exc)
    else:
        raise AssertionError("the stream's error was swallowed")
    await reader.aclose()
    assert log == ["closed"]


# -- builder and outbox ---------------------------------------------------------------------------


def test_builder_merges_a_runs_deltas_per_item_and_keeps_the_text():
    b = OutputBuilder()
    run = [ReasoningDelta("think "), ReasoningDelta("more"), TextDelta("Hello"), TextDelta(", "),
           TextDelta("world"), ToolCallDelta(0, call_id="call_1", name="f"), ToolCallDelta(0, '{"a":'),
           ToolCallDelta(0, "1}"), Finish(reason="tool_calls")]  # fmt: skip
    events = b.feed(run)
    deltas = [e for e in events if type(e) is Delta]
    assert [(d.arm, d.delta) for d in deltas] == [
        ("reasoning_text_delta", "think more"),
        ("output_text_delta", "Hello, world"),
        ("function_call_arguments_delta", '{"a":1}'),
    ]
    b.close_all()
    texts = [b.output[0].reasoning.content[0], b.output[1].message.content[0].output_text.text,
             b.output[2].function_call.arguments]  # fmt: skip
    assert texts == ["think more", "Hello, world", '{"a":1}']
    assert b.finish is not None and b.finish.reason == "tool_calls"


class _CountingIds:
    """Stands in for `tether.ids` in the builder: ids numbered in the order they are asked for,
    so two builders fed the same chunks name their items alike."""

    def __init__(self) -> None:
        self.n = 0

    def __getattr__(self, kind: str):
        def new_id(*_: object) -> str:
            self.n += 1
            return f"{kind}_{self.n}"

        return new_id


CHUNK = st.one_of(
    st.builds(TextDelta, st.sampled_from(["a", "b c", "", "é"])),
    st.builds(ReasoningDelta, st.sampled_from(["r", "s t", ""])),
    st.builds(RefusalDelta, st.sampled_from(["no", ""])),
    st.builds(ToolCallDelta, st.integers(0, 1), st.sampled_from(["", '{"x"', ":1}"]), st.none(),
              st.sampled_from([None, "f"]), st.booleans()),  # fmt: skip
)


def _fed(runs: list[list]) -> tuple[list[str], dict[tuple[str, str], str], list[bytes]]:
    """What a builder makes of `runs`: its other events (serialised), each item's delta text by
    (item id, arm), and its output once closed."""
    from tether.core import builder as builder_module

    with patch.object(builder_module, "ids", _CountingIds()):
        b = OutputBuilder(max_tool_calls=1)
        events = [e for run in runs for e in b.feed(run)]
        events += b.close_all()
    texts: dict[tuple[str, str], str] = {}
    others = []
    for e in events:
        if type(e) is Delta:
            texts[(e.item_id, e.arm)] = texts.get((e.item_id, e.arm), "") + e.delta
        else:
            others.append(e.SerializeToString(deterministic=True))
    return others, texts, [item.SerializeToString(deterministic=True) for item in b.output]


@settings(max_examples=300, deadline=None)
@given(st.lists(CHUNK, max_size=14))
def test_a_run_of_chunks_builds_what_the_same_chunks_one_by_one_build(chunks: list) -> None:
    """A wake-up's run appends its further chunks of one item to that item's delta directly
    (`OutputBuilder.feed`'s tail); chunk by chunk, every chunk goes the full way. Both make the
    same items, the same other events and the same text."""
    assert _fed([chunks]) == _fed([[c] for c in chunks])


async def test_lazy_batches_keep_deltas_as_records_with_contiguous_sequence_numbers():
    box = Outbox(max_events=16, window=CoalesceWindow.fixed(0.0), max_coalesced_bytes=1 << 16)
    b = OutputBuilder()
    for run in ([TextDelta("a"), TextDelta("b")], [TextDelta("c")]):
        for ev in b.feed(run):
            ev.response_id = "r"
            await box.put(ev)
    batch = await box.get_batch(lazy_deltas=True)
    assert [type(e) is Delta for e in batch] == [False, False, True]  # item added, part added, delta
    assert batch[2].delta == "abc" and [e.sequence_number for e in batch] == [0, 1, 2]
    proto = batch[2].to_event()
    assert (proto.output_text_delta.delta, proto.sequence_number, proto.response_id) == ("abc", 2, "r")


DELTA_FIELDS = st.fixed_dictionaries(
    {
        "arm": st.sampled_from(sorted(DELTA_ARMS)),
        "item_id": st.text(max_size=12),
        "output_index": st.integers(0, 2**31 - 1),
        "content_index": st.integers(0, 2**31 - 1),
        "summary_index": st.integers(0, 2**31 - 1),
        "pieces": st.lists(st.text(max_size=8), min_size=1, max_size=4),
        "stream_id": st.sampled_from(["", "lane-1"]),
        "seq": st.integers(0, 2**31 - 1),
    }
)


@settings(max_examples=200, deadline=None)
@given(DELTA_FIELDS, st.booleans())
def test_a_delta_encodes_to_the_same_json_as_its_protobuf_event(f: dict, ws: bool) -> None:
    d = Delta(f["arm"], f["item_id"], f["output_index"], f["pieces"][0], f["content_index"], f["summary_index"])
    for piece in f["pieces"][1:]:
        d.append(piece)
    d.stream_id, d.response_id, d.sequence_number = f["stream_id"], "resp_1", f["seq"]
    proto = d.to_event()
    assert common.encode_event(d, ws=ws) == common.encode_event(proto, ws=ws)
    assert getattr(proto, f["arm"]).delta == "".join(f["pieces"])
    assert json_codec.event_to_json(proto, ws=ws)["delta"] == "".join(f["pieces"])


# -- through a real session -----------------------------------------------------------------------


async def test_a_wakeup_of_many_one_token_chunks_goes_out_as_one_delta_event():
    # tokens_per_s = 0: the simulated model makes every token ready in one wake-up, one per chunk.
    config = make_config(backends={"sim": {"kind": "simulated", "ttft_ms": 0, "tokens_per_s": 0,
                                           "output_tokens": 200, "call_tools": False}})  # fmt: skip
    engine = await build_engine(config)
    try:
        session = await engine.open_session("", transport="grpc")
        request = service_pb2.SessionRequest()
        request.create.model = "m"
        request.create.input_text = "hi"
        request.create.store = False
        await session.send(request)
        events = []
        async for batch in session.events():
            events += batch
            if any(e.HasField("completed") for e in batch):
                break
        events_in = session.outbox.events_in
        await session.close()
    finally:
        await engine.aclose()
    assert events_in == len(events)  # the turn queued one delta event, not one per token
    deltas = [e.output_text_delta.delta for e in events if e.HasField("output_text_delta")]
    [done] = [e.output_text_done.text for e in events if e.HasField("output_text_done")]
    assert len(deltas) == 1 and deltas[0] == done
    assert [e.sequence_number for e in events] == list(range(len(events)))
    completed = events[-1].completed.response
    assert completed.usage.output_tokens == 200


# -- tokenising the new input while the backend computes its first token -------------------------


async def _two_turns(limits: dict, script: str | None = None, output_tokens: int = 12) -> list:
    """A turn and its cached continuation (a 2 KB tool-ish output) on one session; the responses."""
    sim = {"kind": "simulated", "ttft_ms": 20, "tokens_per_s": 0, "output_tokens": output_tokens, "call_tools": False}
    config = make_config(backends={"sim": {**sim, **({"script": script} if script else {})}}, limits=limits)
    engine = await build_engine(config)
    out = []
    try:
        session = await engine.open_session("", transport="grpc")
        events = session.events()
        previous = ""
        for text in ("first question", "here is a long paste: " + "lorem ipsum dolor sit amet " * 80):
            request = service_pb2.SessionRequest()
            request.create.model = "m"
            request.create.input_text = text
            request.create.store = False
            request.create.previous_response_id = previous
            request.create.include.append("tether:server_timing")
            await session.send(request)
            done = None
            while done is None:
                for ev in await anext(events):
                    if ev.HasField("completed"):
                        done = ev.completed.response
            out.append(done)
            previous = done.id
        await session.close()
    finally:
        await engine.aclose()
    return out


async def test_usage_is_exact_whether_the_input_is_tokenised_before_or_during_the_backend_call(tmp_path):
    script = tmp_path / "script.json"
    script.write_text('{"steps": [{"text": "First."}], "after": {"text": "Next."}}')  # never reads the count
    overlapped = await _two_turns({}, str(script))  # no token budget: only usage needs the count
    upfront = await _two_turns({"tokens_per_minute": 10**9}, str(script))  # a budget needs it before the call
    for a, b in zip(overlapped, upfront, strict=True):
        assert (a.usage.input_tokens, a.usage.cached_tokens) == (b.usage.input_tokens, b.usage.cached_tokens)
        assert "render_overlapped" in a.server_timing.stages_ms
        assert "render_overlapped" not in b.server_timing.stages_ms
    assert overlapped[1].usage.cached_tokens > 0 and overlapped[1].usage.input_tokens > overlapped[1].usage.cached_tokens


# -- the per-process token cache ------------------------------------------------------------------


def test_token_cache_reuses_per_tenant_and_stays_within_its_bytes():
    text = "def handler(request):\n    return compute(request.body)\n" * 20  # ~1 KB
    exact = render.encode(text)
    size = len(text) + exact.itemsize * len(exact) + 128
    cache = render.TokenCache(max_bytes=2 * size)
    assert cache.encode("a", text) == exact and cache.hits == 0
    assert cache.encode("a", text) is cache.encode("a", text) and cache.hits == 2
    cache.encode("b", text)  # another key's text is its own entry: no hit across tenants
    assert cache.hits == 2 and len(cache) == 2 and cache.nbytes == 2 * size  # at the edge: both kept
    cache.encode("c", text)  # past it: the least recently used entry goes
    assert len(cache) == 2 and cache.nbytes <= cache.max_bytes
    cache.encode("a", text)
    assert cache.hits == 2  # "a" was the one evicted


def test_token_cache_skips_short_texts_oversize_texts_and_is_off_at_zero():
    cache = render.TokenCache(max_bytes=4096)
    cache.encode("a", "short")
    big = "word " * 2000  # its entry alone exceeds the cache
    assert cache.encode("a", big) == render.encode(big)
    assert len(cache) == 0 and cache.nbytes == 0
    off = render.TokenCache(max_bytes=0)
    off.encode("a", "x" * 1000)
    off.encode("a", "x" * 1000)
    assert len(off) == 0 and off.hits == 0


async def test_a_stateless_full_resend_does_not_tokenise_its_history_again():
    config = make_config(backends={"sim": {"kind": "simulated", "ttft_ms": 0, "tokens_per_s": 0,
                                           "output_tokens": 4, "call_tools": False}})  # fmt: skip
    engine = await build_engine(config)
    try:
        history = "the tool printed this long log line\n" * 40
        usages = []
        for _ in range(2):  # the same history resent, as an HTTP agent without previous_response_id does
            params = service_pb2.SessionRequest().create
            params.model, params.input_text, params.store = "m", history, False
            async for record in engine.create("", params):
                if isinstance(record, ResponseEnd):  # the last: how the response ended
                    assert record.response is not None
                    usages.append(record.response.usage.input_tokens)
        assert engine.token_cache.hits == 1 and usages[0] == usages[1]
    finally:
        await engine.aclose()


async def test_a_backend_that_reads_the_count_gets_it_before_the_call():
    # The simulated model's default answer states the input token count it was given.
    [first, second] = await _two_turns({}, output_tokens=200)
    for response in (first, second):
        text = response.output[0].message.content[0].output_text.text
        assert f"{response.usage.input_tokens} input tokens" in text
        assert "render_overlapped" not in response.server_timing.stages_ms


def test_builder_puts_a_wakeups_log_probabilities_on_its_delta_and_on_the_message():
    import orjson

    from tether.backends.base import Finish, TextDelta
    from tether.core.builder import OutputBuilder

    b = OutputBuilder()
    lp = [{"token": t, "bytes": list(t.encode()), "logprob": -0.5, "top_logprobs": []} for t in ("Hi", " there")]
    first = b.feed([TextDelta("Hi", lp[:1]), TextDelta(" there", lp[1:])])  # one wake-up: one delta
    (d,) = [e for e in first if type(e).__name__ == "Delta"]
    assert d.delta == "Hi there" and d.logprobs == lp
    b.feed([TextDelta("!"), Finish()])  # a chunk without log probabilities adds none
    done = {e.WhichOneof("event"): e for e in b.close_all()}
    assert orjson.loads(done["output_text_done"].output_text_done.logprobs_json) == lp
    assert orjson.loads(done["content_part_done"].content_part_done.part.output_text.logprobs_json) == lp
    assert b.output[0].message.content[0].output_text.logprobs_json == done["output_text_done"].output_text_done.logprobs_json
