"""`tether_lab.pyspy_top`: own and inclusive shares from a py-spy raw profile (exact counts)."""

from __future__ import annotations

from tether_lab.pyspy_top import frame_name, top

RAW = [
    "run (asyncio/runners.py:190);step (/x/tether/core/turn.py:12);feed (/x/tether/core/builder.py:80) 6",
    "run (asyncio/runners.py:190);step (/x/tether/core/turn.py:14) 2",
    "run (asyncio/runners.py:190);step (/x/tether/core/turn.py:12);feed (/x/tether/core/builder.py:91) 1",
    "import (<frozen importlib._bootstrap>:1) 5",
]


def test_frames_merge_per_function_and_the_filters_pick_the_run():
    assert frame_name("feed (/x/tether/core/builder.py:80)") == "feed (builder.py)"
    assert frame_name("Handle._run (asyncio/events.py:80)") == "Handle._run (events.py)"
    text = top(RAW, "run (", [], 5)
    lines = text.splitlines()
    assert lines[0] == "9 samples"
    own = lines[lines.index("-- own") + 1 : lines.index("-- inclusive")]
    assert own == [" 77.8%  feed (builder.py)", " 22.2%  step (turn.py)"]
    assert "100.0%  step (turn.py)" in text
    assert top(RAW, None, ["builder.py"], 5).splitlines()[0] == "7 samples"
