"""rhino.spark's state layout (``state/layout.py``): every entry of a grouping key
is in the vnode of the key's bytes, and rows are routed to that vnode.

Oracle: the vnode computed here from XXH3 of the key's bytes (the ``xxhash``
package), as docs/design.md §1 defines it, not by Rhino's partitioner.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
import xxhash

import rhino
from rhino.spark.runtime.routing import routing_keys
from rhino.spark.state import layout
from rhino.spark.state.encoding import encode_key

K, V, SEED = 1 << 15, 64, 7


def oracle_vnode(g: bytes) -> int:
    return (xxhash.xxh3_64_intdigest(g, seed=SEED) >> (64 - 15)) * V // K


@pytest.mark.parametrize("keys", [list(range(-2000, 4000)), [f"user-{i}" for i in range(500)] + ["", "\xf5"]])
def test_every_entry_of_a_key_is_in_the_vnode_rows_are_routed_to(keys):
    part = rhino.Partitioner(num_key_groups=K, num_vnodes=V, seed=SEED)
    gs = routing_keys(pa.table({"k": keys}), ["k"])
    assert gs == [encode_key((k,)) for k in keys]
    # some int keys' bytes end in 0xF5 and look like a trailer: they must still route by their bytes
    assert any(g[-1] == 0xF5 for g in gs) or isinstance(keys[0], str)
    want = [oracle_vnode(g) for g in gs]
    assert list(layout.vnodes_of(part, gs)) == want
    h = layout.Heads("map", 3, ttl=True)
    for g, v in list(zip(gs, want))[::7]:
        for k in (h.key(g), h.key(g, b"tail"), layout.timer_keys(g, 123)[0], layout.timer_keys(g, -5)[1]):
            assert part.vnodes([k])[0] == v, (g, k)
    assert rhino.split_routed_key(h.key(gs[0], b"t")) == (h.head, gs[0], b"t", 1)


def test_timer_keys_sort_by_time_within_a_vnode():
    times = [-10**12, -1, 0, 1, 999, 10**12]
    ks = [layout.timer_keys(b"i" + bytes(8), t)[1] for t in times]
    assert sorted(ks) == ks
    assert [layout.time_ms_of_timer(rhino.split_routed_key(k)[0]) for k in ks] == times
