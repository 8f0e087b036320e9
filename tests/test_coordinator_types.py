"""The coordinator's answers as dataclasses (rhino/coordinator/types.py).

- Round trips: the wire answers of a real coordinator (in-process, over two ``rhino
  worker`` processes, as tests/test_coordinator.py runs it), captured raw through the
  client's ``call``, parse and serialize back to the same JSON text, keys in order; the
  client's typed methods answer the parsed form.
- What callers use instead of string keys: the instance order, the partitioner's
  arguments, the batch times; a placement is frozen and pickles (an attempt ships it to
  its tasks).
- A malformed answer is a CorruptionError naming the bad field; a field this client
  does not know is ignored.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from pathlib import Path

import pytest

from rhino.coordinator.client import LocalCoordinatorClient
from rhino.coordinator.coordinator import Coordinator
from rhino.coordinator.types import BatchTime, CommitAnswer, InstancePlacement, Placement
from rhino.errors import CorruptionError
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret

OP = "op"
V = 8


@pytest.fixture(scope="module")
def wire(tmp_path_factory) -> dict:
    """Raw answers of a coordinator, by what was asked."""
    tmp: Path = tmp_path_factory.mktemp("types")
    sf = write_secret(tmp, SECRET)
    ws = [WorkerProcess(tmp, f"w{n}", f"127.0.0.{n}", secret_file=sf, metrics=False).start() for n in (2, 3)]
    coord = Coordinator(str(tmp / "coord"), secret=SECRET, heartbeat_timeout=3600)
    cc = LocalCoordinatorClient(coord)
    try:
        for w in ws:
            cc.register(w.id, w.address, unix_socket=str(w.unix_socket), incarnation="test")
        out = {"create_operator": cc.call("create_operator", operator_id=OP, parallelism=2, num_vnodes=V, replicas=1),
               "begin_timed": cc.call("begin_batch", operator_id=OP, batch=0, batch_time_ms=5000),
               "commit": cc.call("commit_batch", operator_id=OP, batch=0, instances={"0": {"checkpoint_bytes": 7}},
                                 load={"3": [2, 40]}, epoch=1),
               "begin": cc.call("begin_batch", operator_id=OP, batch=1),
               "commit_bad_report": cc.call("commit_batch", operator_id=OP, batch=1, epoch=1, report={"records": 1})}
        cc.autoscale(OP, min_parallelism=1, max_parallelism=2)
        cc.begin_batch(OP, 2, batch_time_ms=6000)
        report = {"batch_s": 0.5, "records": 10, "records_by_instance": {"0": 4, "1": 6},
                  "busy_s": {"0": 0.1, "1": 0.2}, "began_unix": 1_000_000.0}
        out["commit_autoscaled"] = cc.call("commit_batch", operator_id=OP, batch=2, epoch=1, report=report)
        out["placement"] = cc.call("placement", operator_id=OP)
        out["report_unreachable"] = cc.call("report_unreachable", operator_id=OP, instance=0, worker_id="w2")
        out["typed"] = cc.placement(OP)
        out["workers"] = {w.id: w.address for w in ws}
        return out
    finally:
        coord.close()
        for w in ws:
            w.stop()


PLACEMENTS = ["create_operator", "begin_timed", "begin", "placement", "report_unreachable"]
COMMITS = ["commit", "commit_bad_report", "commit_autoscaled"]


@pytest.mark.parametrize("answer", PLACEMENTS + COMMITS)
def test_a_wire_answer_round_trips_to_the_same_json(wire: dict, answer: str) -> None:
    doc = wire[answer]
    cls = CommitAnswer if answer in COMMITS else Placement
    back = cls.from_wire(doc).to_wire()
    assert back == doc
    assert json.dumps(back, separators=(",", ":")) == json.dumps(doc, separators=(",", ":"))  # keys in order too


def test_the_fields_are_what_the_coordinator_answered(wire: dict) -> None:
    p = Placement.from_wire(wire["placement"])
    assert p == wire["typed"]  # the client's placement() parses the same
    assert (p.operator_id, p.epoch, p.num_vnodes, p.replicas, p.last_batch) == (OP, 1, V, 1, 2)
    assert p.instance_order() == [0, 1] and set(p.assignment) == {0, 1} and len(p.assignment) == V
    assert p.partitioner_args() == {"num_key_groups": 1 << 15, "num_vnodes": V, "seed": 0}
    for i, inst in p.instances.items():
        assert isinstance(inst, InstancePlacement) and inst.address == wire["workers"][inst.primary]
        assert inst.host == inst.address.rsplit(":", 1)[0] and inst.unix_socket.endswith(f"{inst.primary}.sock")
        assert len(inst.chain) == 1 and inst.chain[0] != inst.primary
        assert inst.chain_addresses == (wire["workers"][inst.chain[0]],) and inst.last_complete == 2
    assert p.instances[0].bytes == 7  # commit 0's checkpoint_bytes
    assert p.batch_time == BatchTime(batch=2, time_ms=6000, recent={0: 5000})
    assert (p.batch_time_of(2), p.batch_time_of(0), p.batch_time_of(1)) == (6000, 5000, None)
    assert p.batch_time_ms is None and Placement.from_wire(wire["begin_timed"]).batch_time_ms == 5000
    assert CommitAnswer.from_wire(wire["commit"]) == CommitAnswer(operator_id=OP, last_batch=0)
    bad = CommitAnswer.from_wire(wire["commit_bad_report"])
    assert bad.last_batch == 1 and bad.report_error.startswith("InvalidArgumentError") and bad.autoscale is None
    decided = CommitAnswer.from_wire(wire["commit_autoscaled"])
    assert decided.report_error is None and decided.autoscale["batch"] == 2


def test_a_placement_is_frozen_and_pickles(wire: dict) -> None:
    p = Placement.from_wire(wire["placement"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.epoch = 9  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.instances[0].primary = "w9"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(p)) == p


def test_fields_this_client_does_not_know_are_ignored(wire: dict) -> None:
    doc = copy.deepcopy(wire["placement"])
    doc["future_field"] = {"x": 1}
    doc["instances"]["0"]["zone"] = "z1"
    assert Placement.from_wire(doc) == Placement.from_wire(wire["placement"])


def _set(path: list, value: object):
    def change(doc: dict) -> None:
        *parents, last = path
        for k in parents:
            doc = doc[k]
        if value is KeyError:
            del doc[last]
        else:
            doc[last] = value
    return change


MALFORMED = [
    (_set(["epoch"], KeyError), "placement has no 'epoch'"),
    (_set(["epoch"], "3"), "placement.epoch must be an integer, got '3'"),
    (_set(["epoch"], True), "placement.epoch must be an integer, got True"),
    (_set(["operator_id"], None), "placement.operator_id must be a string"),
    (_set(["last_batch"], 1.5), "placement.last_batch must be an integer"),
    (_set(["instances"], []), "placement.instances must be a JSON object"),
    (_set(["instances", "x"], {}), "placement.instances's keys must be instance numbers"),
    (_set(["instances", "0"], "w2"), r"placement.instances\['0'\] must be a JSON object"),
    (_set(["instances", "0", "chain_version"], KeyError), r"placement.instances\['0'\] has no 'chain_version'"),
    (_set(["instances", "1", "chain"], "w2"), r"placement.instances\['1'\].chain must be a list of strings"),
    (_set(["instances", "1", "address"], 7), r"placement.instances\['1'\].address must be a string or null"),
    (_set(["assignment"], [0, 1]), "placement.assignment must be a list of 8 instance numbers"),
    (_set(["assignment", 3], -1), r"placement.assignment\[3\] must be an integer >= 0, got -1"),
    (_set(["assignment", 5], "1"), r"placement.assignment\[5\] must be an integer >= 0, got '1'"),
    (_set(["batch_time"], KeyError), "placement has no 'batch_time'"),
    (_set(["batch_time", "time_ms"], None), "placement.batch_time.time_ms must be an integer"),
    (_set(["batch_time", "recent"], {"zero": 5000}), "placement.batch_time.recent must be an object of batch "
                                                     "numbers"),
    (_set(["batch_time", "recent", "0"], "5 s"), "placement.batch_time.recent must be an object of batch numbers"),
    (_set(["batch_time_ms"], "soon"), "placement.batch_time_ms must be an integer"),
]


@pytest.mark.parametrize("change,message", MALFORMED)
def test_a_malformed_placement_names_its_bad_field(wire: dict, change, message: str) -> None:
    doc = copy.deepcopy(wire["placement"])
    change(doc)
    with pytest.raises(CorruptionError, match=message):
        Placement.from_wire(doc)


def test_a_malformed_answer_is_refused_whole() -> None:
    with pytest.raises(CorruptionError, match="placement must be a JSON object, got None"):
        Placement.from_wire(None)
    with pytest.raises(CorruptionError, match="commit_batch's answer has no 'last_batch'"):
        CommitAnswer.from_wire({"operator_id": OP})
    with pytest.raises(CorruptionError, match="commit_batch's answer.autoscale must be a JSON object"):
        CommitAnswer.from_wire({"operator_id": OP, "last_batch": 0, "autoscale": "scale_out"})
    with pytest.raises(CorruptionError, match="commit_batch's answer.report_error must be a string or null"):
        CommitAnswer.from_wire({"operator_id": OP, "last_batch": 0, "report_error": 3})
    with pytest.raises(CorruptionError, match=r"got \[0, 1, 2, [0-9, ]*\.\.\.$"):  # a long value is cut short
        Placement.from_wire({"instances": {}, "num_vnodes": 256, "assignment": list(range(200))})
