"""`tether bench throughput --workers 2` end to end on a tiny round: every stream's store=false
continuation resolves on its own connection, and CPU is reported per worker (no timing asserts)."""

from __future__ import annotations

import argparse
import asyncio

from tether_lab import throughput


def test_worker_pids_come_from_the_supervisors_start_lines():
    log = ("tether: worker 0 started (pid 11)\ntether: worker 1 started (pid 12)\n"
           "tether: worker 1 (pid 12) exited with 1; restarting in 0.5 s\ntether: worker 1 started (pid 13)\n")  # fmt: skip
    assert throughput.worker_pids(log) == [11, 13]


def test_two_workers_keep_each_connections_state_and_report_cpu_per_worker(tmp_path):
    args = argparse.Namespace(streams=12, answer_tokens=40, tps=4000.0, coalesce="default", tokens_per_chunk="1",
                              workers="2", set=[])  # fmt: skip
    [row] = asyncio.run(throughput.run(args, tmp_path))
    assert row["workers"] == 2
    assert row["ok"] == row["continued"] == 12  # each continuation found its state where its socket is
    assert len(row["worker_cpu_s"]) == 2
    assert row["server_cpu_s"] == sum(row["worker_cpu_s"])
