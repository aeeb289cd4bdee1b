"""`Node.items()`: the chain's items oldest first, built on the nearest ancestor's memo, so a
continuation does not walk the whole history again (exact lists, no timing)."""

from __future__ import annotations

from tether.compaction_codec import encode_payload
from tether.core.chain import Node, Segment
from tether.core.items import user_message
from tether.responses.v1 import items_pb2


def seg(text: str) -> Segment:
    return Segment.of(text, user_message(text))


def texts(items) -> list[str]:
    return [i.message.content[0].input_text.text for i in items]


def test_items_are_the_whole_chain_and_a_continuation_builds_on_its_parents_memo():
    a = Node.extend(None, (seg("a1"), seg("a2")))
    b = Node.extend(a, (seg("b1"),))
    assert b.memo_items is None and a.memo_items is None
    assert texts(b.items()) == ["a1", "a2", "b1"]
    assert b.memo_items is not None and a.memo_items is None  # only the node asked keeps a memo
    c = Node.extend(b, (seg("c1"), seg("c2")))
    branch = Node.extend(b, (seg("x1"),))  # another continuation of the same response
    assert texts(c.items()) == ["a1", "a2", "b1", "c1", "c2"]
    assert texts(branch.items()) == ["a1", "a2", "b1", "x1"]
    # The memo is built on b's: a node that kept a different prefix would show here.
    object.__setattr__(b, "memo_items", (*b.memo_items, user_message("marker")))
    assert texts(Node.extend(b, (seg("d1"),)).items()) == ["a1", "a2", "b1", "marker", "d1"]
    returned = c.items()
    returned.append(user_message("caller's own"))  # callers get a list of their own
    assert texts(c.items()) == ["a1", "a2", "b1", "c1", "c2"]


def test_an_agents_compaction_starts_no_window_of_the_chain():
    """A multi-agent response's compaction item is one agent's (tagged): the chain keeps every
    item; an untagged one (a single-agent turn's) replaces what came before it."""
    def compaction(agent: str | None) -> Segment:
        item = items_pb2.Item()
        item.compaction.id, item.compaction.encrypted_content = "cmp_1", encode_payload("summary", 0)
        if agent is not None:
            item.agent.agent_name = agent
        return Segment.of("", item)

    a = Node.extend(None, (seg("a1"), seg("a2")))
    tagged = Node.continue_with(a, (compaction("/root/worker_1"), seg("b1")))
    assert tagged.parent is a and [i.WhichOneof("item") for i in tagged.items()] == ["message"] * 2 + ["compaction", "message"]
    window = Node.continue_with(a, (compaction(None), seg("b1")))
    assert window.parent is None and [i.WhichOneof("item") for i in window.items()] == ["compaction", "message"]
