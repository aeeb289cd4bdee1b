"""`python -m tether_lab.pyspy_top PROFILE.raw`: the top frames of a py-spy raw profile, by own and
by inclusive share of the samples, with file paths shortened and line numbers merged per function.

    py-spy record -r 500 -f raw -o turns.raw -- python -m tether_lab.hotpath turns
    python -m tether_lab.pyspy_top turns.raw --within run_until_complete --without build_engine

`--within` keeps only the samples whose stack holds that text (the measured run, not the imports
before it); `--without` drops those that hold it (start-up work inside the run; an idle loop's
`select`).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_PATH = re.compile(r" \((?:[^()]*/)?([^/():]+)(?::\d+)?\)")


def frame_name(frame: str) -> str:
    """`func (/long/path/file.py:12)` -> `func (file.py)`: one entry per function."""
    return _PATH.sub(r" (\1)", frame)


def top(lines: list[str], within: str | None, without: list[str], n: int) -> str:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        if within and within not in stack or any(w in stack for w in without):
            continue
        samples = int(count)
        total += samples
        frames = [frame_name(f) for f in stack.split(";")]
        own[frames[-1]] += samples
        for f in set(frames):
            inclusive[f] += samples
    out = [f"{total} samples"]
    for title, counter in (("own", own), ("inclusive", inclusive)):
        out.append(f"-- {title}")
        out += [f"{100 * k / max(total, 1):5.1f}%  {f}" for f, k in counter.most_common(n)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tether_lab.pyspy_top", description=__doc__.split("\n\n")[0])
    p.add_argument("profile", type=Path, help="a `py-spy record -f raw` file")
    p.add_argument("--within", help="keep only stacks containing this text")
    p.add_argument("--without", action="append", default=[], help="drop stacks containing this text (repeatable)")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    print(top(args.profile.read_text().splitlines(), args.within, args.without, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
