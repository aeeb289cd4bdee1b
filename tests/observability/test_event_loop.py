"""The event loop (tether/eventloop.py, `server.event_loop`): checked when the configuration loads,
from every source, and what a served process really runs, reported over a real socket
(`tether_event_loop_info{event_loop}` on `/metrics`) and in the "tether serving" log line. The
`--workers` case is in tests/scaleout/test_workers.py. The served process also freezes its startup
heap (`tether.server.freeze_startup_heap`), which that log line counts."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import grpc
import httpx
import pytest
from websockets.asyncio.client import connect

from tests.support.grpc_client import RawSession
from tests.support.metrics import samples
from tether import cli, eventloop
from tether.config import load_config
from tether_lab.load import write_config
from tether_lab.processes import ServerProcess
from tether_lab.scaleout import ws_turn

# Where pyproject.toml installs uvloop with Tether.
UVLOOP_INSTALLED = sys.platform != "win32" and sys.implementation.name == "cpython"
DEFAULT_LOOP = "asyncio"
OTHER_LOOP = "uvloop" if UVLOOP_INSTALLED else "asyncio"  # what "auto" picks
AUTH = {"authorization": "Bearer sk-any"}


async def _loop_name() -> str:
    return eventloop.running_loop()


def test_an_unknown_event_loop_is_refused_from_every_source_naming_the_setting(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[server]\nevent_loop = "trio"\n')
    with pytest.raises(
        ValueError, match=r"server\.event_loop must be one of auto, uvloop, asyncio, got 'trio'"
    ):
        load_config(bad, env={})
    with pytest.raises(ValueError, match=r"server\.event_loop"):
        load_config(None, env={"TETHER_SERVER__EVENT_LOOP": "gevent"})
    with pytest.raises(
        SystemExit, match=r"--set server\.event_loop=tokio: server\.event_loop must be one of"
    ):
        cli.main(["serve", "--set", "server.event_loop=tokio"])
    assert load_config(None, env={}).server.event_loop == "asyncio"
    assert load_config(None, env={"TETHER_SERVER__EVENT_LOOP": "auto"}).server.event_loop == "auto"


@pytest.mark.skipif(not UVLOOP_INSTALLED, reason="uvloop is a dependency on CPython outside Windows only")
def test_uvloop_is_accepted_where_installed_and_each_choice_runs_its_loop() -> None:
    assert load_config(None, env={"TETHER_SERVER__EVENT_LOOP": "uvloop"}).server.event_loop == "uvloop"
    assert eventloop.run(_loop_name()) == "asyncio"  # the default
    assert eventloop.run(_loop_name(), "auto") == "uvloop"
    assert eventloop.run(_loop_name(), "uvloop") == "uvloop"
    assert eventloop.run(_loop_name(), "asyncio") == "asyncio"


def test_uvloop_where_it_cannot_be_imported_is_refused_and_auto_falls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    eventloop.uvloop_available.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"server\.event_loop = 'uvloop', but uvloop cannot be imported"):
            load_config(None, env={"TETHER_SERVER__EVENT_LOOP": "uvloop"})
        assert load_config(None, env={"TETHER_SERVER__EVENT_LOOP": "auto"}).server.event_loop == "auto"
        assert eventloop.run(_loop_name(), "auto") == "asyncio"
    finally:
        eventloop.uvloop_available.cache_clear()  # the next call looks again, with uvloop back


def _event_loops(base_url: str) -> dict[str, float]:
    scrape = samples(httpx.get(f"{base_url}/metrics", timeout=10).text)
    return {
        dict(labels)["event_loop"]: v
        for (name, labels), v in scrape.items()
        if name == "tether_event_loop_info"
    }


def test_serve_runs_the_default_loop_and_a_remote_bridge_the_configured_one(tmp_path: Path) -> None:
    config = write_config(tmp_path / "t.toml", store=f"sqlite:///{tmp_path / 't.db'}")
    with ServerProcess(config, tmp_path, name="serve") as server:
        bridge = ServerProcess(workdir=tmp_path, name="bridge", program="bridge",
                               args=["--upstream", server.grpc_target, "--set", f"server.event_loop={OTHER_LOOP}"])  # fmt: skip
        with bridge:
            assert _event_loops(server.base_url) == {DEFAULT_LOOP: 1.0}
            assert _event_loops(bridge.base_url) == {OTHER_LOOP: 1.0}

            async def turns() -> None:
                for url in (server.ws_url, bridge.ws_url):  # the bridge's goes on over gRPC to the server
                    # (the bridge forwards the caller's key; the open server takes any)
                    async with connect(url, compression=None, additional_headers=AUTH) as conn:
                        done = await ws_turn(conn, model="tether-sim", input="hello", store=False)
                        assert done["type"] == "response.completed", (url, done)

            asyncio.run(turns())
            assert bridge.terminate(30) == 0, bridge.logs()  # SIGTERM drains on either loop
        assert server.terminate(30) == 0, server.logs()


def test_serve_on_the_other_loop_says_so_and_serves_a_grpc_turn(tmp_path: Path) -> None:
    config = write_config(tmp_path / "t.toml", store=f"sqlite:///{tmp_path / 't.db'}")
    with ServerProcess(
        config, tmp_path, log_level="info",
        args=["--set", f"server.event_loop={OTHER_LOOP}", "--set", "server.gc_young_threshold=12345"],
    ) as server:
        assert _event_loops(server.base_url) == {OTHER_LOOP: 1.0}

        async def turn() -> None:
            async with grpc.aio.insecure_channel(server.grpc_target) as channel:
                session = RawSession(channel)
                await session.create(model="tether-sim", input="hello", store=False)
                assert (await session.until_terminal()).WhichOneof("event") == "completed"
                await session.close()

        asyncio.run(turn())
        assert server.terminate(30) == 0, server.logs()
    records = [json.loads(line) for line in server.log_text().splitlines() if line.startswith("{")]
    serving = [r for r in records if r.get("msg") == "tether serving"]
    assert [r["event_loop"] for r in serving] == [OTHER_LOOP], server.log_text()[-2000:]
    assert serving[0]["frozen_objects"] > 10_000  # the startup heap left the collector (gc.freeze)
    assert serving[0]["gc_threshold"][0] == 12345  # server.gc_young_threshold
