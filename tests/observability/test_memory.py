"""Process memory (tether/process_memory.py): `tether serve` runs on the configured allocator, and its
memory reclaimer runs after connections close. The figures (RSS back near the baseline after
1,000 connections) come from the load campaign, docs/reliability.md "Load"."""

from __future__ import annotations

import asyncio
import ctypes.util
import os
import sys
import time
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.support.metrics import samples, value
from tether.config import load_config
from tether.process_memory import MemoryReclaimer, exec_with_allocator, resident_bytes, trim_heap
from tether_lab.load import write_config
from tether_lab.processes import ServerProcess

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="allocator switch and /proc are Linux-only"
)


def _proc_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().partition("=")[::2] for e in raw if e)


async def _scrape(server: ServerProcess) -> dict:
    async with httpx.AsyncClient(timeout=10) as h:
        return samples((await h.get(f"{server.base_url}/metrics")).text)


def _serve(tmp_path: Path, *extra: str) -> ServerProcess:
    config = write_config(tmp_path / "t.toml", store=f"sqlite:///{tmp_path / 't.db'}")
    return ServerProcess(config, args=["--set", "server.memory_reclaim_interval_s=0.2", *extra])


@linux_only
@pytest.mark.skipif("PYTHONMALLOC" in os.environ, reason="an explicit PYTHONMALLOC overrides the setting")
@pytest.mark.parametrize("allocator", ["auto", "jemalloc", "malloc", "pymalloc"])
def test_serve_runs_on_the_configured_allocator(tmp_path: Path, allocator: str) -> None:
    has_jemalloc = ctypes.util.find_library("jemalloc") is not None
    if allocator == "jemalloc" and not has_jemalloc:
        pytest.skip("libjemalloc is not installed")
    expected = {"auto": "jemalloc" if has_jemalloc else "malloc"}.get(allocator, allocator)
    with _serve(tmp_path, "--set", f"server.allocator={allocator}") as server:
        env = _proc_env(server.pid)
        maps = Path(f"/proc/{server.pid}/maps").read_text()
        scrape = asyncio.run(_scrape(server))
    assert env.get("PYTHONMALLOC") == (None if expected == "pymalloc" else "malloc")
    assert ("libjemalloc" in maps) == (expected == "jemalloc")  # really loaded, not only named
    assert value(scrape, "tether_allocator_info", allocator=expected) == 1
    assert sum(v for (name, _), v in scrape.items() if name == "tether_allocator_info") == 1


@linux_only
def test_memory_is_reclaimed_after_the_connections_close(tmp_path: Path) -> None:
    async def scenario(server: ServerProcess) -> tuple[dict, dict]:
        conns = [await connect(server.ws_url) for _ in range(20)]
        for c in conns:
            await c.send('{"type": "response.create", "model": "m", "input": "hello there"}')
            while '"response.completed"' not in await c.recv():
                pass
        during = await _scrape(server)
        for c in conns:
            await c.close()
        deadline = time.monotonic() + 60  # a hang guard, not a timing assertion
        while True:
            after = await _scrape(server)
            if value(after, "tether_memory_reclaims_total") >= 1 or time.monotonic() > deadline:
                return during, after
            await asyncio.sleep(0.1)

    with _serve(tmp_path) as server:
        during, after = asyncio.run(scenario(server))
    # While 20 sessions were open nothing ran (fewer closed than open); once they closed it did.
    assert value(during, "tether_connections", transport="websocket") == 20
    assert value(during, "tether_memory_reclaims_total") == 0
    assert value(after, "tether_connections", transport="websocket") == 0
    assert value(after, "tether_memory_reclaims_total") >= 1
    assert value(after, "tether_memory_reclaim_seconds_total") > 0


async def test_reclaimer_runs_after_as_many_closes_as_open_sessions() -> None:
    state = {"open": 10, "closed": 0, "streaming": 0}
    runs: list[tuple[float, int]] = []
    ran = asyncio.Event()

    def on_reclaim(seconds: float, released: int) -> None:
        runs.append((seconds, released))
        ran.set()

    reclaimer = MemoryReclaimer(lambda: (state["open"], state["closed"]), 0.05, on_reclaim, lambda: state["streaming"])
    assert not reclaimer.due()  # nothing closed yet
    state.update(open=6, closed=4)
    assert not reclaimer.due()  # 4 closed < 6 still open: their memory is being reused
    state.update(open=5, closed=5, streaming=1)
    assert not reclaimer.due()  # a response streams: a full collection would stall it
    state.update(streaming=0)
    assert reclaimer.due()
    reclaimer.start()
    await asyncio.wait_for(ran.wait(), 30)  # a hang guard
    await reclaimer.stop()
    assert reclaimer.runs == 1 and len(runs) == 1
    seconds, released = runs[0]
    assert seconds > 0 and released >= 0
    assert not reclaimer.due()  # counted from the last run
    state.update(open=0, closed=6)
    assert reclaimer.due()


async def test_a_zero_interval_never_starts_the_reclaimer() -> None:
    reclaimer = MemoryReclaimer(lambda: (0, 5), 0).start()
    assert reclaimer._task is None
    await reclaimer.stop()


@linux_only
def test_trim_heap_gives_freed_memory_back() -> None:
    if not trim_heap():
        pytest.skip("not glibc")
    # 64 MiB of 64 KiB buffers: below glibc's mmap threshold, so they come from the heap.
    chunks = [bytearray(64 * 1024) for _ in range(1024)]
    for c in chunks:
        c[::4096] = b"x" * len(c[::4096])  # touch every page
    held = resident_bytes()
    del chunks[:-1]  # the last one pins the heap's top: only malloc_trim can return the rest
    trim_heap()
    assert resident_bytes() < held - 32 * 2**20


def test_exec_with_allocator_leaves_explicit_choices_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="server.allocator"):
        exec_with_allocator("tcmalloc")
    exec_with_allocator("pymalloc")  # CPython's default: nothing to do, no exec
    monkeypatch.setenv("PYTHONMALLOC", "pymalloc_debug")
    exec_with_allocator("malloc")  # an explicit PYTHONMALLOC wins: no exec


def test_the_allocator_setting_is_checked_from_every_source(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[server]\nallocator = "tcmalloc"\n')
    with pytest.raises(ValueError, match="server.allocator"):
        load_config(bad, env={})
    with pytest.raises(ValueError, match="server.allocator"):
        load_config(None, env={"TETHER_SERVER__ALLOCATOR": "tcmalloc"})
    assert load_config(None, env={"TETHER_SERVER__ALLOCATOR": "pymalloc"}).server.allocator == "pymalloc"
    assert load_config(None, env={}).server.allocator == "auto"
