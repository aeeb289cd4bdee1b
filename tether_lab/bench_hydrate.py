"""Hydration cost vs chain length, for one store URL.

    python -m tether_lab.bench_hydrate --url sqlite:///tmp/bench.db --turns 10,50,200

For each chain length N it writes a chain of N turns (each turn: one new user message and one
assistant message of `--chars` characters, continuing the previous response, as the session core
writes them), then times `load_context` of the last response `--repeat` times (after a warm-up)
and prints microseconds per hydration. Each run writes under a fresh random tenant and deletes
its responses afterwards, so it can point at a shared database (use a scratch one anyway).
On PostgreSQL it runs ANALYZE after writing each chain (`--no-analyze` to skip): freshly filled,
never-analyzed tables can get a sequential-scan plan that autovacuum would fix within a minute in
a real deployment (see tether/store/postgres.py).
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time

from tether import eventloop
from tether.responses.v1 import items_pb2, response_pb2
from tether.store.base import KeyedItem, ResponseRecord
from tether.store.factory import open_store


def _message(item_id: str, role: str, chars: int) -> items_pb2.Item:
    text = (f"{role} {item_id} " * (chars // 8 + 1))[:chars]
    return items_pb2.Item(
        message=items_pb2.Message(id=item_id, role=role, status="completed", content_text=text)
    )


async def _write_chain(store, tenant: str, run: str, turns: int, chars: int) -> list[str]:
    context: list[str] = []
    previous = ""
    ids = []
    for t in range(turns):
        rid = f"resp_{run}_{turns}_{t}"
        user = KeyedItem(f"{run}:{turns}:{t}:in", _message(f"msg_{run}_{turns}_{t}_in", "user", chars))
        reply = KeyedItem(
            f"{run}:{turns}:{t}:out", _message(f"msg_{run}_{turns}_{t}_out", "assistant", chars)
        )
        response = response_pb2.Response(
            id=rid,
            created_at=int(time.time()),
            status="completed",
            model="bench",
            previous_response_id=previous,
            store=True,
            output=[reply.item],
        )
        inputs = [*context, user.key]
        await store.put_response(
            ResponseRecord(
                tenant=tenant,
                response=response,
                input_keys=inputs,
                output_keys=[reply.key],
                new_items=[user, reply],
                conversation_tokens=len(inputs) * chars // 4,
            )
        )
        context = [*inputs, reply.key]
        previous = rid
        ids.append(rid)
    return ids


async def run(
    url: str, turns: list[int], repeat: int, chars: int, out=None, *, analyze: bool = True
) -> list[dict]:
    out = out or sys.stdout
    store = await open_store(url)
    tenant = f"bench-{secrets.token_hex(4)}"
    run_id = secrets.token_hex(3)
    results = []
    print(f"store: {url}  repeat: {repeat}  chars/item: {chars}", file=out)
    print(f"{'turns':>6} {'items':>6} {'mean_us':>10} {'p50_us':>10} {'p95_us':>10} {'us/item':>8}", file=out)
    try:
        for n in turns:
            ids = await _write_chain(store, tenant, run_id, n, chars)
            if analyze and hasattr(store, "analyze"):
                await store.analyze()  # PostgreSQL: statistics as autovacuum keeps them
            last = ids[-1]
            for _ in range(min(10, repeat)):
                await store.load_context(tenant, last)
            samples = []
            items = 0
            for _ in range(repeat):
                start = time.perf_counter_ns()
                hydrated = await store.load_context(tenant, last)
                samples.append((time.perf_counter_ns() - start) / 1000)
                items = len(hydrated.inputs) + len(hydrated.outputs)
            samples.sort()
            row = {
                "turns": n,
                "items": items,
                "mean_us": statistics.fmean(samples),
                "p50_us": samples[len(samples) // 2],
                "p95_us": samples[min(len(samples) - 1, int(len(samples) * 0.95))],
            }
            results.append(row)
            print(
                f"{n:>6} {items:>6} {row['mean_us']:>10.1f} {row['p50_us']:>10.1f} {row['p95_us']:>10.1f}"
                f" {row['mean_us'] / max(items, 1):>8.2f}",
                file=out,
                flush=True,
            )
            for rid in reversed(ids):
                await store.delete_response(tenant, rid)
    finally:
        await store.close()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        default="memory://",
        help="store URL (memory://, sqlite://..., postgresql://..., redis://...)",
    )
    parser.add_argument("--turns", default="10,50,200", help="comma-separated chain lengths")
    parser.add_argument("--repeat", type=int, default=200, help="timed hydrations per chain length")
    parser.add_argument("--chars", type=int, default=200, help="characters of text per item")
    parser.add_argument(
        "--no-analyze",
        action="store_true",
        help="PostgreSQL: skip ANALYZE after writing each chain (measures a cold, never-analyzed table)",
    )
    args = parser.parse_args(argv)
    turns = [int(t) for t in args.turns.split(",") if t.strip()]
    if not turns or min(turns) < 1 or args.repeat < 1:
        parser.error("--turns needs positive integers and --repeat must be >= 1")
    eventloop.run(run(args.url, turns, args.repeat, args.chars, analyze=not args.no_analyze))


if __name__ == "__main__":
    main()
