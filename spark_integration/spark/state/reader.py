"""Reading a committed checkpoint of a rhino.spark operator's state, from outside
the job: the rows of one state variable, or the registered timers, per instance.

What the ``rhino-state`` data source (``rhino.spark.state_source``) and
``rhino inspect --operator`` are built on. No query needs to run: each instance's
checkpoint is read from a worker whose replica store holds it
(``Client.read_checkpoint``), its primary first, else a member of its chain.

1. :func:`plan_read` asks the coordinator for the operator's state schema
   document (``variables.py``) and placement, and checks the request: the state
   variable exists, the batch is committed. Its :class:`ReadPlan` is plain data
   (it travels to Spark's executors).
2. :func:`read_instance` reads one instance's checkpoint of that batch: one scan
   of the variable's head (``layout.py``) over every vnode of the checkpoint,
   page by page, decoded with the variable's row codec; a list's elements come
   in list order (their tails sort by append order within a key).
3. :func:`count_entries` counts the entries of every variable and the timers of
   a checkpoint (``rhino inspect``).

TTL: an entry whose expiry is at or before the batch's time (``expiry <= time``)
is not returned, as the processor would not see it (Spark's rule). The
coordinator keeps the times of the operator's latest 1024 batches (the placement's
``batch_time``), so a TTL variable can be read at those; for an older batch the
time is unknown and the read is refused, unless ``include_expired`` is set
(then every stored entry is returned, expired ones included: the worker's
compaction filter drops expired entries only when it compacts).

Importing this module needs neither PySpark nor pandas: the row codecs
(``variables.py``, PySpark types) are imported when values are decoded, so
``rhino inspect`` counts entries without PySpark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional

import rhino
from rhino.coordinator.types import InstancePlacement, Placement
from rhino.errors import AuthFailedError, InvalidArgumentError, RhinoError

from . import layout
from .encoding import decode_key

__all__ = ["StateReadError", "ReadPlan", "plan_read", "read_pages", "read_instance", "open_checkpoint",
           "count_entries", "describe_variables", "schema_string", "TIMERS"]

TIMERS = "timers"  # a ReadPlan's kind for the registered timers
_TTL_FLAG = 0x01  # the TTL flag of a routed key (docs/protocol.md, "Keys")
_KIND_NAMES = {"value": "ValueState", "list": "ListState", "map": "MapState"}


class StateReadError(InvalidArgumentError):
    """A read the operator's state cannot answer as asked: an unknown operator or
    state variable, a batch that is not committed, a checkpoint no worker holds."""


@dataclass(frozen=True)
class ReadPlan:
    """What one read covers: plain data (picklable), no connection, no secret."""

    operator_id: str
    batch: int
    kind: str  # value | list | map | timers
    var_name: Optional[str]  # None for timers
    entry: Optional[dict]  # the variable's entry of the schema document (None for timers)
    grouping_key: str  # schema json of the grouping key's columns
    batch_time_ms: Optional[int]  # the batch's time (TTL), None if unknown
    include_expired: bool
    instances: dict = field(default_factory=dict)  # instance -> [worker address], primary first

    @property
    def prefix(self) -> bytes:
        """The scan prefix of the plan's entries (a variable's head, or the timers' ``T``)."""
        if self.kind == TIMERS:
            return layout.KEY_TIMERS
        return layout.KIND_BYTES[self.kind] + int(self.entry["id"]).to_bytes(2, "big")  # type: ignore[index]

    @property
    def filters_expired(self) -> bool:
        if self.kind == TIMERS or self.include_expired:
            return False
        return (self.entry or {}).get("ttl_ms") is not None


# ---- the plan ----------------------------------------------------------------------------------


def _doc_of(coord: Any, operator_id: str) -> dict:
    got = coord.state_schema(operator_id)
    doc = got.get("doc")
    if not doc or not doc.get("vars") and not doc.get("grouping_key"):
        raise StateReadError(f"operator {operator_id!r} has no registered state (it has not run a batch "
                             "with rhino.spark)")
    return doc


def _committed_batch(operator_id: str, placement: Placement, batch: Optional[int]) -> int:
    last = placement.last_batch
    if batch is None:
        if last is None:
            raise StateReadError(f"operator {operator_id!r} has no committed batch yet")
        return last
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
        raise StateReadError(f"batchId must be a batch number (an integer >= 0), not {batch!r}")
    if last is None or batch > last:
        raise StateReadError(f"batch {batch} of operator {operator_id!r} is not committed: "
                             + ("it has no committed batch yet" if last is None
                                else f"its last committed batch is {last}"))
    return batch


def _addresses(inst: InstancePlacement) -> list[str]:
    out: list[str] = []
    for a in (inst.address, *inst.chain_addresses):
        if a and a not in out:
            out.append(a)
    return out


def plan_read(coord: Any, operator_id: str, *, state_var: Optional[str] = None, timers: bool = False,
              batch: Optional[int] = None, include_expired: bool = False) -> ReadPlan:
    """The plan of a read of ``state_var`` (or, with ``timers=True``, the registered
    timers) of ``operator_id`` at committed batch ``batch`` (default: the last
    committed one). ``coord``: a coordinator client. Raises StateReadError."""
    if timers and state_var is not None:
        raise StateReadError("give either a state variable (stateVarName) or the timers "
                             "(readRegisteredTimers=true), not both")
    doc = _doc_of(coord, operator_id)
    known = sorted((doc.get("vars") or {}))
    if not timers:
        if state_var is None:
            raise StateReadError(f"name a state variable of operator {operator_id!r} (stateVarName): "
                                 f"one of {', '.join(known) or '(none)'}, or read its timers "
                                 "(readRegisteredTimers=true)")
        if state_var not in known:
            raise StateReadError(f"operator {operator_id!r} has no state variable {state_var!r}; "
                                 f"its state variables: {', '.join(known) or '(none)'}")
    if not doc.get("grouping_key"):
        raise StateReadError(f"operator {operator_id!r}'s state schema has no grouping key schema")
    placement = coord.placement(operator_id)
    b = _committed_batch(operator_id, placement, batch)
    batch_time = placement.batch_time_of(b)
    entry = None if timers else doc["vars"][state_var]
    plan = ReadPlan(operator_id=operator_id, batch=b, kind=TIMERS if timers else entry["kind"],
                    var_name=None if timers else state_var, entry=entry, grouping_key=doc["grouping_key"],
                    batch_time_ms=batch_time, include_expired=bool(include_expired),
                    instances={i: _addresses(placement.instances[i]) for i in placement.instance_order()})
    if plan.filters_expired and batch_time is None:
        bt = placement.batch_time
        known_t = f" (it knows batch {bt.batch}'s)" if bt else ""
        raise StateReadError(
            f"state {state_var!r} has a TTL, and the time of batch {b} is unknown: the coordinator keeps "
            f"the times of the operator's latest batches only{known_t}, so expired entries cannot be told "
            "apart; read the latest batch, or pass includeExpired=true to read every stored entry, "
            "expired ones included")
    return plan


# ---- one instance's checkpoint -------------------------------------------------------------------


class _Opened:
    """A checkpoint reader and the connection it came from, closed together."""

    def __init__(self, client: Any, reader: Any, address: str) -> None:
        self.client, self.reader, self.address = client, reader, address

    def __enter__(self) -> Any:
        return self.reader

    def __exit__(self, *exc: Any) -> None:
        try:
            self.reader.close()
        finally:
            self.client.close()


def open_checkpoint(addresses: Iterable[str], secret: Any, operator_id: str, instance: int, batch: int, *,
                    request_timeout: float = 120.0) -> _Opened:
    """Opens checkpoint ``batch`` of one instance on the first of ``addresses`` (its
    primary, then its chain) whose store holds it; a context manager giving the
    ``CheckpointReader``. Raises StateReadError naming every worker tried and why."""
    tried: list[str] = []
    for a in addresses:
        try:
            c = rhino.connect(a, secret=secret, client_id="rhino-state-reader", request_timeout=request_timeout)
        except AuthFailedError:
            raise
        except (RhinoError, OSError) as e:
            tried.append(f"{a}: {type(e).__name__}: {e}")
            continue
        try:
            return _Opened(c, c.read_checkpoint(operator_id, instance, batch), a)
        except AuthFailedError:
            c.close()
            raise
        except (RhinoError, OSError) as e:  # not in this store (NotFoundError), damaged, gone
            c.close()
            tried.append(f"{a}: {type(e).__name__}: {e}")
    raise StateReadError(f"checkpoint {batch} of operator {operator_id!r} instance {instance} could not be read "
                         f"from any worker holding the instance ({'; '.join(tried) or 'no workers placed'}); "
                         "a checkpoint older than the workers' retention is gone")


def _chunks(it: Iterable[Any], n: int) -> Iterator[list]:
    page: list = []
    for x in it:
        page.append(x)
        if len(page) >= n:
            yield page
            page = []
    if page:
        yield page


def _split(key: bytes) -> tuple:
    got = rhino.split_routed_key(key)
    if got is None:
        raise rhino.CorruptionError(f"a plain key {key[:40]!r} among rhino.spark's routed entries")
    return got


def _py(v: Any) -> Any:
    """A grouping key component as a DataFrame takes it (pandas Timestamp -> datetime)."""
    to = getattr(v, "to_pydatetime", None)
    return to() if to is not None else v


class _Keys:
    """Grouping key tuples of routing bytes (the entries of one key come together)."""

    def __init__(self) -> None:
        self.last: Optional[bytes] = None
        self.key: tuple = ()

    def __call__(self, g: bytes) -> tuple:
        if g != self.last:
            self.last, self.key = g, tuple(_py(v) for v in decode_key(g))
        return self.key


class _Decoder:
    """Pages of (key, value) entries of one plan -> output rows (tuples)."""

    def __init__(self, plan: ReadPlan, instance: int) -> None:
        self.plan, self.instance = plan, int(instance)
        self.keys = _Keys()
        self.var = None
        if plan.kind != TIMERS:
            from .variables import VarInfo  # the row codecs (PySpark types)

            self.var = VarInfo(plan.var_name, plan.entry)  # type: ignore[arg-type]
        self.now = plan.batch_time_ms

    def rows(self, page: list) -> list[tuple]:
        parts = [_split(k) for k, _ in page]
        i = self.instance
        if self.plan.kind == TIMERS:
            return [(self.keys(g), layout.time_ms_of_timer(t), i) for _, g, t, _ in parts]
        keep, payloads = [], []
        for j, ((_, blob), (_, _, _, flags)) in enumerate(zip(page, parts)):
            if flags & _TTL_FLAG:
                if self.plan.filters_expired and layout.unpack_expiry(blob) <= self.now:  # type: ignore[operator]
                    continue
                blob = blob[8:]
            keep.append(j)
            payloads.append(blob)
        if not keep:
            return []
        var = self.var
        values = var.codec.decode(payloads)  # type: ignore[union-attr]
        gs = [parts[j][1] for j in keep]
        if self.plan.kind == "map":
            ukeys = var.key_codec.decode([parts[j][2] for j in keep])  # type: ignore[union-attr]
            return [(self.keys(g), uk, v, i) for g, uk, v in zip(gs, ukeys, values)]
        return [(self.keys(g), v, i) for g, v in zip(gs, values)]


def read_pages(plan: ReadPlan, instance: int, secret: Any, *, page_size: int = 4096,
               request_timeout: float = 120.0) -> Iterator[list[tuple]]:
    """The rows of ``plan`` in one instance's checkpoint, a page (list) at a time,
    as tuples in the data source's column order: ``(key, value, partition_id)``,
    ``(key, list_element, partition_id)``, ``(key, user_map_key, user_map_value,
    partition_id)`` or ``(key, expiration_timestamp_ms, partition_id)``; key,
    value, element and map key are tuples of their schema's fields. The entries of
    one grouping key come together, a list's in list order."""
    if instance not in plan.instances:
        raise StateReadError(f"operator {plan.operator_id!r} has no instance {instance} "
                             f"(its instances: {sorted(plan.instances)})")
    dec = _Decoder(plan, instance)
    with open_checkpoint(plan.instances[instance], secret, plan.operator_id, instance, plan.batch,
                         request_timeout=request_timeout) as r:
        for page in _chunks(r.scan(prefix=plan.prefix, page_size=page_size), page_size):
            rows = dec.rows(page)
            if rows:
                yield rows


def read_instance(plan: ReadPlan, instance: int, secret: Any, **kw: Any) -> Iterator[tuple]:
    """The rows of :func:`read_pages`, one by one."""
    for page in read_pages(plan, instance, secret, **kw):
        yield from page


# ---- rhino inspect: the variables and their entry counts -----------------------------------------


def _type_string(t: Any) -> str:
    """A field type of a schema json as DDL ("long", "decimal(10,2)", ...)."""
    if isinstance(t, str):
        return t
    if isinstance(t, dict) and t.get("type") == "struct":
        return schema_string(t)
    return json.dumps(t)


def schema_string(schema: Any) -> str:
    """``struct<a:long,b:string>`` of a schema json (a string or its parsed dict), without PySpark."""
    s = json.loads(schema) if isinstance(schema, str) else schema
    return "struct<" + ",".join(f"{f['name']}:{_type_string(f['type'])}" for f in s.get("fields", [])) + ">"


def describe_variables(doc: Optional[dict]) -> list[dict]:
    """One dict per state variable of a schema document, by id: name, kind (and
    Spark's name of it), id, value schema (current version), map key schema, TTL,
    current version and the versions kept."""
    out = []
    for name, e in sorted(((doc or {}).get("vars") or {}).items(), key=lambda kv: int(kv[1]["id"])):
        out.append({"name": name, "kind": e["kind"], "type": _KIND_NAMES.get(e["kind"], e["kind"]),
                    "id": int(e["id"]), "schema": schema_string(e["versions"][str(e["current"])]),
                    "key_schema": schema_string(e["key_schema"]) if e.get("key_schema") else None,
                    "ttl_ms": e.get("ttl_ms"), "version": int(e["current"]),
                    "versions": sorted(int(v) for v in e["versions"])})
    return out


def _count(reader: Any, prefix: bytes, now: Optional[int], page_size: int) -> tuple[int, int]:
    """(entries, of which expired at ``now``) under ``prefix`` in a checkpoint."""
    n = expired = 0
    for k, v in reader.scan(prefix=prefix, page_size=page_size):
        n += 1
        if now is not None and k[-1] == 0xF5 and k[-2] & _TTL_FLAG and layout.unpack_expiry(v) <= now:
            expired += 1
    return n, expired


def count_entries(coord: Any, operator_id: str, secret: Any, *, batch: Optional[int] = None,
                  page_size: int = 4096, request_timeout: float = 120.0) -> dict:
    """The state variables of ``operator_id`` and their entries in checkpoint
    ``batch`` (default: the last committed), summed over the instances:
    ``{"operator_id", "batch", "batch_time_ms", "grouping_key", "variables": [...
    describe_variables, plus "entries" and, for a TTL variable whose batch time is
    known, "expired" and "live"], "timers": n, "instances": {i: worker read}}``.
    An entry is a value, a list element or a map entry; a timer counts once."""
    doc = _doc_of(coord, operator_id)
    placement = coord.placement(operator_id)
    b = _committed_batch(operator_id, placement, batch)
    now = placement.batch_time_of(b)
    variables = describe_variables(doc)
    for v in variables:
        v["entries"] = 0
        if v["ttl_ms"] is not None and now is not None:
            v["expired"] = 0
    timers = 0
    read_from = {}
    for i in placement.instance_order():
        opened = open_checkpoint(_addresses(placement.instances[i]), secret, operator_id, i, b,
                                 request_timeout=request_timeout)
        with opened as r:
            for v in variables:
                head = layout.KIND_BYTES[v["kind"]] + v["id"].to_bytes(2, "big")
                n, x = _count(r, head, now if "expired" in v else None, page_size)
                v["entries"] += n
                if "expired" in v:
                    v["expired"] += x
            timers += _count(r, layout.KEY_TIMERS, None, page_size)[0]
        read_from[i] = opened.address
    for v in variables:
        if "expired" in v:
            v["live"] = v["entries"] - v["expired"]
    return {"operator_id": operator_id, "batch": b, "batch_time_ms": now,
            "grouping_key": schema_string(doc["grouping_key"]) if doc.get("grouping_key") else None,
            "variables": variables, "timers": timers, "instances": read_from}
