"""The rolling-restart campaign, small: agents through nginx while both replicas restart.

`tether_lab.rollout_restart` as the suite runs it: two `tether serve` replicas sharing Redis
behind nginx (deploy/nginx/tether.conf), two store=true agents in WebSocket mode (the openai SDK
with `on_reconnecting`), one store=true agent over HTTP (SSE, the SDK's retries) and two
store=false agents in WebSocket mode, all running tool loops of the `bugfix20` shape. Each replica
gets SIGTERM once, the second only after the first is back. No store=true turn may fail or be
lost, no response may be completed that no agent received, no agent may wait long for a turn, and
the store=false agents must see exactly the documented behaviour: `previous_response_not_found`
on the first continuation after a reconnect (and only then), then a full-context create that
completes.

The full campaign (PostgreSQL too, more agents, three replicas) is `python -m
tether_lab.rollout_restart`; docs/deployment.md has its figures.
"""

from __future__ import annotations

from tether_lab.rollout_restart import AFTER_RECONNECT, campaign, parse_args
from tether_lab.scaleout import nginx_binary, redis_reachable, scratch_store

from .conftest import unavailable


async def test_agents_lose_nothing_while_every_replica_restarts(tmp_path) -> None:
    if nginx_binary() is None:
        unavailable("nginx is not installed: apt-get install -y nginx")
    why = redis_reachable()
    if why:
        unavailable(why)
    args = parse_args(["--ws-agents", "2", "--http-agents", "1", "--ephemeral-agents", "2",
                       "--warmup-s", "1", "--tail-s", "1", "--grace-s", "5"])  # fmt: skip
    with scratch_store("redis", tmp_path) as url:
        result = await campaign("redis", url, tmp_path, args)

    assert result.problems() == []
    assert [r.exit_code for r in result.restarts] == [0, 0]
    ws, http, ephemeral = (result.tallies[k] for k in ("ws", "http", "ws-ephemeral"))
    for kind, tally in result.tallies.items():
        assert tally.turns > 10, (kind, tally)
        # A restart costs a reconnect and a resent turn, not a long wait (a replica nginx kept
        # marked down after it came back made agents wait out its fail_timeout: 10 s and more).
        assert tally.max_wait_s < 5.0, (kind, tally.max_wait_s, tally.seen)
    # Every WebSocket agent was on a replica that restarted, and the SDK reconnected it.
    assert sum(n for what, n in ws.seen.items() if what.startswith("reconnect after close")) >= 2, ws.seen
    # store=false: a continuation after a reconnect got previous_response_not_found and the
    # full-context create completed; none was found after a reconnect, none missing on the
    # same connection (`problems` checks both). Each agent reconnects at least once, and only a
    # reconnect at a rollout's first turn (1 turn in 23) is followed by no continuation.
    assert ephemeral.seen[AFTER_RECONNECT] >= 1, ephemeral.seen
    assert http.failed == 0 and http.lost == 0
