"""Ids (tether/ids.py): 128 random bits each, drawn from a pool of OS randomness that a forked
child does not share and that threads do not draw twice from."""

from __future__ import annotations

import os
import threading

from tether import ids


def test_ids_are_distinct_and_well_formed_across_many_pool_refills() -> None:
    made = [ids.response_id() for _ in range(3 * ids._POOL_BYTES // 16 + 5)]
    assert len(set(made)) == len(made)
    assert all(ids.well_formed(i) and len(i) == len("resp_") + 32 for i in made)


def test_threads_never_get_the_same_bits() -> None:
    made: list[list[str]] = [[] for _ in range(4)]

    def draw(out: list[str]) -> None:
        for _ in range(5000):
            out.append(ids.new_id("x"))

    threads = [threading.Thread(target=draw, args=(out,)) for out in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for out in made for i in out]
    assert len(set(every)) == len(every) == 20000


def test_a_forked_child_draws_other_bits_than_its_parent() -> None:
    ids.new_id("x")  # the parent's pool holds unused bytes now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.write(write, " ".join(ids.new_id("x") for _ in range(8)).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = set(os.read(read, 4096).decode().split())
    os.close(read)
    os.close(write)
    parent = {ids.new_id("x") for _ in range(8)}
    assert len(child) == 8 and not child & parent
