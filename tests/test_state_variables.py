"""The state variables of a processor: what ``init`` declares (read on the
driver), their registration at the coordinator (ids, schema versions, a
compare-and-set document), and the batch time the coordinator fixes per batch.

The coordinator runs in-process against real worker processes (its operators
need placed instances). Expected values are written out by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

from rhino.coordinator.client import LocalCoordinatorClient  # noqa: E402
from rhino.coordinator.coordinator import Coordinator  # noqa: E402
from rhino.coordinator.types import BatchTime  # noqa: E402
from rhino.errors import BusyError, InvalidArgumentError  # noqa: E402
from rhino.spark.state.schema import StateSchemaError  # noqa: E402
from rhino.spark.state.variables import declared_variables, resolve_schema_doc, variables_of  # noqa: E402
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret  # noqa: E402


class P(StatefulProcessor):
    def __init__(self, value="c long", ttl=None, key="k string", kind="value"):
        self.value, self.ttl, self.key, self.kind = value, ttl, key, kind

    def init(self, handle):
        if self.kind == "value":
            self.v = handle.getValueState("v", self.value, self.ttl)
        else:
            self.v = handle.getListState("v", self.value, self.ttl)
        self.m = handle.getMapState("m", self.key, "n long")

    def handleInputRows(self, key, rows, timerValues):
        return iter([])


def test_declared_variables_run_init_on_a_copy():
    p = P()
    d = declared_variables(p)
    assert sorted(d) == ["m", "v"]
    assert d["v"].kind == "value" and d["v"].value_schema.simpleString() == "struct<c:bigint>"
    assert d["m"].kind == "map" and d["m"].key_schema.simpleString() == "struct<k:string>"
    assert not hasattr(p, "v"), "init ran on the processor itself, not a copy"


def test_registration_ids_versions_and_refusals():
    doc, changed = resolve_schema_doc(None, declared_variables(P()))
    assert changed and doc["next_id"] == 3
    assert {n: e["id"] for n, e in doc["vars"].items()} == {"m": 1, "v": 2}  # sorted by name
    same, changed = resolve_schema_doc(doc, declared_variables(P()))
    assert not changed and same == doc
    # a nullable field added: version 2, the same id
    doc2, changed = resolve_schema_doc(doc, declared_variables(P(value="c long, note string")))
    assert changed and doc2["vars"]["v"]["current"] == 2 and doc2["vars"]["v"]["id"] == 2
    assert set(doc2["vars"]["v"]["versions"]) == {"1", "2"}
    vi = variables_of(doc2)["v"]
    assert vi.codec is not None and vi.heads.head == b"v\x00\x02"
    with pytest.raises(StateSchemaError, match="'v'.*'c'"):  # long -> string: incompatible
        resolve_schema_doc(doc, declared_variables(P(value="c string")))
    with pytest.raises(StateSchemaError, match="'v'.*list"):
        resolve_schema_doc(doc, declared_variables(P(kind="list")))
    with pytest.raises(StateSchemaError, match="'m'.*map key"):
        resolve_schema_doc(doc, declared_variables(P(key="k long")))
    with pytest.raises(StateSchemaError, match="TTL"):
        resolve_schema_doc(doc, declared_variables(P(ttl=1000)))


@pytest.fixture
def coordinator(tmp_path: Path):
    sf = write_secret(tmp_path, SECRET)
    ws = [WorkerProcess(tmp_path, f"w{n}", f"127.0.0.{n}", secret_file=sf, metrics=False).start() for n in (2, 3)]
    coord = Coordinator(str(tmp_path / "coord"), secret=SECRET, heartbeat_timeout=3600)
    cc = LocalCoordinatorClient(coord)
    for w in ws:
        cc.register(w.id, w.address, unix_socket=str(w.unix_socket), incarnation="test")
    cc.create_operator("op", parallelism=2, num_vnodes=8, replicas=1)
    yield tmp_path, coord, cc
    coord.close()
    for w in ws:
        w.stop()


def test_batch_time_is_fixed_per_batch_and_never_goes_back(coordinator):
    tmp, coord, cc = coordinator
    assert cc.begin_batch("op", 0, batch_time_ms=5000).batch_time_ms == 5000
    assert cc.begin_batch("op", 0, batch_time_ms=9000).batch_time_ms == 5000  # run again: same time
    cc.commit_batch("op", 0)
    assert cc.placement("op").batch_time == BatchTime(batch=0, time_ms=5000, recent={})  # a replay reads it
    assert cc.placement("op").batch_time_ms is None  # begin_batch's answer only
    assert cc.begin_batch("op", 1, batch_time_ms=4000).batch_time_ms == 5000  # a clock that went back
    assert cc.placement("op").batch_time == BatchTime(batch=1, time_ms=5000, recent={0: 5000})
    assert (cc.placement("op").batch_time_of(0), cc.placement("op").batch_time_of(1)) == (5000, 5000)
    with pytest.raises(InvalidArgumentError, match="batch_time_ms"):
        cc.call("begin_batch", operator_id="op", batch=1, batch_time_ms="soon")  # past the client
    coord.close()
    again = LocalCoordinatorClient(Coordinator(str(tmp / "coord"), secret=SECRET, heartbeat_timeout=3600))
    assert again.begin_batch("op", 1, batch_time_ms=7000).batch_time_ms == 5000  # survives a restart


def test_state_schema_document_is_a_compare_and_set(coordinator):
    _, _, cc = coordinator
    assert cc.state_schema("op") == {"revision": 0, "doc": None}
    assert cc.set_state_schema("op", {"vars": {}, "next_id": 1}, 0) == {"revision": 1}
    with pytest.raises(BusyError, match="revision 1"):
        cc.set_state_schema("op", {"vars": {}, "next_id": 2}, 0)
    assert cc.state_schema("op") == {"revision": 1, "doc": {"vars": {}, "next_id": 1}}
    with pytest.raises(InvalidArgumentError):
        cc.set_state_schema("op", ["not", "a", "doc"], 1)
