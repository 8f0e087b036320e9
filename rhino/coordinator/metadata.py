"""The coordinator's metadata, in SQLite (docs/design.md §7: transactions and
crash safety for free).

One database file, ``<dir>/coordinator.db``, in a directory the job names. It
holds everything a restarted coordinator needs to resume where it stopped:

- ``workers``: each registered worker, its addresses, rack and zone, and
  whether it is alive or was declared dead (with its incarnation, so that the
  late messages of a dead incarnation are refused);
- ``operators``: each operator's partitioner, replication factor and current
  routing **epoch**, and the last batch completed everywhere;
- ``vnodes``: the routing table, vnode → instance, of the current epoch;
- ``routing_history``: the table of every epoch (who owned each vnode when);
- ``instances``: instance → primary worker, chain and chain version, its last
  complete checkpoint and state bytes, and the redo of a handover on top of a
  checkpoint (docs/protocol.md §7.4);
- ``vnode_load``: measured per-vnode load, reported with each commit;
- ``plans``: handover plans, with the steps done: ``scheduled`` (no step
  yet), ``running`` (between or inside steps), ``done``, ``aborted`` (a step
  failed and was undone) or ``cancelled`` (``rhino cancel-plan``); at most one
  open (scheduled or running) per operator;
- ``events``: a log of every decision, for ``rhino status`` and post-mortems.

Every decision is one transaction (:meth:`Metadata.tx`): a coordinator killed
in the middle either made it or did not, and a plan records each step it
finished, so a restarted coordinator never takes a decision twice.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from ..errors import UnknownInstanceError
from .reconfiguration import Reconfiguration

__all__ = ["Metadata", "WorkerRow", "OperatorRow", "InstanceRow", "PlanRow", "SCHEMA_VERSION", "OPEN_PLAN_STATES",
           "EPOCH_FLOOR_KEY"]

# The meta entry of the first epoch (and chain version) of a new operator: 1 until an
# operator is dropped, then above every epoch and chain version the dropped one used.
EPOCH_FLOOR_KEY = "epoch_floor"

SCHEMA_VERSION = 2  # 2: a plan may be 'cancelled' (version 1 databases are migrated on open)

# The plans table, apart: version 1's CHECK had no 'cancelled', and SQLite cannot
# change a CHECK in place (:meth:`Metadata._migrate_v1` rebuilds the table).
_PLANS_TABLE = """
CREATE TABLE IF NOT EXISTS plans (
  id INTEGER PRIMARY KEY AUTOINCREMENT, operator_id TEXT NOT NULL, kind TEXT NOT NULL,
  strategy TEXT NOT NULL, steps TEXT NOT NULL, steps_done INTEGER NOT NULL DEFAULT 0,
  after_batch INTEGER, state TEXT NOT NULL
    CHECK (state IN ('scheduled', 'running', 'done', 'aborted', 'cancelled')),
  created_at REAL NOT NULL, updated_at REAL NOT NULL, message TEXT NOT NULL DEFAULT '',
  bytes_moved INTEGER NOT NULL DEFAULT 0, seconds REAL NOT NULL DEFAULT 0,
  placement TEXT NOT NULL DEFAULT '{}')"""
_PLAN_COLUMNS = ("id, operator_id, kind, strategy, steps, steps_done, after_batch, state, created_at, updated_at,"
                 " message, bytes_moved, seconds, placement")
OPEN_PLAN_STATES = ("scheduled", "running")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workers (
  id TEXT PRIMARY KEY, address TEXT NOT NULL, unix_socket TEXT, host TEXT NOT NULL,
  rack TEXT, zone TEXT, state TEXT NOT NULL CHECK (state IN ('alive', 'dead')),
  incarnation TEXT NOT NULL, registered_at REAL NOT NULL, dead_since REAL);
CREATE TABLE IF NOT EXISTS operators (
  operator_id TEXT PRIMARY KEY, num_vnodes INTEGER NOT NULL, num_key_groups INTEGER NOT NULL,
  seed INTEGER NOT NULL, replicas INTEGER NOT NULL, placement TEXT NOT NULL,
  epoch INTEGER NOT NULL, last_batch INTEGER, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS vnodes (
  operator_id TEXT NOT NULL, vnode INTEGER NOT NULL, instance INTEGER NOT NULL,
  PRIMARY KEY (operator_id, vnode));
CREATE TABLE IF NOT EXISTS routing_history (
  operator_id TEXT NOT NULL, epoch INTEGER NOT NULL, assignment TEXT NOT NULL,
  primaries TEXT NOT NULL, reason TEXT NOT NULL, at REAL NOT NULL,
  PRIMARY KEY (operator_id, epoch));
CREATE TABLE IF NOT EXISTS instances (
  operator_id TEXT NOT NULL, instance INTEGER NOT NULL, primary_worker TEXT NOT NULL,
  chain TEXT NOT NULL, chain_version INTEGER NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('active', 'retired')),
  last_complete INTEGER, bytes INTEGER NOT NULL DEFAULT 0,
  redo_version INTEGER, redo TEXT NOT NULL DEFAULT '[]',
  PRIMARY KEY (operator_id, instance));
CREATE TABLE IF NOT EXISTS vnode_load (
  operator_id TEXT NOT NULL, vnode INTEGER NOT NULL, ops REAL NOT NULL, bytes REAL NOT NULL,
  batch INTEGER NOT NULL, PRIMARY KEY (operator_id, vnode));
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
"""


@dataclass
class WorkerRow:
    id: str
    address: str
    unix_socket: Optional[str]
    host: str
    rack: Optional[str]
    zone: Optional[str]
    state: str
    incarnation: str
    registered_at: float
    dead_since: Optional[float]

    @property
    def alive(self) -> bool:
        return self.state == "alive"


@dataclass
class OperatorRow:
    operator_id: str
    num_vnodes: int
    num_key_groups: int
    seed: int
    replicas: int
    placement: str
    epoch: int
    last_batch: Optional[int]
    created_at: float

    def partitioner_args(self) -> dict[str, int]:
        """The partitioner every ``open`` of one of its instances names (docs/protocol.md §7.1)."""
        return {"num_vnodes": self.num_vnodes, "num_key_groups": self.num_key_groups, "seed": self.seed}


@dataclass
class InstanceRow:
    operator_id: str
    instance: int
    primary_worker: str
    chain: list[str]
    chain_version: int
    state: str
    last_complete: Optional[int]
    bytes: int
    redo_version: Optional[int]
    redo: list[dict] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, int]:
        return (self.operator_id, self.instance)


@dataclass
class PlanRow:
    id: int
    operator_id: str
    kind: str
    strategy: str
    steps: list[list[list[int]]]  # steps of moves [vnode, origin, target]
    steps_done: int
    after_batch: Optional[int]
    state: str
    created_at: float
    updated_at: float
    message: str
    bytes_moved: int
    seconds: float
    placement: dict = field(default_factory=dict)  # new instance -> the worker asked for (horizontal scaling)

    @property
    def open(self) -> bool:
        """Scheduled or running: steps still to run."""
        return self.state in OPEN_PLAN_STATES


class Metadata:
    """The coordinator's SQLite database. Thread-safe: one connection, one lock."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.dir = os.fspath(directory)
        os.makedirs(self.dir, exist_ok=True)
        self.path = os.path.join(self.dir, "coordinator.db")
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a decision is on disk before anyone acts on it
        self._db.execute("PRAGMA foreign_keys=ON")
        for stmt in _SCHEMA.strip().split(";"):
            if stmt.strip():
                self._db.execute(stmt)
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            self._db.execute(_PLANS_TABLE)
            self._db.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) == 1:
            self._migrate_v1()
        elif int(row[0]) != SCHEMA_VERSION:
            raise RuntimeError(f"{self.path} has schema version {row[0]}, this coordinator reads {SCHEMA_VERSION}")

    def _migrate_v1(self) -> None:
        """Version 1 -> 2, in one transaction: the plans table is rebuilt with
        'cancelled' in its CHECK; every plan keeps its id, and new ids go on
        after the highest (AUTOINCREMENT counts the copied rows)."""
        with self.tx() as c:
            c.execute("ALTER TABLE plans RENAME TO plans_v1")
            c.execute(_PLANS_TABLE)
            c.execute(f"INSERT INTO plans ({_PLAN_COLUMNS}) SELECT {_PLAN_COLUMNS} FROM plans_v1")
            c.execute("DROP TABLE plans_v1")
            c.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction: all of it is durable, or none of it."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")

    def _q(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # ---- meta -------------------------------------------------------------
    def get_meta(self, key: str, default: Optional[str] = None) -> Optional[str]:
        rows = self._q("SELECT value FROM meta WHERE key=?", (key,))
        return rows[0][0] if rows else default

    @staticmethod
    def set_meta(c: sqlite3.Connection, key: str, value: str) -> None:
        c.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                  (key, value))

    @staticmethod
    def delete_meta(c: sqlite3.Connection, key: str) -> None:
        c.execute("DELETE FROM meta WHERE key=?", (key,))

    # A reconfiguration decided but not yet committed (the Replication
    # Manager's crash safety): carried out again by a restarted coordinator.
    def pending_reconfiguration(self, operator_id: str) -> Optional[Reconfiguration]:
        doc = self.get_meta(f"pending:{operator_id}")
        return None if doc is None else Reconfiguration.from_doc(json.loads(doc))

    def set_pending_reconfiguration(self, c: sqlite3.Connection, operator_id: str, r: Reconfiguration) -> None:
        self.set_meta(c, f"pending:{operator_id}", json.dumps(r.to_doc()))

    def clear_pending_reconfiguration(self, c: sqlite3.Connection, operator_id: str) -> None:
        self.delete_meta(c, f"pending:{operator_id}")

    # A handover step under way (design §4): aborted by a restarted coordinator.
    def handover_in_flight(self, operator_id: str) -> Optional[dict]:
        doc = self.get_meta(f"handover:{operator_id}")
        return None if doc is None else json.loads(doc)

    def set_handover_in_flight(self, c: sqlite3.Connection, operator_id: str, doc: dict) -> None:
        self.set_meta(c, f"handover:{operator_id}", json.dumps(doc))

    def clear_handover_in_flight(self, c: sqlite3.Connection, operator_id: str) -> None:
        self.delete_meta(c, f"handover:{operator_id}")

    # ---- workers ------------------------------------------------------------
    def workers(self) -> list[WorkerRow]:
        return [WorkerRow(**dict(r)) for r in self._q("SELECT * FROM workers ORDER BY id")]

    def worker(self, worker_id: str) -> Optional[WorkerRow]:
        rows = self._q("SELECT * FROM workers WHERE id=?", (worker_id,))
        return WorkerRow(**dict(rows[0])) if rows else None

    @staticmethod
    def upsert_worker(c: sqlite3.Connection, w: WorkerRow) -> None:
        c.execute(
            "INSERT INTO workers (id, address, unix_socket, host, rack, zone, state, incarnation, registered_at,"
            " dead_since) VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET address=excluded.address,"
            " unix_socket=excluded.unix_socket, host=excluded.host, rack=excluded.rack, zone=excluded.zone,"
            " state=excluded.state, incarnation=excluded.incarnation, registered_at=excluded.registered_at,"
            " dead_since=excluded.dead_since",
            (w.id, w.address, w.unix_socket, w.host, w.rack, w.zone, w.state, w.incarnation, w.registered_at,
             w.dead_since))

    @staticmethod
    def mark_worker_dead(c: sqlite3.Connection, worker_id: str) -> None:
        """Fences a worker off in the metadata: its late messages are refused from now on."""
        c.execute("UPDATE workers SET state='dead', dead_since=? WHERE id=?", (time.time(), worker_id))

    # ---- operators and routing ---------------------------------------------------
    def operators(self) -> list[OperatorRow]:
        return [OperatorRow(**dict(r)) for r in self._q("SELECT * FROM operators ORDER BY operator_id")]

    def operator(self, operator_id: str) -> Optional[OperatorRow]:
        rows = self._q("SELECT * FROM operators WHERE operator_id=?", (operator_id,))
        return OperatorRow(**dict(rows[0])) if rows else None

    def require_operator(self, operator_id: str) -> OperatorRow:
        """The operator, or UnknownInstanceError when no operator of that id is placed."""
        op = self.operator(operator_id)
        if op is None:
            raise UnknownInstanceError(f"no operator {operator_id!r} is placed")
        return op

    @staticmethod
    def put_operator(c: sqlite3.Connection, op: OperatorRow) -> None:
        """Writes an operator's row (a new operator, or one rebuilt from the workers)."""
        c.execute("INSERT OR REPLACE INTO operators (operator_id, num_vnodes, num_key_groups, seed, replicas,"
                  " placement, epoch, last_batch, created_at) VALUES (?,?,?,?,?,?,?,?,?)",
                  (op.operator_id, op.num_vnodes, op.num_key_groups, op.seed, op.replicas, op.placement, op.epoch,
                   op.last_batch, op.created_at))

    @staticmethod
    def set_last_batch(c: sqlite3.Connection, operator_id: str, batch: int) -> None:
        c.execute("UPDATE operators SET last_batch=? WHERE operator_id=?", (batch, operator_id))

    def assignment(self, operator_id: str) -> list[int]:
        return [r[0] for r in self._q("SELECT instance FROM vnodes WHERE operator_id=? ORDER BY vnode", (operator_id,))]

    def history(self, operator_id: str) -> list[dict]:
        return [{"epoch": r["epoch"], "assignment": json.loads(r["assignment"]),
                 "primaries": json.loads(r["primaries"]), "reason": r["reason"], "at": r["at"]}
                for r in self._q("SELECT * FROM routing_history WHERE operator_id=? ORDER BY epoch", (operator_id,))]

    @staticmethod
    def set_assignment(c: sqlite3.Connection, operator_id: str, assignment: list[int]) -> None:
        c.execute("DELETE FROM vnodes WHERE operator_id=?", (operator_id,))
        c.executemany("INSERT INTO vnodes (operator_id, vnode, instance) VALUES (?,?,?)",
                      [(operator_id, v, int(i)) for v, i in enumerate(assignment)])

    def record_epoch(self, c: sqlite3.Connection, operator_id: str, epoch: int, reason: str) -> None:
        """Sets the operator's epoch and writes the epoch's table into the history."""
        c.execute("UPDATE operators SET epoch=? WHERE operator_id=?", (epoch, operator_id))
        assignment = [r[0] for r in c.execute(
            "SELECT instance FROM vnodes WHERE operator_id=? ORDER BY vnode", (operator_id,))]
        primaries = {str(r[0]): r[1] for r in c.execute(
            "SELECT instance, primary_worker FROM instances WHERE operator_id=? AND state='active'", (operator_id,))}
        c.execute("INSERT OR REPLACE INTO routing_history (operator_id, epoch, assignment, primaries, reason, at)"
                  " VALUES (?,?,?,?,?,?)",
                  (operator_id, epoch, json.dumps(assignment), json.dumps(primaries), reason, time.time()))

    # ---- instances ------------------------------------------------------------------
    def instances(self, operator_id: Optional[str] = None, *, active_only: bool = True) -> list[InstanceRow]:
        sql = "SELECT * FROM instances"
        cond, args = [], []
        if operator_id is not None:
            cond.append("operator_id=?")
            args.append(operator_id)
        if active_only:
            cond.append("state='active'")
        if cond:
            sql += " WHERE " + " AND ".join(cond)
        return [_instance(r) for r in self._q(sql + " ORDER BY operator_id, instance", tuple(args))]

    def instance(self, operator_id: str, instance: int) -> Optional[InstanceRow]:
        rows = self._q("SELECT * FROM instances WHERE operator_id=? AND instance=?", (operator_id, instance))
        return _instance(rows[0]) if rows else None

    @staticmethod
    def put_instance(c: sqlite3.Connection, r: InstanceRow) -> None:
        c.execute("INSERT OR REPLACE INTO instances (operator_id, instance, primary_worker, chain, chain_version,"
                  " state, last_complete, bytes, redo_version, redo) VALUES (?,?,?,?,?,?,?,?,?,?)",
                  (r.operator_id, r.instance, r.primary_worker, json.dumps(r.chain), r.chain_version, r.state,
                   r.last_complete, r.bytes, r.redo_version, json.dumps(r.redo)))

    # ---- load -----------------------------------------------------------------------
    def vnode_load(self, operator_id: str) -> dict[int, float]:
        return {r["vnode"]: r["ops"] + r["bytes"] / 1024.0
                for r in self._q("SELECT * FROM vnode_load WHERE operator_id=?", (operator_id,))}

    @staticmethod
    def add_vnode_load(c: sqlite3.Connection, operator_id: str, vnode: int, ops: float, nbytes: float,
                       batch: int) -> None:
        """Folds one batch's measured load of a vnode into an exponentially
        weighted mean: recent batches count most."""
        c.execute("INSERT INTO vnode_load (operator_id, vnode, ops, bytes, batch) VALUES (?,?,?,?,?)"
                  " ON CONFLICT(operator_id, vnode) DO UPDATE"
                  " SET ops=0.5*ops+0.5*excluded.ops, bytes=0.5*bytes+0.5*excluded.bytes,"
                  " batch=excluded.batch", (operator_id, vnode, ops, nbytes, batch))

    # ---- plans ------------------------------------------------------------------------
    def plans(self, operator_id: Optional[str] = None, *, open_only: bool = False) -> list[PlanRow]:
        """Plans in id order: of one operator (``operator_id``) or of all;
        only the open ones (scheduled or running) with ``open_only``."""
        cond, args = [], []
        if operator_id is not None:
            cond.append("operator_id=?")
            args.append(operator_id)
        if open_only:
            cond.append("state IN ('scheduled','running')")
        sql = "SELECT * FROM plans" + (" WHERE " + " AND ".join(cond) if cond else "") + " ORDER BY id"
        return [_plan(r) for r in self._q(sql, tuple(args))]

    def plan(self, plan_id: int) -> Optional[PlanRow]:
        rows = self._q("SELECT * FROM plans WHERE id=?", (plan_id,))
        return _plan(rows[0]) if rows else None

    @staticmethod
    def insert_plan(c: sqlite3.Connection, operator_id: str, kind: str, strategy: str,
                    steps: list[list[list[int]]], after_batch: int, placement: dict[int, str]) -> int:
        """A new plan: scheduled, or done at once when it has no step. Returns its id."""
        now = time.time()
        cur = c.execute("INSERT INTO plans (operator_id, kind, strategy, steps, steps_done, after_batch, state,"
                        " created_at, updated_at, placement) VALUES (?,?,?,?,0,?,?,?,?,?)",
                        (operator_id, kind, strategy, json.dumps(steps), after_batch,
                         "scheduled" if steps else "done", now, now, json.dumps(placement)))
        return int(cur.lastrowid)

    @staticmethod
    def start_plan_step(c: sqlite3.Connection, plan_id: int) -> None:
        c.execute("UPDATE plans SET state='running', updated_at=? WHERE id=?", (time.time(), plan_id))

    @staticmethod
    def finish_plan_step(c: sqlite3.Connection, plan_id: int, steps_done: int, *, last: bool, bytes_moved: int,
                         seconds: float) -> None:
        """Counts a step committed, with what it copied and how long it took; the last one ends the plan."""
        c.execute("UPDATE plans SET steps_done=?, state=?, updated_at=?, bytes_moved=bytes_moved+?,"
                  " seconds=seconds+? WHERE id=?",
                  (steps_done, "done" if last else "running", time.time(), bytes_moved, seconds, plan_id))

    @staticmethod
    def abort_plan(c: sqlite3.Connection, plan_id: int, message: str) -> None:
        c.execute("UPDATE plans SET state='aborted', message=?, updated_at=? WHERE id=?",
                  (message, time.time(), plan_id))

    @staticmethod
    def cancel_plan(c: sqlite3.Connection, plan_id: int, message: str) -> None:
        """Ends a plan as cancelled: its steps not yet run never will (the caller
        checks it is between steps: :meth:`.HandoverManager.cancel_plan`)."""
        c.execute("UPDATE plans SET state='cancelled', message=?, updated_at=? WHERE id=?",
                  (message, time.time(), plan_id))

    # ---- dropping an operator ----------------------------------------------------------
    @staticmethod
    def delete_operator(c: sqlite3.Connection, operator_id: str) -> None:
        """Every row of the operator: the operator, its routing table and history, its
        instances, vnode load and plans, its meta entries (``<kind>:<operator_id>``) and
        every event that names it (its id as a JSON string in the event's detail)."""
        for table in ("operators", "vnodes", "routing_history", "instances", "vnode_load", "plans"):
            c.execute(f"DELETE FROM {table} WHERE operator_id=?", (operator_id,))
        c.execute("DELETE FROM meta WHERE instr(key, ':') > 0 AND substr(key, instr(key, ':') + 1)=?",
                  (operator_id,))
        c.execute("DELETE FROM events WHERE instr(detail, ?) > 0", (json.dumps(operator_id),))

    # ---- events -------------------------------------------------------------------------
    @staticmethod
    def event(c: sqlite3.Connection, event_kind: str, **detail: Any) -> None:
        c.execute("INSERT INTO events (at, kind, detail) VALUES (?,?,?)", (time.time(), event_kind, json.dumps(detail)))

    def events(self, limit: int = 50) -> list[dict]:
        rows = self._q("SELECT * FROM events ORDER BY id DESC LIMIT ?", (limit,))
        return [{"at": r["at"], "kind": r["kind"], **json.loads(r["detail"])} for r in reversed(rows)]


def _instance(r: sqlite3.Row) -> InstanceRow:
    d = dict(r)
    d["chain"] = json.loads(d["chain"])
    d["redo"] = json.loads(d["redo"])
    return InstanceRow(**d)


def _plan(r: sqlite3.Row) -> PlanRow:
    d = dict(r)
    d["steps"] = json.loads(d["steps"])
    d["placement"] = {int(k): v for k, v in json.loads(d["placement"]).items()}
    return PlanRow(**d)
