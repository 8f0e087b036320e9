"""``rhino swap``: replace a running operator's processor at its next batch barrier,
from outside its driver (issue 47; Bartnik et al. §4.3's external trigger).

The request names importable code (``package.module:Class``, with keyword arguments as a
JSON object) and goes into the operator's state schema document at the coordinator
(``"swap_request"``, a compare-and-set like every change of it). The operator's driver
reads the document at each batch barrier, loads the code, checks its state variables
against the operator's, and either puts it in force from that batch (the code history's
entry names the request) or refuses it (``"swap_refused"``, the old code goes on).
With ``--wait``, this command waits for one or the other and says which. The module
must be importable on the driver and on the executors, as any PySpark code
(installed, or shipped with ``addPyFile`` / ``spark.archives``).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any, Optional

from ..errors import BusyError, InvalidArgumentError, NotFoundError, RhinoError, RhinoTimeoutError
from .control import _common, _run

__all__ = ["main_swap", "SwapRefusedError"]

ROUNDS = 5  # compare-and-set rounds against a driver changing the document meanwhile


class SwapRefusedError(RhinoError):
    """The operator's driver refused the swap at its barrier; the old code goes on."""


def request(code: str, args: Optional[dict], output_schema: Optional[str], code_version: Optional[str]) -> dict:
    """The request as the driver reads it (``rhino.spark.driver.swap.request_from_doc``)."""
    if code.count(":") != 1 or not all(code.split(":")):
        raise InvalidArgumentError(f"CODE must be 'package.module:Class', not {code!r}")
    return {"id": uuid.uuid4().hex, "code": code, "args": dict(args or {}), "output_schema": output_schema,
            "code_version": code_version, "at": round(time.time(), 3)}


def put_request(c: Any, op: str, req: dict, *, replace: bool = False) -> None:
    """Puts ``req`` in the operator's state schema document, for its driver's next barrier."""
    for _ in range(ROUNDS):
        cur = c.state_schema(op)
        doc = cur["doc"]
        if doc is None:
            raise NotFoundError(f"operator {op} has no state schema yet: no driver has run a batch of it, so "
                                "there is no running code to swap (start the query with the new code)")
        waiting = doc.get("swap_request")
        if waiting and not replace:
            raise BusyError(f"operator {op}: swap request {waiting.get('id')} ({waiting.get('code')}) is still "
                            "waiting for a batch barrier; pass --replace to replace it")
        doc["swap_request"] = req
        try:
            c.set_state_schema(op, doc, cur["revision"])
            return
        except BusyError:  # the driver changed the document meanwhile (a batch's barrier): again
            continue
    raise BusyError(f"operator {op}: its state schema kept changing; try again")


def outcome(doc: Optional[dict], req_id: str) -> Optional[dict]:
    """``{"batch", "version"}`` once the request took effect, ``{"error"}`` once refused, else None."""
    for e in (doc or {}).get("code") or ():
        if e.get("request") == req_id:
            return {"batch": e["from_batch"], "version": e["version"]}
    refused = (doc or {}).get("swap_refused") or {}
    if refused.get("id") == req_id:
        return {"error": refused.get("error"), "batch": refused.get("batch")}
    return None


def main_swap(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="rhino swap",
        description="Replace a running operator's processor at its next batch barrier, its state kept by state "
                    "variable name: a variable the new processor adds starts empty, one it no longer declares is "
                    "removed in that batch, an incompatible change is refused and the old processor goes on. "
                    "The driver loads CODE (importable on the driver and the executors).")
    _common(p)
    p.add_argument("operator", metavar="OPERATOR", help="the operator's name (in --namespace)")
    p.add_argument("code", metavar="CODE", help="the new processor: package.module:Class")
    p.add_argument("--namespace", default=None, metavar="NS", help="the operator's namespace")
    p.add_argument("--args", default="{}", metavar="JSON", help="keyword arguments of CODE, a JSON object")
    p.add_argument("--output-schema", default=None, metavar="DDL", dest="output_schema",
                   help="the new output schema (default: unchanged)")
    p.add_argument("--code-version", default=None, metavar="NAME", dest="code_version",
                   help="the new code's version name (default: its fingerprint)")
    p.add_argument("--replace", action="store_true", help="replace a request still waiting for a barrier")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait this long for the barrier that takes or refuses it (default: do not wait)")

    def swap(c: Any, a: argparse.Namespace) -> Any:
        from ..coordinator.naming import operator_id

        try:
            kwargs = json.loads(a.args)
        except json.JSONDecodeError as e:
            raise InvalidArgumentError(f"--args is not JSON: {e}") from None
        if not isinstance(kwargs, dict):
            raise InvalidArgumentError("--args must be a JSON object (the keyword arguments)")
        op = operator_id(a.operator, a.namespace)
        req = request(a.code, kwargs, a.output_schema, a.code_version)
        put_request(c, op, req, replace=a.replace)
        out: dict = {"operator_id": op, "request": req["id"], "code": a.code}
        deadline = time.monotonic() + a.wait
        while a.wait > 0:
            got = outcome(c.state_schema(op)["doc"], req["id"])
            if got is not None and "error" in got:
                raise SwapRefusedError(f"operator {op} refused {a.code} at batch {got['batch']}, and goes on with "
                                       f"its code: {got['error']}")
            if got is not None:
                out.update(got)
                break
            if time.monotonic() > deadline:
                raise RhinoTimeoutError(f"operator {op}: no batch barrier took request {req['id']} in {a.wait:g} s "
                                        "(is its query running?); the request stays for its next barrier")
            time.sleep(0.2)
        if a.json:
            return out
        if "batch" in out:
            return f"operator {op} runs {a.code} ({out['version']}) from batch {out['batch']}"
        return f"asked operator {op} to swap to {a.code} at its next batch barrier (request {req['id']})"

    return _run(p, argv, swap)
