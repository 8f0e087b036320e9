"""rhino.spark's per-entry state (``state/store.py``, ``writeback.py``, ``handle.py``)
against a dict model, on a real ``rhino worker`` session, with no Spark job.

A prefetch of 4 entries per collection (instead of 64) sends most lists, maps
and timer sets down the on-demand paths: ``getValue`` reading one entry,
iteration streaming by prefix scan, ``clear`` and ``put`` deleting what is
stored. Random operations per key and batch; after every operation the
handle's reads must equal the model, within the batch and in the next one.
Also: TTL visibility in batch time, a value too large for an entry.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

import rhino  # noqa: E402
from rhino.spark.state.encoding import encode_key  # noqa: E402
from rhino.spark.state.handle import RhinoProcessorHandle  # noqa: E402
from rhino.spark.state.schema import StateValueError  # noqa: E402
from rhino.spark.state.store import BatchState  # noqa: E402
from rhino.spark.state.variables import DeclaringHandle, resolve_schema_doc, variables_of  # noqa: E402
from rhino.spark.state.writeback import write_back  # noqa: E402
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret  # noqa: E402

V = 8
TTL = 1500


def declare(h):
    h.getValueState("v", "n long")
    h.getListState("l", "x long, s string")
    h.getMapState("m", "k long", "y string")
    h.getValueState("tv", "n long", TTL)
    h.getMapState("tm", "k long", "y long", TTL)
    h.getValueState("blob", "b binary")


@pytest.fixture
def session_factory(tmp_path: Path):
    sf = write_secret(tmp_path, SECRET)
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=sf, metrics=False).start()
    c = rhino.connect(w.unix_socket, secret=SECRET)
    c.open_instance("st", 0, epoch=1, num_vnodes=V)
    d = DeclaringHandle()
    declare(d)
    variables = variables_of(resolve_schema_doc(None, d.declared)[0])
    part = rhino.Partitioner(num_key_groups=1 << 15, num_vnodes=V, seed=0)

    def open_batch(b, now):
        s = c.session("st", 0, batch=b, epoch=1)
        st = BatchState(s, part, variables, batch=b, now_ms=now, timers=True, small=4)
        h = RhinoProcessorHandle("eventtime", variables)
        h._bind(st)
        return s, st, h

    yield open_batch
    c.close()
    w.stop()


class Model:
    def __init__(self):
        self.v, self.l, self.m, self.timers = {}, {}, {}, {}
        self.tv, self.tm = {}, {}  # key -> (value, expiry); key -> {mk: (value, expiry)}

    def check(self, k, h, now):
        assert h.getValueState("v", "").get() == self.v.get(k)
        assert list(h.getListState("l", "").get()) == self.l.get(k, [])
        assert h.getListState("l", "").exists() == bool(self.l.get(k))
        got = dict(h.getMapState("m", "", "").iterator())
        assert got == self.m.get(k, {})
        assert h.getMapState("m", "", "").exists() == bool(self.m.get(k))
        for mk in list(self.m.get(k, {}))[:3] + [(-1,)]:
            assert h.getMapState("m", "", "").getValue(mk) == self.m.get(k, {}).get(mk)
            assert h.getMapState("m", "", "").containsKey(mk) == (mk in self.m.get(k, {}))
        assert list(h.listTimers()) == sorted(self.timers.get(k, set()))
        tv = self.tv.get(k)
        assert h.getValueState("tv", "").get() == (tv[0] if tv and tv[1] > now else None)
        want = {mk: v for mk, (v, e) in self.tm.get(k, {}).items() if e > now}
        assert dict(h.getMapState("tm", "", "").iterator()) == want


def step(rng, k, h, model, now):
    """One random operation on key k's state, applied to the handle and the model."""
    op = rng.randrange(14)
    vs, ls, ms = h.getValueState("v", ""), h.getListState("l", ""), h.getMapState("m", "", "")
    if op == 0:
        n = rng.randrange(100)
        vs.update((n,))
        model.v[k] = (n,)
    elif op == 1:
        vs.clear()
        model.v.pop(k, None)
    elif op in (2, 3):
        new = [(rng.randrange(1000), "e" * rng.randrange(5)) for _ in range(rng.choice([1, 1, 7]))]
        ls.appendList(new) if len(new) > 1 else ls.appendValue(new[0])
        model.l.setdefault(k, []).extend(new)
    elif op == 4:
        new = [(rng.randrange(1000), "p") for _ in range(rng.randrange(1, 9))]
        ls.put(new)
        model.l[k] = new
    elif op == 5:
        ls.clear()
        model.l.pop(k, None)
    elif op in (6, 7, 8):
        for _ in range(rng.choice([1, 3, 12])):
            mk, y = (rng.randrange(20),), "y%d" % rng.randrange(100)
            ms.updateValue(mk, (y,))
            model.m.setdefault(k, {})[mk] = (y,)
    elif op == 9:
        mk = (rng.randrange(20),)
        ms.removeKey(mk)
        model.m.get(k, {}).pop(mk, None)
    elif op == 10:
        ms.clear()
        model.m.pop(k, None)
    elif op == 11:
        t = rng.randrange(50)
        h.registerTimer(t)
        model.timers.setdefault(k, set()).add(t)
    elif op == 12:
        ts = sorted(model.timers.get(k, set()))
        if ts:
            h.deleteTimer(ts[0])
            model.timers[k].discard(ts[0])
    else:
        n = rng.randrange(100)
        h.getValueState("tv", "").update((n,))
        model.tv[k] = ((n,), now + TTL)
        mk = (rng.randrange(4),)
        h.getMapState("tm", "", "").updateValue(mk, (n,))
        model.tm.setdefault(k, {})[mk] = ((n,), now + TTL)
    if k in model.m and not model.m[k]:
        del model.m[k]
    if k in model.l and not model.l[k]:
        del model.l[k]


def test_random_operations_equal_a_dict_model(session_factory):
    rng = random.Random(11)
    model = Model()
    keys = [(i,) for i in range(12)]
    large = 0
    for b in range(8):
        now = 1000 * b
        s, st, h = session_factory(b, now)
        batch_keys = rng.sample(keys, 6)
        st.prefetch([encode_key(k) for k in batch_keys])
        for k in batch_keys:
            st.current = encode_key(k)
            model.check(k, h, now)  # what the previous batches left, through the prefetch
            for _ in range(rng.randrange(1, 8)):
                step(rng, k, h, model, now)
                model.check(k, h, now)  # the batch's own changes
        st.current = None
        write_back(st)
        s.commit(batch_time_ms=now)
        large += st.stats["large_reads"]
    assert large > 20, f"the on-demand paths were not exercised ({large} reads)"
    s, st, h = session_factory(8, 8000)
    st.prefetch([encode_key(k) for k in keys])
    for k in keys:
        st.current = encode_key(k)
        model.check(k, h, 8000)
    s.abort()


def test_a_value_larger_than_an_entry_is_refused_naming_the_variable(session_factory):
    s, st, h = session_factory(0, 0)
    st.prefetch([encode_key((1,)), encode_key((2,))])
    st.current = encode_key((1,))
    h.getValueState("v", "").update((5,))
    st.current = encode_key((2,))
    h.getValueState("blob", "").update((b"x" * (5 << 20),))
    with pytest.raises(StateValueError, match=r"state 'blob'.*larger than one state entry.*grouping key \(2,\)"):
        write_back(st)
    assert s.get_batch([st.vars["v"].heads.key(encode_key((1,)))]) == [None]  # nothing of the batch written
    s.abort()
