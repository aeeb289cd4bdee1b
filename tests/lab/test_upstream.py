"""The paced upstream: the fake Chat Completions server's `paced` scenario (one token per SSE chunk,
at a set interval and in bursts), the lab's own `PacedUpstream` read by the lab's minimal reader,
and a smoke run of `python -m tether_lab.upstream` (upstream, Tether and client processes)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.fakes.chat_server import FakeChatServer, paced
from tether_lab import forwarders, upstream


def _read_events(server: FakeChatServer) -> list[tuple[float, dict]]:
    """(arrival, chunk) of every SSE data event of one streamed call, as it arrived."""
    body = {"model": "gpt-oss-120b", "messages": [{"role": "user", "content": "go"}], "stream": True}
    out: list[tuple[float, dict]] = []
    buf = b""
    with httpx.Client(timeout=10) as client, client.stream(
        "POST", server.base_url + "/chat/completions", json=body, headers={"authorization": "Bearer test-key"}
    ) as resp:
        assert resp.status_code == 200
        for data in resp.iter_raw():
            now = time.monotonic()
            buf += data
            while b"\n\n" in buf:
                frame, buf = buf.split(b"\n\n", 1)
                payload = frame.removeprefix(b"data: ")
                if payload != b"[DONE]":
                    out.append((now, orjson.loads(payload)))
    return out


def test_paced_fake_sends_one_token_per_chunk_in_timed_bursts() -> None:
    count, interval, burst = 12, 0.025, 4
    with FakeChatServer() as server:
        server.push(paced(count, interval, burst))
        events = _read_events(server)
    contents = [(t, c["choices"][0]["delta"].get("content")) for t, c in events if c["choices"]]
    tokens = [(t, text) for t, text in contents if text]
    assert [text for _, text in tokens] == [f" w{i}" for i in range(count)]  # one token per chunk, in order
    assert events[-1][1]["usage"]["completion_tokens"] == count
    # Bursts: a pause of burst x interval (a sleep is never shorter) between each group of `burst`;
    # a late read can only shorten a gap it ends, so the pauses are checked as lower bounds.
    gaps = [b - a for (a, _), (b, _) in zip(tokens, tokens[1:], strict=False)]
    long_gaps = [i for i, g in enumerate(gaps) if g >= interval * burst * 0.9]
    assert set(long_gaps) <= {burst - 1, 2 * burst - 1} and long_gaps
    assert tokens[-1][0] - tokens[0][0] >= (count // burst - 1) * interval * burst * 0.9


def test_paced_fake_without_bursts_spaces_every_token() -> None:
    with FakeChatServer() as server:
        server.push(paced(5, 0.02))
        events = _read_events(server)
    times = [t for t, c in events if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(times) == 5
    assert times[-1] - times[0] >= 4 * 0.02 * 0.9  # a late read shortens one gap, never the span


async def test_lab_upstream_streams_stamped_tokens_to_the_minimal_reader() -> None:
    server = await upstream.PacedUpstream(upstream.Pacing(tokens=30, interval_s=0.002, burst=3, ttft_s=0.01)).start()
    try:

        async def go() -> None:
            return None

        raw = await upstream.client_round("direct", server.base_url, "paced", 3, go)
        row = upstream.summarize(raw, None)
    finally:
        await server.stop()
    assert row["ok"] == 3 and row["tokens"] == 90 and server.streams_done == 3
    # Every token carried its send stamp: the lag is real and small on loopback.
    assert all(len(t["lags"]) == 30 for t in raw["traces"])
    assert 0 <= row["lag_p50_ms"] < 1000 and row["ttft_p50_ms"] >= 10 * 0.9
    assert row["cpu_us_per_token"] > 0


def test_lab_module_smoke(tmp_path: Path) -> None:
    """The whole run, tiny: the floor, httpx and every Tether transport at 2 streams (seconds)."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "tether_lab.upstream", "--streams", "2", "--tokens", "8", "--interval-ms", "5",
         "--ttft-ms", "5", "--burst", "1", "--modes",
         "direct,relay,direct-httpx,ws,sse,grpc,ws-floor,sse-floor,grpc-floor,litellm", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "upstream.json").read_text())
    modes = {r["mode"]: r for r in data["rows"]}
    paths = ("direct", "relay", "direct-httpx", "ws", "sse", "grpc", "ws-floor", "sse-floor", "grpc-floor")
    assert set(paths) <= set(modes)
    for mode in paths:
        r = modes[mode]
        assert r["ok"] == 2 and r["tokens"] == 16, r
        assert r["cpu_us_per_token"] is not None and r["lag_p50_ms"] is not None
    assert modes["ws"]["x_floor"] is not None
    assert all(modes[m]["x_forwarder"] is not None for m in ("ws", "sse", "grpc"))  # against its own forwarder
    assert "| upstream | streams | path |" in (out / "upstream.md").read_text()
    if "litellm" not in modes:
        assert any("LiteLLM" in n for n in data["notes"])


def test_interleaved_passes_give_each_path_its_median_ratio_to_the_reader(tmp_path: Path) -> None:
    """`--passes 2`: every path streamed twice, interleaved with the reader; a row takes both
    passes together and gives the median of its per-pass ratios beside the ratio of totals."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "tether_lab.upstream", "--streams", "2", "--tokens", "6", "--interval-ms", "5",
         "--ttft-ms", "5", "--burst", "1", "--modes", "direct,sse", "--passes", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("pass 2/2") == 2
    rows = {r["mode"]: r for r in json.loads((out / "upstream.json").read_text())["rows"]}
    for r in rows.values():
        assert r["ok"] == 4 and r["tokens"] == 24 and len(r["pass_cpu_us_per_token"]) == 2, r
    sse, direct = rows["sse"], rows["direct"]
    ratios = [a / b for a, b in zip(sse["pass_cpu_us_per_token"], direct["pass_cpu_us_per_token"], strict=True)]
    assert sse["x_floor_paired"] == pytest.approx(sum(ratios) / 2)  # the median of two
    assert sse["x_floor"] == pytest.approx(sse["cpu_us_per_token"] / direct["cpu_us_per_token"])


def test_one_pass_gives_no_paired_ratio() -> None:
    rows = [{"pacing": "p", "streams": 1, "mode": m, "cpu_us_per_token": c, "pass_cpu_us_per_token": [c],
             "ttft_p50_ms": 1.0, "lag_p50_ms": 1.0, "itl_p50_ms": 1.0} for m, c in (("direct", 10.0), ("ws", 15.0))]
    upstream._add_ratios(rows)
    assert rows[1]["x_floor"] == 1.5 and rows[1]["x_floor_paired"] is None


def test_pacing_refuses_nonsense() -> None:
    for bad in ({"tokens": 0}, {"burst": 0}, {"interval_s": -1.0}):
        try:
            upstream.Pacing(**bad)  # type: ignore[arg-type]
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")


async def test_the_byte_relay_passes_the_stream_through_unchanged() -> None:
    server = await upstream.PacedUpstream(upstream.Pacing(tokens=12, interval_s=0.001, burst=4)).start()
    relay = await upstream.ByteRelay(server.port).start()
    try:

        async def go() -> None:
            return None

        raw = await upstream.client_round("relay", f"http://127.0.0.1:{relay.port}/v1", "paced", 2, go)
    finally:
        await relay.stop()
        await server.stop()
    row = upstream.summarize(raw, None)
    assert row["ok"] == 2 and row["tokens"] == 24 and server.streams_done == 2


async def test_the_forwarders_deliver_every_token_on_each_transport() -> None:
    """The floors (`tether_lab.forwarders`) speak each transport well enough for the lab's own
    clients: every stamped token arrives once, and the stream ends `completed` with the
    token count, through WebSocket mode, SSE and the gRPC Session."""
    server = await upstream.PacedUpstream(upstream.Pacing(tokens=15, interval_s=0.001, burst=2, ttft_s=0.0)).start()
    http = await forwarders.HttpForwarder(server.port).start()
    grpc_fw = await forwarders.GrpcForwarder(server.port).start()
    targets = {"ws-floor": f"ws://127.0.0.1:{http.port}/v1/responses", "sse-floor": f"http://127.0.0.1:{http.port}/v1",
               "grpc-floor": f"127.0.0.1:{grpc_fw.port}"}

    async def go() -> None:
        return None

    try:
        for mode, target in targets.items():
            raw = await asyncio.wait_for(upstream.client_round(mode, target, "paced", 2, go), 30)
            assert [t["error"] for t in raw["traces"]] == [None, None], mode
            for trace in raw["traces"]:
                assert trace["ok"] and trace["tokens"] == 15, (mode, trace)
                assert len(trace["lags"]) == 15  # every stamp arrived, none twice
            assert upstream.summarize(raw, None)["ok"] == 2
    finally:
        await grpc_fw.stop()
        await http.stop()
        await server.stop()
    assert server.streams_done == 6


async def test_client_round_reports_a_failing_stream() -> None:
    server = await upstream.PacedUpstream(upstream.Pacing(tokens=2, interval_s=0.0)).start()
    await server.stop()  # nothing listens any more: the stream fails, the round still reports

    async def go() -> None:
        return None

    raw = await asyncio.wait_for(upstream.client_round("direct", server.base_url, "paced", 1, go), 10)
    assert raw["traces"][0]["error"] and not raw["traces"][0]["ok"]
    assert upstream.summarize(raw, None)["ok"] == 0
