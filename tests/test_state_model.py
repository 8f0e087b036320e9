"""StateBackend + ReplicaStore against a pure Python dict model (hypothesis stateful).

Two instances A and B of one operator (two RocksDB directories, one shared
replica store) split V=8 vnodes between them. Random rules put and delete
single keys and batches (NumPy int64 keys, lists of bytes/str/int, fixed-width
NumPy values, bytes lists, WriteBatch), checkpoint, restore an earlier
checkpoint, reopen, move vnodes between the instances by export / import /
drop, and apply retention + garbage collection. After every step each
instance's full contents (a scan of every vnode it holds), its vnode set, its
state version and the store's committed checkpoints must equal the model.

The oracles are independent of the code under test: the model routes keys with
the `xxhash` package (key group = top log2(K) bits of XXH3-64, vnode =
floor(kg * V / K), docs/design.md §1), and restored checkpoints are also read with
`rocksdict`, a different RocksDB binding.
"""

from __future__ import annotations

import copy
import os
import shutil
import struct
import tempfile

import numpy as np
import pytest
import rocksdict
import xxhash
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import rhino

K = 64
V = 8
SEED = 0
OP = "model-op"
A, B = 0, 1  # instance numbers of the two instances (same operator id)
INSTANCES = (A, B)
PART = rhino.Partitioner(num_key_groups=K, num_vnodes=V, seed=SEED)
KG_SHIFT = 64 - (K.bit_length() - 1)
# Many small examples, each with dozens of fsyncs (RocksDB flushes, manifest commits, restores):
# on tmpfs an fsync costs nothing, so the examples stay fast. SIGKILL-safety, which does not
# depend on fsync, is tested on the regular temporary directory in test_crash_safety.py.
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


# ----------------------------------------------------------------- independent oracles


def enc(key) -> bytes:
    """The bytes a key is stored as: int -> 8 LE bytes, str -> UTF-8, bytes as is."""
    if isinstance(key, (bool, np.bool_)):
        raise TypeError(key)
    if isinstance(key, (int, np.integer)):
        return struct.pack("<q", int(key))
    if isinstance(key, str):
        return key.encode("utf-8")
    return bytes(key)


def vnode_of(key_bytes: bytes) -> int:
    kg = xxhash.xxh3_64_intdigest(key_bytes, seed=SEED) >> KG_SHIFT
    return kg * V // K


def rocksdict_contents(path: str) -> tuple[dict[int, dict[bytes, bytes]], dict[bytes, bytes]]:
    """Reads a RocksDB directory with rocksdict (read-only, raw mode).

    Returns ({vnode: {key: value}}, {metadata key: value of the default CF})."""
    opts = rocksdict.Options(raw_mode=True)
    names = rocksdict.Rdict.list_cf(path, opts)
    cfs = {n: rocksdict.Options(raw_mode=True) for n in names if n != "default"}
    db = rocksdict.Rdict(path, options=opts, column_families=cfs,
                         access_type=rocksdict.AccessType.read_only())
    try:
        meta = {bytes(k): bytes(v) for k, v in db.items()}
        vnodes: dict[int, dict[bytes, bytes]] = {}
        for n in names:
            if n == "default":
                continue
            assert n.startswith("vnode-") and len(n) == len("vnode-00000"), n
            cf = db.get_column_family(n)
            vnodes[int(n[len("vnode-"):])] = {bytes(k): bytes(v) for k, v in cf.items()}
            del cf
    finally:
        db.close()
    return vnodes, meta


def le_u64(data: bytes | None) -> int | None:
    if data is None:
        return None
    assert len(data) == 8
    return struct.unpack("<Q", data)[0]


# ----------------------------------------------------------------- strategies

int_keys = st.one_of(st.integers(min_value=-30, max_value=90),
                     st.sampled_from([-(2**63), 2**63 - 1, 2**32, -(2**31)]))
bytes_keys = st.binary(max_size=3)
str_keys = st.text(alphabet="abé€😀", max_size=3)
any_keys = st.one_of(int_keys, bytes_keys, str_keys)
values = st.binary(max_size=12)
versions = st.one_of(st.none(), st.integers(min_value=0, max_value=2**64 - 1))
instances = st.sampled_from(INSTANCES)


def fixed_values(rows: list[bytes], width: int, form: str):
    """Rows of equal width as a NumPy array of the given form (each row one value)."""
    n = len(rows)
    buf = b"".join(rows)
    if form == "uint8":
        return np.frombuffer(buf, dtype=np.uint8).reshape(n, width).copy()
    if form == "uint8-fortran":  # not C-contiguous: the binding must take rows, not memory order
        return np.asfortranarray(np.frombuffer(buf, dtype=np.uint8).reshape(n, width))
    if form == "int32":
        assert width % 4 == 0
        return np.frombuffer(buf, dtype="<i4").reshape(n, width // 4).copy()
    if form == "S":
        assert width >= 1
        return np.frombuffer(buf, dtype=f"S{width}").copy() if n else np.zeros(0, dtype=f"S{width}")
    raise AssertionError(form)


# ----------------------------------------------------------------- the machine


class RhinoStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="rhino-model-", dir=SCRATCH)
        self.counter = 0
        self.store = rhino.ReplicaStore(os.path.join(self.root, "store"))
        self.dbs: dict[int, rhino.StateBackend] = {}
        self.paths: dict[int, str] = {}
        self.model: dict[int, dict[int, dict[bytes, bytes]]] = {}
        self.version: dict[int, int | None] = {A: None, B: None}
        self.last_ckpt: dict[int, int | None] = {A: None, B: None}
        # instance -> checkpoint id -> (model copy, version, epoch)
        self.snaps: dict[int, dict[int, tuple]] = {A: {}, B: {}}
        self.next_id = 1
        self.epoch = 0
        for inst, vns in ((A, range(0, V // 2)), (B, range(V // 2, V))):
            self.paths[inst] = self.fresh(f"live{inst}")
            self.dbs[inst] = rhino.StateBackend.open(self.paths[inst], partitioner=PART, operator_id=OP,
                                                     instance=inst, vnodes=list(vns),
                                                     write_buffer_budget=8 << 20)
            self.model[inst] = {v: {} for v in vns}

    def teardown(self) -> None:
        for db in self.dbs.values():
            db.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- helpers

    def fresh(self, kind: str) -> str:
        self.counter += 1
        return os.path.join(self.root, f"{kind}-{self.counter}")

    def holders(self, vnode: int) -> list[int]:
        return [i for i in INSTANCES if vnode in self.model[i]]

    def owned(self, inst: int, keys: list) -> list:
        return [k for k in keys if vnode_of(enc(k)) in self.model[inst]]

    def foreign_int_key(self, inst: int, start: int) -> int:
        """An int key whose vnode `inst` does not hold (requires such a vnode)."""
        k = start % 1000
        while vnode_of(enc(k)) in self.model[inst]:
            k += 1
        return k

    def apply_put(self, inst: int, kb: bytes, value: bytes) -> None:
        self.model[inst][vnode_of(kb)][kb] = value

    def apply_delete(self, inst: int, kb: bytes) -> None:
        self.model[inst][vnode_of(kb)].pop(kb, None)

    def set_version(self, inst: int, version: int | None) -> None:
        if version is not None:
            self.version[inst] = version

    def committed(self, inst: int) -> list[int]:
        return sorted(self.snaps[inst])

    # -- single keys

    @rule(key=any_keys, value=values, data=st.data())
    def put(self, key, value, data):
        kb = enc(key)
        hs = self.holders(vnode_of(kb))
        for inst in INSTANCES:
            if inst not in hs:
                with pytest.raises(rhino.UnknownVnodeError):
                    self.dbs[inst].put(key, value)
        if hs:
            inst = data.draw(st.sampled_from(hs), label="owner")
            self.dbs[inst].put(key, value)
            self.apply_put(inst, kb, value)

    @rule(key=any_keys, data=st.data())
    def delete(self, key, data):
        kb = enc(key)
        hs = self.holders(vnode_of(kb))
        for inst in INSTANCES:
            if inst not in hs:
                with pytest.raises(rhino.UnknownVnodeError):
                    self.dbs[inst].delete(key)
        if hs:
            inst = data.draw(st.sampled_from(hs), label="owner")
            self.dbs[inst].delete(key)
            self.apply_delete(inst, kb)

    @rule(key=any_keys)
    def get(self, key):
        kb = enc(key)
        v = vnode_of(kb)
        for inst in INSTANCES:
            if v in self.model[inst]:
                assert self.dbs[inst].get(key) == self.model[inst][v].get(kb)
            else:
                with pytest.raises(rhino.UnknownVnodeError):
                    self.dbs[inst].get(key)

    # -- batches

    @rule(inst=instances, data=st.data(), version=versions,
          key_form=st.sampled_from(["int64", "list", "tuple", "object-array"]),
          value_form=st.sampled_from(["bytes", "object-array", "uint8", "uint8-fortran", "int32", "S"]))
    def put_batch(self, inst, data, version, key_form, value_form):
        if key_form == "int64":
            keys = self.owned(inst, data.draw(st.lists(int_keys, max_size=12), label="keys"))
            keys_arg = np.array(keys, dtype=np.int64)
        else:
            keys = self.owned(inst, data.draw(st.lists(any_keys, max_size=12), label="keys"))
            keys_arg = {"list": list, "tuple": tuple,
                        "object-array": lambda k: np.array(k + [None], dtype=object)[:-1]}[key_form](keys)
        n = len(keys)
        if value_form in ("bytes", "object-array"):
            rows = data.draw(st.lists(values, min_size=n, max_size=n), label="values")
            vals_arg = rows if value_form == "bytes" else np.array(rows + [None], dtype=object)[:-1]
        else:
            width = data.draw(st.sampled_from([4, 8] if value_form == "int32" else
                                              [4, 1, 3, 7] if value_form == "S" else [4, 0, 1, 5]),
                              label="width")
            rows = data.draw(st.lists(st.binary(min_size=width, max_size=width), min_size=n, max_size=n),
                             label="rows")
            vals_arg = fixed_values(rows, width, value_form)
        self.dbs[inst].put_batch(keys_arg, vals_arg, version=version)
        for k, r in zip(keys, rows):  # in order: a later duplicate wins
            self.apply_put(inst, enc(k), r)
        self.set_version(inst, version)

    @rule(inst=instances, data=st.data(), version=versions, int64=st.booleans())
    def delete_batch(self, inst, data, version, int64):
        keys = self.owned(inst, data.draw(st.lists(int_keys if int64 else any_keys, max_size=10), label="keys"))
        self.dbs[inst].delete_batch(np.array(keys, dtype=np.int64) if int64 else keys, version=version)
        for k in keys:
            self.apply_delete(inst, enc(k))
        self.set_version(inst, version)

    @rule(inst=instances, data=st.data(), version=versions)
    def write_batch(self, inst, data, version):
        """A WriteBatch of several puts and deletes, applied atomically with the version."""
        db = self.dbs[inst]
        batch = db.batch()
        pending: list[tuple[str, bytes, bytes | None]] = []
        for _ in range(data.draw(st.integers(0, 4), label="ops")):
            keys = self.owned(inst, data.draw(st.lists(any_keys, max_size=5), label="keys"))
            if data.draw(st.booleans(), label="is_put"):
                vals = data.draw(st.lists(values, min_size=len(keys), max_size=len(keys)), label="values")
                batch.put(keys, vals)
                pending += [("put", enc(k), v) for k, v in zip(keys, vals)]
            else:
                batch.delete(keys)
                pending += [("delete", enc(k), None) for k in keys]
            assert len(batch) == len(pending)
        if len(self.model[inst]) < V:
            # A key of a vnode the instance does not hold adds nothing to the batch.
            foreign = self.foreign_int_key(inst, data.draw(int_keys, label="foreign"))
            keys = self.owned(inst, [1, 2, 3]) + [foreign]
            with pytest.raises(rhino.UnknownVnodeError):
                batch.put(keys, [b"x"] * len(keys))
            assert len(batch) == len(pending)
        db.write(batch, version=version)
        assert len(batch) == 0
        for op, kb, v in pending:
            if op == "put":
                self.apply_put(inst, kb, v)
            else:
                self.apply_delete(inst, kb)
        self.set_version(inst, version)

    @precondition(lambda self: any(len(self.model[i]) < V for i in INSTANCES))
    @rule(data=st.data(), version=st.integers(min_value=0, max_value=2**64 - 1),
          op=st.sampled_from(["put_batch", "put_batch_int64", "delete_batch", "get_batch", "get_batch_array",
                              "write", "get", "put", "delete"]))
    def foreign_key_is_rejected(self, data, version, op):
        """A key whose vnode the instance does not hold raises UnknownVnodeError and nothing
        of its batch (nor the version) is written; the invariants check that nothing changed."""
        inst = data.draw(st.sampled_from([i for i in INSTANCES if len(self.model[i]) < V]), label="inst")
        db = self.dbs[inst]
        foreign = self.foreign_int_key(inst, data.draw(int_keys, label="start"))
        keys = self.owned(inst, data.draw(st.lists(int_keys, max_size=8), label="keys"))
        keys.insert(data.draw(st.integers(0, len(keys)), label="pos"), foreign)
        vals = [b"v%d" % i for i in range(len(keys))]
        arr = np.array(keys, dtype=np.int64)
        with pytest.raises(rhino.UnknownVnodeError):
            if op == "put_batch":
                db.put_batch(keys, vals, version=version)
            elif op == "put_batch_int64":
                db.put_batch(arr, np.zeros((len(keys), 4), dtype=np.uint8), version=version)
            elif op == "delete_batch":
                db.delete_batch(arr, version=version)
            elif op == "get_batch":
                db.get_batch(arr)
            elif op == "get_batch_array":
                db.get_batch_array(arr, 4)
            elif op == "write":
                b = db.batch()
                b.put(keys, vals)
            elif op == "get":
                db.get(foreign)
            elif op == "put":
                db.put(foreign, b"x")
            else:
                db.delete(foreign)

    @rule(inst=instances, data=st.data())
    def get_batch(self, inst, data):
        db = self.dbs[inst]
        keys = self.owned(inst, data.draw(st.lists(any_keys, max_size=10), label="keys"))
        assert db.get_batch(keys) == [self.model[inst][vnode_of(enc(k))].get(enc(k)) for k in keys]
        ints = self.owned(inst, data.draw(st.lists(int_keys, max_size=10), label="ints"))
        arr = np.array(ints, dtype=np.int64)
        expected = [self.model[inst][vnode_of(enc(k))].get(enc(k)) for k in ints]
        assert db.get_batch(arr) == expected
        width = data.draw(st.sampled_from([4, 0, 1, 5]), label="width")
        if all(v is None or len(v) == width for v in expected):
            out, mask = db.get_batch_array(arr, width)
            assert out.shape == (len(ints), width) and out.dtype == np.uint8
            assert mask.tolist() == [v is not None for v in expected]
            for row, v in zip(out, expected):
                assert row.tobytes() == (v if v is not None else bytes(width))
        else:
            with pytest.raises(rhino.InvalidArgumentError):
                db.get_batch_array(arr, width)

    # -- checkpoints, restore, reopen

    @rule(which=st.sampled_from([(A,), (B,), (A, B)]), independent=st.booleans())
    def checkpoint(self, which, independent):
        cid = self.next_id
        self.next_id += 1
        for inst in which:
            db = self.dbs[inst]
            # The documented parent: the last checkpoint this state took or was
            # restored from if it is still committed, else the newest committed
            # one before this id (say, after retention removed the last one).
            if self.last_ckpt[inst] in self.snaps[inst]:
                parent = self.last_ckpt[inst]
            else:
                parent = max((c for c in self.snaps[inst] if c < cid), default=None)
            m = db.checkpoint(self.store, cid, epoch=self.epoch)
            assert (m.operator_id, m.instance, m.checkpoint_id, m.epoch) == (OP, inst, cid, self.epoch)
            assert m.parent_id == parent
            assert m.version == (self.version[inst] or 0)
            assert sorted(m.vnodes) == sorted(self.model[inst])
            assert (m.num_key_groups, m.num_vnodes, m.seed) == (K, V, SEED)
            assert db.last_checkpoint == cid
            if parent is None:
                assert all(f.in_delta for f in m.files)
            self.snaps[inst][cid] = (copy.deepcopy(self.model[inst]), self.version[inst], self.epoch)
            self.last_ckpt[inst] = cid
            if independent:
                self.check_with_rocksdict(inst, cid)

    @precondition(lambda self: any(self.last_ckpt[i] is not None for i in INSTANCES))
    @rule(data=st.data())
    def checkpoint_id_must_increase(self, data):
        inst = data.draw(st.sampled_from([i for i in INSTANCES if self.last_ckpt[i] is not None]), label="inst")
        stale = data.draw(st.integers(0, self.last_ckpt[inst]), label="stale")
        with pytest.raises(rhino.InvalidArgumentError):
            self.dbs[inst].checkpoint(self.store, stale)
        assert self.dbs[inst].last_checkpoint == self.last_ckpt[inst]

    @precondition(lambda self: any(self.snaps[i] for i in INSTANCES))
    @rule(data=st.data(), mode=st.sampled_from(["link", "link", "copy"]), verify=st.sampled_from(["size", "full"]),
          drop_old=st.booleans())
    def restore(self, data, mode, verify, drop_old):
        inst = data.draw(st.sampled_from([i for i in INSTANCES if self.snaps[i]]), label="inst")
        cid = data.draw(st.sampled_from(self.committed(inst)), label="checkpoint")
        manifest = self.store.manifest(OP, inst, cid)
        old = self.paths[inst]
        self.dbs[inst].close()
        if drop_old:  # the restored state must not depend on the old live directory
            shutil.rmtree(old)
        target = self.fresh(f"restored{inst}")
        db = self.store.restore(OP, inst, cid, target, mode=mode, verify=verify)
        self.dbs[inst], self.paths[inst] = db, target
        stats = db.restore_stats
        assert stats.files == len(manifest.files)
        assert stats.total_bytes == manifest.total_bytes
        if mode == "copy":
            assert stats.linked_files == 0
        else:
            assert stats.linked_files == sum(f.name.endswith(".sst") for f in manifest.files)
        model, version, _epoch = self.snaps[inst][cid]
        self.model[inst] = copy.deepcopy(model)
        self.version[inst] = version
        self.last_ckpt[inst] = cid
        assert (db.operator_id, db.instance, db.last_checkpoint) == (OP, inst, cid)
        event("restore: %s, %s checkpoint" % (mode, "latest" if cid == max(self.snaps[inst]) else "earlier"))

    @rule(inst=instances, check_partitioner=st.booleans())
    def reopen(self, inst, check_partitioner):
        self.dbs[inst].close()
        with pytest.raises(rhino.InvalidArgumentError):
            self.dbs[inst].get(0)  # a closed handle refuses
        self.dbs[inst] = rhino.StateBackend.open(self.paths[inst], partitioner=PART if check_partitioner else None,
                                                 create=False)
        assert (self.dbs[inst].operator_id, self.dbs[inst].instance) == (OP, inst)

    @precondition(lambda self: any(self.snaps[i] for i in INSTANCES))
    @rule(data=st.data())
    def rocksdict_reads_checkpoint(self, data):
        inst = data.draw(st.sampled_from([i for i in INSTANCES if self.snaps[i]]), label="inst")
        cid = data.draw(st.sampled_from(self.committed(inst)), label="checkpoint")
        self.check_with_rocksdict(inst, cid)

    def check_with_rocksdict(self, inst: int, cid: int) -> None:
        """Builds the directory of checkpoint `cid` and reads it with rocksdict."""
        target = self.fresh("rocksdict")
        self.store.restore_files(OP, inst, cid, target)
        vnodes, meta = rocksdict_contents(target)
        model, version, _epoch = self.snaps[inst][cid]
        assert vnodes == model
        assert le_u64(meta.get(b"rhino:version")) == version
        assert le_u64(meta.get(b"rhino:checkpoint")) == cid
        shutil.rmtree(target)

    @precondition(lambda self: any(self.snaps[i] for i in INSTANCES))
    @rule(inst=instances, keep_last=st.integers(1, 3))
    def retain_and_gc(self, inst, keep_last):
        ids = self.committed(inst)
        expected_removed = ids[:-keep_last] if len(ids) > keep_last else []
        assert self.store.retain(OP, inst, keep_last) == expected_removed
        for cid in expected_removed:
            del self.snaps[inst][cid]
        event("retain removed %s" % ("some" if expected_removed else "none"))
        self.store.gc()
        # Nothing a retained checkpoint references may be gone.
        assert self.store.verify(full=True).ok
        referenced = {f.identity for i in INSTANCES for c in self.committed(i)
                      for f in self.store.manifest(OP, i, c).files}
        assert set(os.listdir(os.path.join(self.store.path, "pool"))) == referenced

    # -- handover primitive: export -> import -> drop

    @precondition(lambda self: any(self.model[i] for i in INSTANCES))
    @rule(data=st.data())
    def move_vnodes(self, data):
        src = data.draw(st.sampled_from([i for i in INSTANCES if self.model[i]]), label="from")
        dst = B if src == A else A
        held = sorted(self.model[src])
        moved = data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=min(3, len(held)), unique=True),
                          label="vnodes")
        export = self.fresh("export")
        self.dbs[src].export_vnodes(moved, export)
        assert os.path.isdir(export)
        if any(v in self.model[dst] for v in moved):
            # dst already holds one of them (possible after a restore of only one instance).
            with pytest.raises(rhino.AlreadyExistsError):
                self.dbs[dst].import_vnodes(export)
            shutil.rmtree(export)
            event("move refused: target holds the vnode")
            return
        assert sorted(self.dbs[dst].import_vnodes(export)) == sorted(moved)
        assert not os.path.exists(export)  # the export is consumed
        self.dbs[src].drop_vnodes(moved)
        for v in moved:
            self.model[dst][v] = self.model[src].pop(v)
        self.epoch += 1
        event("move: imported %s vnode(s)%s" % (len(moved), ", one empty" if any(not self.model[dst][v] for v in moved) else ""))

    # -- invariants

    @invariant()
    def contents_equal_model(self):
        for inst in INSTANCES:
            db = self.dbs[inst]
            assert db.vnodes == sorted(self.model[inst])
            for v in range(V):
                if v in self.model[inst]:
                    items = db.scan(v)
                    keys = [k for k, _ in items]
                    assert keys == sorted(set(keys))  # key order, no duplicates
                    assert dict(items) == self.model[inst][v]
                    assert db.count(v) == len(items)
                else:
                    with pytest.raises(rhino.UnknownVnodeError):
                        db.scan(v)
            assert db.version == self.version[inst]

    @invariant()
    def store_is_consistent(self):
        for inst in INSTANCES:
            assert self.store.checkpoints(OP, inst) == self.committed(inst)
        report = self.store.verify(full=False)
        assert report.ok, report.problems
        assert report.checkpoints == sum(len(self.snaps[i]) for i in INSTANCES)


RhinoStateMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
TestStateModel = RhinoStateMachine.TestCase


def test_restored_state_read_by_rocksdict(tmp_path):
    """A fixed scenario, so the independent reader runs in every test session: write through
    every key form to both instances, move a vnode, checkpoint, restore by hard links, and read
    the restored directories with rocksdict."""
    store = rhino.ReplicaStore(str(tmp_path / "store"))
    dbs = {A: rhino.StateBackend.open(str(tmp_path / "a"), partitioner=PART, operator_id=OP, instance=A,
                                      vnodes=list(range(0, 4))),
           B: rhino.StateBackend.open(str(tmp_path / "b"), partitioner=PART, operator_id=OP, instance=B,
                                      vnodes=list(range(4, 8)))}
    model: dict[int, dict[int, dict[bytes, bytes]]] = {A: {v: {} for v in range(4)}, B: {v: {} for v in range(4, 8)}}
    keys = list(range(-500, 500)) + [b"k%d" % i for i in range(200)] + ["s\u00e9%d" % i for i in range(200)]
    for inst in INSTANCES:
        mine = [k for k in keys if vnode_of(enc(k)) in model[inst]]
        ints = np.array([k for k in mine if isinstance(k, int)], dtype=np.int64)
        rest = [k for k in mine if not isinstance(k, int)]
        fixed = np.arange(len(ints) * 2, dtype="<i4").reshape(len(ints), 2) + 1000 * inst
        dbs[inst].put_batch(ints, fixed, version=10 + inst)
        dbs[inst].put_batch(rest, [enc(k) * 2 for k in rest])
        for k, row in zip(ints.tolist(), fixed):
            model[inst][vnode_of(enc(k))][enc(k)] = row.tobytes()
        for k in rest:
            model[inst][vnode_of(enc(k))][enc(k)] = enc(k) * 2
    # move vnode 3 from A to B
    dbs[A].export_vnodes([3], str(tmp_path / "export"))
    assert dbs[B].import_vnodes(str(tmp_path / "export")) == [3]
    dbs[A].drop_vnodes([3])
    model[B][3] = model[A].pop(3)
    for inst in INSTANCES:
        dbs[inst].checkpoint(store, 1, epoch=1)
        dbs[inst].close()
        target = tmp_path / f"restored{inst}"
        restored = store.restore(OP, inst, 1, str(target))
        assert restored.vnodes == sorted(model[inst])
        restored.close()
        vnodes, meta = rocksdict_contents(str(target))
        assert vnodes == model[inst]
        assert sum(len(d) for d in vnodes.values()) > 100
        assert le_u64(meta[b"rhino:version"]) == 10 + inst
        assert le_u64(meta[b"rhino:checkpoint"]) == 1
        # Real hard links: every restored SST shares its inode with its pooled file.
        for f in store.manifest(OP, inst, 1).files:
            if f.name.endswith(".sst"):
                assert os.stat(target / f.name).st_ino == os.stat(store.pool_path(f.identity)).st_ino
