"""The fence of a failover (``ReplicationManager.carry_out`` step 1) sends its takeovers and
re-opens in parallel, takeovers first: a driver's next attempt waits for the whole failover
(``report_unreachable``), so one slow re-open (its fsyncs on a busy disk) must not add to
another instance's takeover. A unit test of the Replication Manager with stub workers that
take a fixed time per request; the requests' intervals must overlap."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from rhino.coordinator.metadata import InstanceRow, Metadata, OperatorRow, WorkerRow
from rhino.coordinator.replication_manager import ReplicationManager
from rhino.errors import RhinoIOError

from helpers import StubWorkerGateway

DELAY_S = 0.4


class SlowClient:
    """A worker's client whose instance requests each take DELAY_S; records (worker, action,
    instance, start, end)."""

    def __init__(self, wid: str, calls: list, failing: set) -> None:
        self.wid, self.calls, self.failing = wid, calls, failing

    def _do(self, action: str, instance: int) -> dict:
        start = time.monotonic()
        time.sleep(DELAY_S)
        self.calls.append((self.wid, action, instance, start, time.monotonic()))
        if (self.wid, instance) in self.failing:
            raise RhinoIOError(f"{self.wid}: disk trouble with instance {instance}")
        return {"restore_s": 0.01} if action == "takeover" else {}

    def open_instance(self, operator_id: str, instance: int, **kw: Any) -> dict:
        return self._do("open", instance)

    def takeover(self, operator_id: str, instance: int, **kw: Any) -> dict:
        return self._do("takeover", instance)

    def status(self, operator_id: str, instance: int, **kw: Any) -> dict:
        return {"checkpoints": [5]}


class SlowGateway(StubWorkerGateway):
    def __init__(self, meta: Metadata) -> None:
        super().__init__(meta, lambda wid: SlowClient(wid, self.calls, self.failing))


def _operator_with_w2_dead(meta: Metadata) -> None:
    """Instances 0, 1, 2 with primaries w1, w2, w3, each chained to the next two workers; w2 dead."""
    now = time.time()
    ws = ["w1", "w2", "w3"]
    with meta.tx() as c:
        for w in ws:
            meta.upsert_worker(c, WorkerRow(id=w, address=f"{w}:1", unix_socket=None, host="h", rack=None, zone=None,
                                            state="alive", incarnation="x", registered_at=now, dead_since=None))
        meta.put_operator(c, OperatorRow(operator_id="q", num_vnodes=6, num_key_groups=64, seed=0, replicas=2,
                                         placement="balanced", epoch=1, last_batch=5, created_at=now))
        meta.set_assignment(c, "q", [0, 1, 2, 0, 1, 2])
        for i in range(3):
            meta.put_instance(c, InstanceRow(operator_id="q", instance=i, primary_worker=ws[i],
                                             chain=[ws[(i + 1) % 3], ws[(i + 2) % 3]], chain_version=1,
                                             state="active", last_complete=5, bytes=100, redo_version=None, redo=[]))
        meta.record_epoch(c, "q", 1, "created")
        meta.mark_worker_dead(c, "w2")


@pytest.fixture
def rm_and_gateway(tmp_path: Path):
    meta = Metadata(str(tmp_path / "meta"))
    _operator_with_w2_dead(meta)
    gw = SlowGateway(meta)
    yield ReplicationManager(meta, gw, lambda event, **f: None), gw, meta
    meta.close()


def test_takeover_and_reopens_run_at_once(rm_and_gateway) -> None:
    rm, gw, meta = rm_and_gateway
    out = rm.recover_from_loss("w2")
    report = out["operators"]["q"]
    fence = [c for c in gw.calls if c[1] in ("open", "takeover")]
    assert sorted((c[1], c[2]) for c in fence) == [("open", 0), ("open", 2), ("takeover", 1)]
    # every request began before any ended: they ran together, not one after another
    assert max(c[3] for c in fence) < min(c[4] for c in fence)
    assert report["fence_s"] < 2 * DELAY_S  # one after another would be 3 x DELAY_S
    assert set(report["reopens"]) == {"0", "2"} and set(report["takeovers"]) == {"1"}
    # the new placement is committed: instance 1 on its first chain member, at epoch 2
    assert meta.instance("q", 1).primary_worker == "w3"
    assert meta.operator("q").epoch == 2 and meta.pending_reconfiguration("q") is None


def test_a_failed_request_leaves_the_reconfiguration_pending(rm_and_gateway) -> None:
    rm, gw, meta = rm_and_gateway
    gw.failing = {("w3", 2)}  # the re-open of instance 2 fails; the takeover of 1 succeeds
    out = rm.recover_from_loss("w2")
    assert "disk trouble with instance 2" in out["errors"]["q"]
    # nothing committed: the old placement and epoch, the reconfiguration pending for a retry
    assert meta.operator("q").epoch == 1 and meta.instance("q", 1).primary_worker == "w2"
    assert meta.pending_reconfiguration("q").epoch == 2
    gw.failing = set()
    assert rm.repair_all() == {}
    assert meta.operator("q").epoch == 3 and meta.instance("q", 1).primary_worker == "w3"
