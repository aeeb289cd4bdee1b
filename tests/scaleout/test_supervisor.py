"""The worker supervisor in-process, with stand-in worker commands (fast; no Tether inside)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from tether.config import TetherConfig
from tether.workers import Supervisor, WorkerConfigError, check_config

# A stand-in worker: reads its pickled (index, config) like a real one, then waits for SIGTERM.
POLITE = (
    "import signal, sys, time; sys.stdin.buffer.read();"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(60)"
)
# The same, saying when its handler is in place (a file per worker in the directory it is given),
# so a test signals it only then: on a loaded machine a worker's interpreter may not be up yet
# 0.2 s after its start, and the default SIGTERM action would end it with -15.
POLITE_READY = (
    "import os, signal, sys, time; sys.stdin.buffer.read();"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0));"
    "open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close(); time.sleep(60)"
)
STUBBORN = "import signal, sys, time; sys.stdin.buffer.read(); signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
CRASHING = "import sys; sys.stdin.buffer.read(); sys.exit(3)"


def _config(workers: int = 2, grace: float = 0.2) -> TetherConfig:
    cfg = TetherConfig()
    cfg.store = "sqlite:///unused.db"
    cfg.server.workers = workers
    cfg.server.shutdown_grace_s = grace
    return cfg


def _signal_when_started(sup: Supervisor, n: int, sig: int = signal.SIGTERM, ready: Path | None = None) -> threading.Thread:
    """Send `sig` to this process once `n` workers were started (the supervisor's handler is in
    place by then: it is installed before the first start), and with `ready`, once `n` workers
    said there that their own handler is in place."""

    def run() -> None:
        deadline = time.monotonic() + 30
        while sup.starts < n and time.monotonic() < deadline:
            time.sleep(0.01)
        while ready is not None and len(list(ready.iterdir())) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        os.kill(os.getpid(), sig)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_sigterm_is_forwarded_and_the_supervisor_exits_zero(tmp_path) -> None:
    sup = Supervisor(_config(), command=[sys.executable, "-c", POLITE_READY, str(tmp_path)])
    _signal_when_started(sup, 2, ready=tmp_path)
    assert sup.run() == 0
    assert all(slot.proc is not None and slot.proc.returncode == 0 for slot in sup.slots)


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace_period() -> None:
    sup = Supervisor(_config(workers=1), command=[sys.executable, "-c", STUBBORN], stop_extra_s=0.3)
    _signal_when_started(sup, 1)
    assert sup.run() == 1
    assert sup.slots[0].proc is not None and sup.slots[0].proc.returncode == -signal.SIGKILL


def test_a_worker_that_keeps_crashing_stops_everything() -> None:
    sup = Supervisor(
        _config(workers=2), command=[sys.executable, "-c", CRASHING], restart_limit=2, backoff_first_s=0.01
    )
    assert sup.run() == 1
    assert sup.gave_up
    assert sup.starts >= 3  # a slot's first start and two restarts, then the third exit gives up


@pytest.mark.parametrize("store", ["memory://", "MEMORY://"])
def test_several_workers_need_a_shared_store(store: str) -> None:
    cfg = _config()
    cfg.store = store
    with pytest.raises(WorkerConfigError, match="share"):
        check_config(cfg)
    cfg.server.workers = 1
    check_config(cfg)  # one process may keep its store to itself
