"""A processor's state variables: what ``init`` declares, their ids and schema
versions at the coordinator, and what a task needs to encode them.

Before an operator's first batch, the driver runs ``init`` on a copy of the
processor with a :class:`DeclaringHandle` (as Spark's driver does to learn the
state schema) and checks the declared variables against the operator's state
schema document at the coordinator (``state_schema`` / ``set_state_schema``):

- a new variable gets the next id, at schema version 1;
- a changed value schema must be a compatible evolution (``schema.evolve``:
  nullable fields added or removed, types widened); it becomes a new version,
  and values written with an older one are read through it;
- anything else (another kind, another map key schema, TTL turned on or off)
  is refused before the batch runs, with the variable and field named.

The document: ``{"vars": {name: {"id", "kind", "ttl_ms", "key_schema",
"versions": {version: schema json}, "current"}}, "next_id", "grouping_key",
"dropped", "code"}`` (``grouping_key``: the schema json of the grouping key's columns;
``dropped``: the variables a code change removed, ``{"name", "id", "kind", "ttl", "batch"}``
each, their entries deleted by every instance's task of ``batch``; ``code``: which code
runs from which batch, ``driver/code_version.py``).

When the code changes (a swap, or a restart with new code: issue 47), a variable the
new processor no longer declares is removed in the change's batch, and its id is never
given again: declared again later, it starts empty.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from pyspark.sql.streaming.stateful_processor import StatefulProcessorHandle

from .codec import RowCodec
from .layout import Heads
from .schema import StateSchemaError, evolve, parse_schema

__all__ = ["Declared", "DeclaringHandle", "declared_variables", "heads_dropped_in", "resolve_schema_doc", "VarInfo",
           "variables_of"]


@dataclass
class Declared:
    name: str
    kind: str  # value | list | map
    value_schema: Any  # StructType
    key_schema: Any = None  # StructType (map)
    ttl_ms: Optional[int] = None


class _Inert:
    """What a DeclaringHandle returns for a state: init may keep it, nothing more."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("state used in init() while rhino.spark reads the declared schema")


def _ttl(name: str, ttl: Optional[int]) -> Optional[int]:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0:
        raise StateSchemaError(f"state {name!r}: ttlDurationMs must be a positive int of ms, not {ttl!r}")
    return int(ttl)


class DeclaringHandle(StatefulProcessorHandle):
    """The handle ``init`` gets on the driver: it records the declared variables."""

    def __init__(self) -> None:  # no API client: nothing talks to a JVM
        self.declared: dict[str, Declared] = {}

    def _add(self, d: Declared) -> _Inert:
        old = self.declared.get(d.name)
        if old is not None and old.kind != d.kind:
            raise StateSchemaError(f"state {d.name!r} is declared as a {old.kind} state and as a {d.kind} state")
        self.declared[d.name] = d
        return _Inert()

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: Optional[int] = None) -> Any:
        return self._add(Declared(stateName, "value", parse_schema(schema, var=stateName),
                                  ttl_ms=_ttl(stateName, ttlDurationMs)))

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: Optional[int] = None) -> Any:
        return self._add(Declared(stateName, "list", parse_schema(schema, var=stateName),
                                  ttl_ms=_ttl(stateName, ttlDurationMs)))

    def getMapState(self, stateName: str, userKeySchema: Any, valueSchema: Any,
                    ttlDurationMs: Optional[int] = None) -> Any:
        return self._add(Declared(stateName, "map", parse_schema(valueSchema, var=stateName),
                                  key_schema=parse_schema(userKeySchema, var=stateName),
                                  ttl_ms=_ttl(stateName, ttlDurationMs)))

    def registerTimer(self, expiryTimestampMs: int) -> None:
        pass

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        pass

    def listTimers(self) -> Iterator[int]:
        return iter(())

    def deleteIfExists(self, stateName: str) -> None:
        pass


def declared_variables(processor: Any) -> dict[str, Declared]:
    """The state variables ``processor.init`` declares, run on a copy of the processor."""
    from pyspark import cloudpickle

    copy = cloudpickle.loads(cloudpickle.dumps(processor))
    h = DeclaringHandle()
    copy.init(h)
    return h.declared


def _entry_for(d: Declared, var_id: int) -> dict:
    return {"id": var_id, "kind": d.kind, "ttl_ms": d.ttl_ms,
            "key_schema": d.key_schema.json() if d.key_schema is not None else None,
            "versions": {"1": d.value_schema.json()}, "current": 1}


def _check_same_shape(name: str, d: Declared, e: dict) -> None:
    from pyspark.sql.types import StructType

    if e["kind"] != d.kind:
        raise StateSchemaError(f"state {name!r}: the operator's state holds it as a {e['kind']} state; "
                               f"it cannot become a {d.kind} state (use a new name)")
    if (e["ttl_ms"] is None) != (d.ttl_ms is None):
        raise StateSchemaError(f"state {name!r}: TTL cannot be turned {'on' if d.ttl_ms else 'off'} for a "
                               "variable that already has state (use a new name)")
    if d.kind == "map":
        old_key = StructType.fromJson(json.loads(e["key_schema"]))
        if old_key != d.key_schema:
            raise StateSchemaError(f"state {name!r}: the map key schema changed from {old_key.simpleString()} "
                                   f"to {d.key_schema.simpleString()}; a map key schema cannot evolve")


def resolve_schema_doc(doc: Optional[dict], declared: dict[str, Declared], *,
                       grouping_key: Any = None, drop_undeclared_at: Optional[int] = None) -> tuple[dict, bool]:
    """The document with ``declared`` registered (ids, new versions), and whether it
    changed. ``grouping_key``: the StructType of the grouping key's columns (the state
    reader decodes keys with it). ``drop_undeclared_at``: a code change's batch, in which
    the variables ``declared`` lacks are removed (``dropped``). Raises StateSchemaError
    (naming the variable and field) on an incompatible change, before anything is removed."""
    from pyspark.sql.types import StructType

    doc = json.loads(json.dumps(doc)) if doc else {"vars": {}, "next_id": 1}
    changed = False
    if grouping_key is not None:
        old = doc.get("grouping_key")
        if old is not None and [f["name"] for f in json.loads(old)["fields"]] != grouping_key.names:
            raise StateSchemaError(f"the grouping key changed from {StructType.fromJson(json.loads(old)).simpleString()} "
                                   f"to {grouping_key.simpleString()}; the operator's state is keyed by the old one")
        if old != grouping_key.json():
            doc["grouping_key"] = grouping_key.json()
            changed = True
    for name, d in sorted(declared.items()):
        e = doc["vars"].get(name)
        if e is None:
            doc["vars"][name] = _entry_for(d, doc["next_id"])
            doc["next_id"] += 1
            changed = True
            continue
        _check_same_shape(name, d, e)
        if e["ttl_ms"] != d.ttl_ms:
            e["ttl_ms"] = d.ttl_ms
            changed = True
        cur = StructType.fromJson(json.loads(e["versions"][str(e["current"])]))
        if cur != d.value_schema:
            evolve(cur, d.value_schema, name)  # raises on an incompatible change
            e["current"] += 1
            e["versions"][str(e["current"])] = d.value_schema.json()
            changed = True
    if drop_undeclared_at is not None:
        for name in sorted(set(doc["vars"]) - set(declared)):
            e = doc["vars"].pop(name)
            doc.setdefault("dropped", []).append({"name": name, "id": e["id"], "kind": e["kind"],
                                                  "ttl": e["ttl_ms"] is not None, "batch": int(drop_undeclared_at)})
            changed = True
    return doc, changed


def heads_dropped_in(doc: Optional[dict], batch: int) -> list[bytes]:
    """The key heads of the variables a code change removed in ``batch`` (``dropped``):
    every instance's task of that batch deletes their entries, again if the batch runs again."""
    return [Heads(d["kind"], int(d["id"]), bool(d["ttl"])).head
            for d in (doc or {}).get("dropped") or () if int(d["batch"]) == int(batch)]


class VarInfo:
    """What a task needs of one state variable: its keys and its codecs."""

    def __init__(self, name: str, entry: dict) -> None:
        from pyspark.sql.types import StructType

        self.name = name
        self.kind: str = entry["kind"]
        self.id: int = int(entry["id"])
        self.ttl_ms: Optional[int] = entry["ttl_ms"]
        history = {int(v): StructType.fromJson(json.loads(s)) for v, s in entry["versions"].items()}
        cur = int(entry["current"])
        self.codec = RowCodec(history[cur], var=name, version=cur, history=history)
        self.key_codec = (RowCodec(StructType.fromJson(json.loads(entry["key_schema"])), var=name, version=None)
                          if self.kind == "map" else None)
        self.heads = Heads(self.kind, self.id, self.ttl_ms is not None)


def variables_of(doc: Optional[dict]) -> dict[str, VarInfo]:
    return {name: VarInfo(name, e) for name, e in ((doc or {}).get("vars") or {}).items()}
