"""Routed keys (docs/protocol.md §7.8): ``head | routing | tail | trailer`` lives
in the vnode of its routing part.

Oracles, independent of Rhino's code: the trailer is built and parsed here in
pure Python (``oracle_routed_key``, helpers.oracle_routing_part), and the vnode
of a routing part is computed with the ``xxhash`` package's XXH3-64 as well as
with the plain-key hashing that existed before routed keys.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import rhino
from helpers import oracle_routing_part, oracle_vnode
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret

K, V, SEED = 1 << 15, 64, 7


def oracle_routed_key(head: bytes, routing: bytes, tail: bytes = b"", flags: int = 0) -> bytes:
    return head + routing + tail + len(head).to_bytes(2, "big") + len(routing).to_bytes(2, "big") + bytes([flags, 0xF5])


def xxh_vnode(routing: bytes, k: int = K, v: int = V, seed: int = SEED) -> int:
    """The vnode of a routing part, straight from XXH3-64 (kg = top log2 K bits, vnode = kg * V // K)."""
    bits = k.bit_length() - 1
    return (xxhash.xxh3_64_intdigest(routing, seed=seed) >> (64 - bits)) * v // k


@pytest.fixture
def part() -> rhino.Partitioner:
    return rhino.Partitioner(num_key_groups=K, num_vnodes=V, seed=SEED)


def test_a_routed_key_lives_in_the_vnode_of_its_routing_part(part: rhino.Partitioner) -> None:
    rng = random.Random(1)
    heads, routings, tails = [], [], []
    for _ in range(3000):
        heads.append(rng.randbytes(rng.randrange(0, 12)))
        routings.append(rng.randbytes(rng.randrange(0, 40)))
        tails.append(rng.randbytes(rng.randrange(0, 20)))
    keys = [rhino.routed_key(h, r, t, ttl=i % 2 == 1) for i, (h, r, t) in enumerate(zip(heads, routings, tails))]
    assert keys == [oracle_routed_key(h, r, t, i % 2) for i, (h, r, t) in enumerate(zip(heads, routings, tails))]
    want = [xxh_vnode(r) for r in routings]
    assert [part.vnode(r) for r in routings] == want  # the plain keys equal to the routing parts
    assert [part.vnode(k) for k in keys] == want
    assert part.vnodes(keys).tolist() == want
    objects = np.empty(len(keys), dtype=object)
    objects[:] = keys
    assert part.vnodes(objects).tolist() == want
    assert part.key_groups(keys).tolist() == [part.key_group(r) for r in routings]
    # Partitioner.hash stays the hash of every byte of the key.
    assert part.hash(keys[0]) == xxhash.xxh3_64_intdigest(keys[0], seed=SEED)
    # The vectorized form agrees with the scalar form and with the batch builder.
    assert rhino.routed_keys(heads, routings, tails) == [rhino.routed_key(h, r, t) for h, r, t in
                                                        zip(heads, routings, tails)]


@settings(max_examples=300, deadline=None)
@given(head=st.binary(max_size=40), routing=st.binary(max_size=40), tail=st.binary(max_size=40),
       ttl=st.booleans())
def test_split_inverts_routed_key(head: bytes, routing: bytes, tail: bytes, ttl: bool) -> None:
    key = rhino.routed_key(head, routing, tail, ttl=ttl)
    assert rhino.split_routed_key(key) == (head, routing, tail, 1 if ttl else 0)
    assert oracle_routing_part(key) == routing


@settings(max_examples=300, deadline=None)
@given(key=st.binary(max_size=24))
def test_any_key_routes_as_the_oracle_says(key: bytes) -> None:
    p = rhino.Partitioner(num_key_groups=K, num_vnodes=V, seed=SEED)
    assert p.vnode(key) == xxh_vnode(oracle_routing_part(key)) == oracle_vnode(key, K, V, SEED)
    routed = len(key) >= 6 and key[-1] == 0xF5 and \
        int.from_bytes(key[-6:-4], "big") + int.from_bytes(key[-4:-2], "big") + 6 <= len(key)
    assert (rhino.split_routed_key(key) is not None) == routed


def test_a_key_ending_in_0xf5_with_bad_lengths_is_plain(part: rhino.Partitioner) -> None:
    for key in [b"\xf5", b"abcd\xf5",                       # too short for a trailer
                b"xy" + b"\x00\x02\x00\x01\x00\xf5",          # 2 + 1 + 6 > 8 bytes
                b"\xff\xff\xff\xff\x00\xf5",                  # lengths far past the key
                b"abc" + b"\x00\x03\x00\x01\x01\xf5"]:        # 3 + 1 + 6 > 9
        assert rhino.split_routed_key(key) is None
        assert part.vnode(key) == xxh_vnode(key)
        assert part.vnodes([key]).tolist() == [xxh_vnode(key)]
    # The smallest routed key: empty head, routing and tail.
    assert rhino.split_routed_key(b"\x00\x00\x00\x00\x00\xf5") == (b"", b"", b"", 0)
    assert part.vnode(b"\x00\x00\x00\x00\x00\xf5") == xxh_vnode(b"")


def test_int64_keys_that_are_routed_keys_route_like_their_bytes(part: rhino.Partitioner) -> None:
    """An int64 key is its 8 little-endian bytes; those can form a routed key (top byte 0xF5,
    lengths fitting), and then route by their routing part in every form."""
    raw = b"ab" + b"\x00\x01\x00\x01\x00\xf5"  # head b"a", routing b"b"
    k = int.from_bytes(raw, "little", signed=True)
    assert rhino.split_routed_key(raw) == (b"a", b"b", b"", 0)
    want = xxh_vnode(b"b")
    assert part.vnode(k) == part.vnode(raw) == want
    assert part.vnodes(np.array([k, 5], dtype=np.int64)).tolist() == [want, part.vnode(5)]
    assert part.key_groups(np.array([k], dtype=np.int64)).tolist() == [part.key_group(b"b")]


def test_limits_raise_invalid_argument() -> None:
    big = b"x" * 65536
    ok = b"y" * 65535
    assert rhino.split_routed_key(rhino.routed_key(ok, ok)) == (ok, ok, b"", 0)
    with pytest.raises(rhino.InvalidArgumentError, match="head"):
        rhino.routed_key(big, b"r")
    with pytest.raises(rhino.InvalidArgumentError, match="routing"):
        rhino.routed_key(b"h", big)
    rhino.routed_key(b"h", b"r", big)  # a tail has no length field: no limit
    with pytest.raises(rhino.InvalidArgumentError, match="key 1: .*routing"):
        rhino.routed_keys(b"h", [b"r", big])
    with pytest.raises(rhino.InvalidArgumentError, match="heads has 1 items for 2"):
        rhino.routed_keys([b"h"], [b"r", b"s"])
    with pytest.raises(rhino.InvalidArgumentError, match="tails has 3 items for 2"):
        rhino.routed_keys(b"h", [b"r", b"s"], [b"", b"", b""])
    with pytest.raises(rhino.InvalidArgumentError, match="routings must be a collection"):
        rhino.routed_keys(b"h", b"r")


def test_routed_keys_forms(part: rhino.Partitioner) -> None:
    """heads/tails as one bytes for every key; routings as an int64 array (each its 8 LE bytes)."""
    ids = np.arange(-5, 5, dtype=np.int64)
    keys = rhino.routed_keys(b"v\x00\x01", ids, b"", ttl=True)
    for i, key in zip(ids.tolist(), keys):
        r = i.to_bytes(8, "little", signed=True)
        assert key == oracle_routed_key(b"v\x00\x01", r, b"", 1)
        assert part.vnode(key) == part.vnode(i)


def test_the_embedded_state_backend_routes_by_the_routing_part(tmp_path: Path, part: rhino.Partitioner) -> None:
    groups = [b"g%d" % i for i in range(200)]
    keys = rhino.routed_keys(b"m\x00\x07", groups, [b"t1"] * len(groups))
    with rhino.StateBackend.open(str(tmp_path / "db"), partitioner=part) as db:
        db.put_batch(keys, [b"v"] * len(keys))
        db.put(rhino.routed_key(b"x", groups[0]), b"single")
        for g, key in zip(groups, keys):
            vn = xxh_vnode(g)
            assert key in dict(db.scan(vn))
        assert db.get(rhino.routed_key(b"x", groups[0])) == b"single"
        assert rhino.routed_key(b"x", groups[0]) in dict(db.scan(xxh_vnode(groups[0])))


def test_a_session_finds_routed_keys_in_the_routing_parts_vnode(tmp_path: Path) -> None:
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=write_secret(tmp_path, SECRET), metrics=False).start()
    try:
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            c.open_instance("rk", 0, epoch=1, num_vnodes=V, num_key_groups=K, seed=SEED)
            head = b"l\x00\x02"
            groups = [b"user-%03d" % i for i in range(50)]
            entries = {g: [rhino.routed_key(head, g, n.to_bytes(8, "big")) for n in range(3)] for g in groups}
            with c.session("rk", 0, batch=0, epoch=1) as s:
                flat = [k for ks in entries.values() for k in ks]
                s.put_batch(flat, [k[-10:] for k in flat])
                # Also plain keys equal to the routing parts: same vnode.
                s.put_batch(groups, [b"plain"] * len(groups))
                s.commit()
            with c.session("rk", 0, batch=1, epoch=1) as s:
                for g in groups:
                    v = xxh_vnode(g)
                    got = list(s.scan(vnode=v, prefix=head + g))
                    assert [k for k, _ in got] == entries[g]
                    assert all(val == k[-10:] for k, val in got)
                    assert b"plain" in [val for k, val in s.scan(vnode=v) if k == g]
                    assert s.get_batch(entries[g]) == [k[-10:] for k in entries[g]]
    finally:
        w.stop()
