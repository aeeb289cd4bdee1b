"""Usage accounting: the backend's figures where it reports them, Tether's counts otherwise."""

from __future__ import annotations

from tests.fakes.items import assistant
from tether.backends.base import Usage
from tether.core.accounting import OutputCap, TurnUsage, account, capped


def test_reported_figures_win_and_are_labelled():
    u = account(Usage(120, 100, 7, 0), input_tokens=90, cached_tokens=80, output=[assistant("a b c")])
    assert (u.input_tokens, u.cached_tokens, u.output_tokens, u.reasoning_tokens) == (120, 100, 7, 0)
    assert set(u.sources.values()) == {"upstream"}


def test_nothing_reported_is_counted_here():
    u = account(None, input_tokens=90, cached_tokens=80, output=[assistant("hello there")])
    assert (u.input_tokens, u.cached_tokens) == (90, 80) and u.output_tokens > 0
    assert set(u.sources.values()) == {"tether"}


def test_a_reported_zero_for_a_non_empty_answer_is_not_billed():
    u = account(Usage(10, 0, 0, 0), input_tokens=9, cached_tokens=0, output=[assistant("some words")])
    assert u.output_tokens > 0 and u.sources["output"] == "tether"
    empty = account(Usage(10, 0, 0, 0), input_tokens=9, cached_tokens=0, output=[])
    assert empty.output_tokens == 0 and empty.sources["output"] == "upstream"


def test_cached_share_scaled_to_the_servers_input_when_it_reports_no_reuse():
    u = account(Usage(input_tokens=57, output_tokens=16), input_tokens=60, cached_tokens=30, output=[])
    assert u.cached_tokens == 28 and u.sources["cached"] == "tether" and u.sources["input"] == "upstream"


def test_model_tokenizer_counts_are_labelled():
    u = account(Usage(output_tokens=5, model_counted=frozenset({"output"})), input_tokens=9, cached_tokens=0,
                output=[assistant("x")])  # fmt: skip
    assert u.output_tokens == 5 and u.sources["output"] == "model_tokenizer"


def test_a_custom_tool_calls_input_is_counted_as_output():
    from tether.protocol.calls import custom_call_item

    patch = "*** Begin Patch\n*** Add File: a.py\n+print('hi')\n*** End Patch"
    short = account(
        None, input_tokens=9, cached_tokens=0, output=[custom_call_item("ctc_1", "c1", "p", "x", "completed")]
    )
    long = account(
        None,
        input_tokens=9,
        cached_tokens=0,
        output=[custom_call_item("ctc_1", "c1", "p", patch, "completed")],
    )
    assert long.output_tokens > short.output_tokens > 0


def test_the_output_cap_is_exact_at_its_edge_and_tokenises_only_past_its_bytes():
    cap = OutputCap(10)
    cap.add(" word" * 2)
    assert not cap.over() and cap.counted == 0  # 10 bytes: not tokenised
    cap.add(" word" * 8)
    assert not cap.over() and cap.counted == 10  # 10 tokens: at the cap
    cap.add(" word")
    assert cap.over()  # 11: past it
    wide = OutputCap(3)  # non-ASCII text is bounded by its UTF-8 bytes, not its characters
    wide.add("日本語のテキスト")
    assert wide.over()


def test_usage_past_the_cap_is_billed_the_cap():
    u = account(Usage(10, 0, 156_601, 100_000), input_tokens=9, cached_tokens=0, output=[])
    assert capped(u, 50) == TurnUsage(10, 0, 50, 50, u.sources)
    assert capped(u, 200_000) is u


def test_reported_output_without_its_reasoning_part_counts_only_the_reasoning_items(monkeypatch):
    """vLLM reports completion_tokens but no reasoning details: the reasoning part is counted from
    the reasoning items alone, and an answer without any is not tokenised at all."""
    from tests.fakes.items import reasoning
    from tether import render

    encoded: list[str] = []
    real = render.encode
    monkeypatch.setattr(render, "encode", lambda text: encoded.append(text) or real(text))
    answer = [assistant("a long answer " * 50)]
    u = account(Usage(10, None, 150), input_tokens=9, cached_tokens=0, output=answer)
    assert (u.output_tokens, u.reasoning_tokens) == (150, 0) and u.sources["reasoning"] == "tether"
    assert encoded == []
    thought = reasoning("think it through")
    u = account(Usage(10, None, 150), input_tokens=9, cached_tokens=0, output=[thought, *answer])
    assert u.output_tokens == 150 and u.reasoning_tokens == len(real("think it through"))
    assert encoded == ["think it through"]
