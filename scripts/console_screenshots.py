"""Drive the console of a running Tether in headless Chromium and save its three views.

    .venv/bin/tether serve &
    .venv/bin/python scripts/console_screenshots.py --workload bugfix20 --speed 1000 --out /tmp/console

Prints what each view showed (the race's figures per transport); `server-live.png` is the server
view taken while the race runs. Needs Debian's `chromium` and
`chromium-driver` and selenium (the dev extra). The same steps as tests/console/test_console_browser.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.console.test_console_browser import drive  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--origin", default="http://127.0.0.1:8000")
    p.add_argument("--key", default="", help="an admin API key (empty for an open server)")
    p.add_argument("--workload", default="bugfix20")
    p.add_argument("--speed", default="1000")
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument("--out", type=Path, default=Path("console-screenshots"))
    args = p.parse_args()
    from selenium import webdriver

    args.out.mkdir(parents=True, exist_ok=True)
    seen = drive(webdriver, args.origin, args.out, key=args.key, workload=args.workload, speed=args.speed,
                 race_timeout_s=args.timeout_s, live_server_shot=True)
    seen.pop("log", None)
    print(json.dumps(seen, indent=1))


if __name__ == "__main__":
    main()
