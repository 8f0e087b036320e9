"""Oracles and small utilities shared by the routing, checkpoint and error tests.

Everything here is computed independently of Rhino: hashing with the ``xxhash``
package, key encoding in pure Python, file facts with ``os.stat``. Tests check
Rhino against these, never against numbers copied from its implementation.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import numpy as np
import xxhash

# ---------------------------------------------------------------- hashing oracle


def key_bytes(key: int | bytes | str) -> bytes:
    """The bytes a key is hashed and stored as: int64 -> 8 little-endian bytes, str -> UTF-8."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return int(key).to_bytes(8, "little", signed=True)
    raise TypeError(f"not a key: {key!r}")


def oracle_hash(key: int | bytes | str, seed: int = 0) -> int:
    """XXH3-64 of all of the key's bytes (Partitioner.hash)."""
    return xxhash.xxh3_64_intdigest(key_bytes(key), seed=seed)


def oracle_routing_part(key: int | bytes | str) -> bytes:
    """What a key is routed by (docs/protocol.md §7.8): of a routed key
    ``head | routing | tail | u16be len(head) | u16be len(routing) | flags | 0xF5``
    the routing part, of any other key the whole key."""
    kb = key_bytes(key)
    if len(kb) < 6 or kb[-1] != 0xF5:
        return kb
    head = int.from_bytes(kb[-6:-4], "big")
    routing = int.from_bytes(kb[-4:-2], "big")
    if head + routing + 6 > len(kb):
        return kb
    return kb[head:head + routing]


def oracle_key_group(key: int | bytes | str, num_key_groups: int, seed: int = 0) -> int:
    bits = num_key_groups.bit_length() - 1
    assert 1 << bits == num_key_groups, "K must be a power of two"
    h = xxhash.xxh3_64_intdigest(oracle_routing_part(key), seed=seed)
    return h >> (64 - bits) if bits else 0


def oracle_vnode(key: int | bytes | str, num_key_groups: int, num_vnodes: int, seed: int = 0) -> int:
    return oracle_key_group(key, num_key_groups, seed) * num_vnodes // num_key_groups


# ---------------------------------------------------------------- dict model of a state


def split_by_vnode(model: Mapping[bytes, bytes], partitioner) -> dict[int, dict[bytes, bytes]]:
    """{vnode: {key: value}} of a model whose keys are raw bytes, routed by the oracle."""
    out: dict[int, dict[bytes, bytes]] = {}
    k, v, s = partitioner.num_key_groups, partitioner.num_vnodes, partitioner.seed
    for key, value in model.items():
        out.setdefault(oracle_vnode(key, k, v, s), {})[key] = value
    return out


def cf_name(vnode: int) -> str:
    return f"vnode-{vnode:05d}"


def expected_column_families(model: Mapping[bytes, bytes], partitioner, vnodes: Iterable[int]):
    """The {column family: {key: value}} a Rhino DB holding `vnodes` must contain (minus 'default')."""
    by_vnode = split_by_vnode(model, partitioner)
    return {cf_name(v): by_vnode.get(v, {}) for v in vnodes}


def held_keys(partitioner, vnodes: Iterable[int], count: int, start: int = 0) -> list[int]:
    """`count` int keys >= start whose oracle vnode is in `vnodes`."""
    held = set(vnodes)
    out, k = [], start
    while len(out) < count:
        if oracle_vnode(k, partitioner.num_key_groups, partitioner.num_vnodes, partitioner.seed) in held:
            out.append(k)
        k += 1
    return out


# ---------------------------------------------------------------- files


def tree_snapshot(root: str | os.PathLike) -> dict[str, tuple[int, int, bytes]]:
    """{relative path: (inode, size, contents)} of every file and directory under `root`
    (directories as (inode, -1, b""))."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            p = os.path.join(dirpath, d)
            out[os.path.relpath(p, root)] = (os.lstat(p).st_ino, -1, b"")
        for f in files:
            p = os.path.join(dirpath, f)
            st = os.lstat(p)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = (st.st_ino, st.st_size, fh.read())
    return out


def sst_files(db_dir: str | os.PathLike) -> dict[tuple[str, int], int]:
    """{(file name, inode): size} of the *.sst files of a RocksDB directory."""
    out = {}
    for name in os.listdir(db_dir):
        if name.endswith(".sst"):
            st = os.stat(os.path.join(db_dir, name))
            out[(name, st.st_ino)] = st.st_size
    return out


def same_inode(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    sa, sb = os.stat(a), os.stat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def flip_byte(path: str | os.PathLike, offset: int) -> None:
    """XORs one byte of a (possibly read-only, 0444) file in place."""
    os.chmod(path, 0o644)
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


def truncate_file(path: str | os.PathLike, drop: int = 1) -> None:
    os.chmod(path, 0o644)
    os.truncate(path, os.path.getsize(path) - drop)


# ---------------------------------------------------------------- LSM shape, read by rocksdict


def live_sst_files(path) -> list[dict]:
    """rocksdict's listing of the live SST files of the RocksDB at `path`, sorted by name.

    Opens it read-only with rocksdict's own RocksDB build, so it works while
    Rhino holds the DB open.
    """
    import rocksdict

    names = rocksdict.Rdict.list_cf(str(path))
    db = rocksdict.Rdict(
        str(path),
        options=rocksdict.Options(raw_mode=True),
        column_families={n: rocksdict.Options(raw_mode=True) for n in names if n != "default"},
        access_type=rocksdict.AccessType.read_only(),
    )
    try:
        return sorted(db.live_files(), key=lambda f: f["name"])
    finally:
        db.close()


# ---------------------------------------------------------------- coordinator stubs


class StubWorkerGateway:
    """A stand-in for the coordinator's ``WorkerGateway`` in unit tests of its managers: the
    live workers from the metadata, made-up addresses, and a client per worker made by
    ``make_client(worker_id)``. ``calls`` collects what the clients record."""

    def __init__(self, meta, make_client) -> None:
        self.meta = meta
        self.make_client = make_client
        self.calls: list = []
        self.failing: set = set()
        self.copy_timeout = 60.0

    def client(self, w):
        return self.make_client(w if isinstance(w, str) else w.id)

    def alive_ids(self) -> set[str]:
        return {w.id for w in self.meta.workers() if w.alive}

    def workers_info(self) -> list:
        from rhino.coordinator.placement import WorkerInfo

        return [WorkerInfo(id=w.id, rack=None, zone=None) for w in self.meta.workers() if w.alive]

    def addresses(self, ids: list[str]) -> list[str]:
        return [f"{i}:1" for i in ids]


# ---------------------------------------------------------------- running a bench


def run_bench(argv: list[str], *, cwd: "str | os.PathLike[str]", timeout: float) -> "subprocess.CompletedProcess[str]":
    """``subprocess.run(argv, capture_output=True, text=True, timeout=timeout)`` for a
    ``rhino-bench`` command, except on a timeout: the bench gets SIGTERM first, on which it
    takes down the cluster it started (its daemons run in their own sessions, so a SIGKILL
    of the bench alone leaves them running, holding their hosts and memory for the rest of
    the suite; test_bench_sigterm.py), then SIGKILL if it has not ended a minute later. The
    timeout fails the test with the end of the bench's stderr."""
    import signal
    import subprocess

    p = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        raise AssertionError(f"{' '.join(argv[2:])}: no result within {timeout:g} s; stopped with SIGTERM. "
                             f"The end of its stderr:\n{(err or '')[-4000:]}") from None
    return subprocess.CompletedProcess(argv, p.returncode, out, err)
