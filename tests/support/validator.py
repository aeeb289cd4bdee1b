"""The event-sequence oracle applied to every streamed test, on JSON events (any transport).

Per response: the first event is response.created; every event carries the response's id or one
of its items; sequence numbers start at 0 and increase by one; an output index is added once and
done once with the same id/type; content events follow their item's added event; exactly one
terminal event, last; the final output equals the done items in index order.
"""

from __future__ import annotations

from collections.abc import Iterable

TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
LIFECYCLE = {"response.created", "response.in_progress", "response.queued", *TERMINAL}
CONNECTION_SCOPED = {"error", "response.steer.accepted", "response.steer.failed", "response.steer.pending"}


class SequenceError(AssertionError):
    pass


def _key(item: dict) -> tuple:
    return (item.get("type"), item.get("id"), item.get("call_id"))


def validate_events(events: Iterable[dict]) -> dict[str, list[dict]]:
    """Validate a stream (responses may interleave across lanes); returns events by response id."""
    by_response: dict[str, list[dict]] = {}
    item_owner: dict[str, str] = {}
    current_by_lane: dict[str | None, str] = {}
    for ev in events:
        etype = ev.get("type")
        if etype in CONNECTION_SCOPED:
            continue
        lane = ev.get("stream_id")
        if etype in LIFECYCLE:
            rid = ev["response"]["id"]
            if etype == "response.created":
                if rid in by_response:
                    raise SequenceError(f"{rid}: created twice")
                by_response[rid] = []
                current_by_lane[lane] = rid
        else:
            rid = current_by_lane.get(lane)
            if rid is None:
                raise SequenceError(f"{etype} before any response.created on lane {lane!r}")
        if rid not in by_response:
            raise SequenceError(f"{etype} for {rid} before its response.created")
        by_response[rid].append(ev)
    for rid, evs in by_response.items():
        _validate_one(rid, evs, item_owner)
    return by_response


def _validate_one(rid: str, evs: list[dict], item_owner: dict[str, str]) -> None:
    if evs[0]["type"] != "response.created":
        raise SequenceError(f"{rid}: first event is {evs[0]['type']}")
    seqs = [e["sequence_number"] for e in evs]
    if seqs != list(range(len(seqs))):
        raise SequenceError(f"{rid}: sequence numbers {seqs} are not 0..n-1")
    terminals = [e for e in evs if e["type"] in TERMINAL]
    if len(terminals) != 1 or evs[-1]["type"] not in TERMINAL:
        raise SequenceError(f"{rid}: expected exactly one terminal event, last; got {[e['type'] for e in evs]}")
    added: dict[int, dict] = {}
    done: dict[int, dict] = {}
    for e in evs:
        t = e["type"]
        if t in LIFECYCLE:
            if e["response"]["id"] != rid:
                raise SequenceError(f"{rid}: lifecycle event for another id")
            continue
        idx = e.get("output_index")
        if t == "response.compaction.compacting":  # announces the compaction item added next
            if idx != len(added):
                raise SequenceError(f"{rid}: compacting announces index {idx}, next is {len(added)}")
            continue
        if t == "response.output_item.added":
            if idx in added:
                raise SequenceError(f"{rid}: output_index {idx} added twice")
            if idx != len(added):
                raise SequenceError(f"{rid}: output_index {idx} added out of order")
            added[idx] = e["item"]
            item_owner[e["item"].get("id", "")] = rid
        elif t == "response.output_item.done":
            if idx not in added:
                raise SequenceError(f"{rid}: output_index {idx} done before added")
            if idx in done:
                raise SequenceError(f"{rid}: output_index {idx} done twice")
            if _key(added[idx]) != _key(e["item"]):
                raise SequenceError(f"{rid}: item identity changed at {idx}")
            done[idx] = e["item"]
        elif idx is not None:
            if idx not in added or idx in done:
                raise SequenceError(f"{rid}: {t} for output_index {idx} outside its item's lifetime")
            if "item_id" in e and e["item_id"] != added[idx].get("id"):
                raise SequenceError(f"{rid}: {t} item_id does not match output_index {idx}")
    if set(added) != set(done):
        raise SequenceError(f"{rid}: items added but never done: {sorted(set(added) - set(done))}")
    final = evs[-1]["response"]
    if final.get("status") == "completed" or final.get("output"):
        expected = [_key(done[i]) for i in sorted(done)]
        got = [_key(item) for item in final.get("output", [])]
        if got != expected:
            raise SequenceError(f"{rid}: final output {got} differs from done items {expected}")
