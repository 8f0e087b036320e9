"""An operator's state schema document, kept by the coordinator for its drivers.

``rhino.spark`` writes it: the operator's state variables, their ids and schema versions
(spark_integration/spark/state/schema.py checks a change for compatibility). The
coordinator only stores it, under a revision that a change must name (a compare-and-set),
so two drivers cannot both register a change. ``drop_operator`` removes it with the
operator (its ``state_schema:<operator>`` entry).
"""

from __future__ import annotations

import json

from ..errors import BusyError, InvalidArgumentError
from .metadata import Metadata

__all__ = ["load", "replace_if_at"]

_KEY = "state_schema:"  # + operator id, in the metadata's key-value table


def load(meta: Metadata, operator_id: str) -> dict:
    """``{"revision", "doc"}``: the document and its revision (0 and None: none yet)."""
    meta.require_operator(operator_id)
    got = meta.get_meta(_KEY + operator_id)
    return json.loads(got) if got else {"revision": 0, "doc": None}


def replace_if_at(meta: Metadata, operator_id: str, doc: dict, revision: int) -> dict:
    """Stores ``doc`` if the document is still at ``revision``; answers the new revision.
    REQUIRES: the coordinator's lock."""
    if not isinstance(doc, dict):
        raise InvalidArgumentError("the state schema document must be a JSON object")
    cur = load(meta, operator_id)
    if cur["revision"] != revision:
        raise BusyError(f"operator {operator_id}: the state schema is at revision {cur['revision']}, not "
                        f"{revision} (another driver changed it): read it again")
    with meta.tx() as c:
        meta.set_meta(c, _KEY + operator_id, json.dumps({"revision": revision + 1, "doc": doc}))
    return {"revision": revision + 1}
