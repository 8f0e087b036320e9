"""Session.scan_many (one round trip for a page of many (vnode, prefix) scans)
and Session.round_trips, against a real `rhino worker` process.

The expected pages come from a dict model kept by the test, with each key's
vnode computed by the ``xxhash`` package (helpers.oracle_vnode) and keys
sorted by Python's bytes order (RocksDB's bytewise comparator)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import rhino
from helpers import oracle_vnode
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret

K, V = 1 << 12, 16
HELD = list(range(12))  # vnodes 12..15 are not this instance's


@pytest.fixture
def worker(tmp_path: Path):
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=write_secret(tmp_path, SECRET), metrics=False).start()
    try:
        yield w
    finally:
        w.stop()


def held_groups(n: int) -> list[bytes]:
    out, i = [], 0
    while len(out) < n:
        g = b"g%05d" % i
        if oracle_vnode(g, K, V) in HELD:
            out.append(g)
        i += 1
    return out


def expected_page(model: dict[bytes, bytes], vnode: int, prefix: bytes, max_items: int):
    keys = sorted(k for k in model if k.startswith(prefix) and oracle_vnode(k, K, V) == vnode)
    page = keys[:max_items] if max_items else keys
    return [(k, model[k]) for k in page], len(page) == len(keys)


def test_scan_many_answers_every_item_in_one_round_trip(worker: WorkerProcess) -> None:
    groups = held_groups(40)
    model: dict[bytes, bytes] = {}
    with rhino.connect(worker.unix_socket, secret=SECRET) as c:
        c.open_instance("sm", 0, epoch=1, num_vnodes=V, num_key_groups=K, vnodes=HELD)
        with c.session("sm", 0, batch=0, epoch=1) as s:
            assert s.round_trips == 1  # the open
            for n, g in enumerate(groups):
                keys = [rhino.routed_key(b"l", g, i.to_bytes(4, "big")) for i in range(n % 9)]
                values = [b"v%d-%d" % (n, i) for i in range(len(keys))]
                model.update(zip(keys, values))
            s.put_batch(list(model), list(model.values()))
            assert s.round_trips == 2
            s.commit()
            assert s.round_trips == 3
        with c.session("sm", 0, batch=1, epoch=1) as s:
            # The session's own writes are seen too: one group gains entries, one loses them.
            extra = {rhino.routed_key(b"l", groups[3], b"\xff" + bytes([i])): b"new" for i in range(4)}
            s.put_batch(list(extra), list(extra.values()))
            gone = [k for k in model if rhino.split_routed_key(k)[1] == groups[8]][:3]
            s.delete_batch(gone)
            view = {**{k: v for k, v in model.items() if k not in gone}, **extra}
            before = s.round_trips
            assert before == 3
            items = [(oracle_vnode(g, K, V), b"l" + g) for g in groups]
            items.append((HELD[0], b""))           # a whole vnode
            items.append((HELD[1], b"nothing"))    # an empty page
            for max_items in (3, 1, 0):
                got = s.scan_many(items, max_items)
                assert s.round_trips == before + 1
                before += 1
                assert got == [expected_page(view, v, p, max_items) for v, p in items]
                assert [(list(map(tuple, e)), d) for e, d in got] == got
            assert s.scan_many([], 5) == [] and s.round_trips == before  # nothing sent


def test_a_failed_item_raises_and_the_session_goes_on(worker: WorkerProcess) -> None:
    with rhino.connect(worker.unix_socket, secret=SECRET) as c:
        c.open_instance("sf", 0, epoch=1, num_vnodes=V, num_key_groups=K, vnodes=HELD)
        with c.session("sf", 0, batch=0, epoch=1) as s:
            g = held_groups(1)[0]
            s.put_batch([g], [b"x"])
            with pytest.raises(rhino.UnknownVnodeError):
                s.scan_many([(HELD[0], b""), (15, b""), (oracle_vnode(g, K, V), b"")], 10)
            # Every answer was read: the stream is in step, and the next calls work.
            assert s.scan_many([(oracle_vnode(g, K, V), g)], 10) == [([(g, b"x")], True)]
            assert s.get_batch([g]) == [b"x"]
            with pytest.raises(rhino.InvalidArgumentError):
                s.scan_many([(0, b"")], -1)
            with pytest.raises(rhino.InvalidArgumentError):
                s.scan_many([(-1, b"")], 1)
            s.commit()


def test_round_trips_of_gets_scans_and_batches(worker: WorkerProcess) -> None:
    with rhino.connect(worker.unix_socket, secret=SECRET) as c:
        c.open_instance("rt", 0, epoch=1, num_vnodes=V, num_key_groups=K)
        with c.session("rt", 0, batch=0, epoch=1) as s:
            n = 200_000  # 20 MB of puts: several frames, sent back to back
            keys = np.arange(n, dtype=np.int64)
            s.put_batch(keys, np.zeros((n, 100), dtype=np.uint8))
            assert s.round_trips == 2
            s.get_batch(keys)
            assert s.round_trips == 3
            s.delete_batch(keys[:10])
            assert s.round_trips == 4
            # Values too large for one answer: the worker answers a prefix and the
            # client asks again for the rest, one wave after the other.
            big = np.arange(n, n + 1000, dtype=np.int64)
            width = 10_240
            s.put_batch(big, np.ones((len(big), width), dtype=np.uint8))
            assert s.round_trips == 5
            per_answer = (rhino._core.MAX_FRAME_BYTES - 16) // (1 + 4 + width)
            waves = math.ceil(len(big) / per_answer)
            assert waves >= 2
            assert [len(v) for v in s.get_batch(big)] == [width] * len(big)
            assert s.round_trips == 5 + waves
            # A scan costs one round trip per page.
            before = s.round_trips
            vn = oracle_vnode(int(big[0]), K, V)
            entries = list(s.scan(vnode=vn, page_size=1000))
            pages = max(1, math.ceil(len(entries) / 1000))
            assert pages >= 5 and s.round_trips == before + pages
            s.commit("async")
            assert s.round_trips == before + pages + 1
