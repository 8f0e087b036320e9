"""A processor swap: an operator's code replaced at a batch barrier, its state kept
(issue 47; Bartnik et al. §4.3: a UDF replaced on an external trigger at a
checkpoint-aligned cut, exactly once).

A swap is asked for from the driver's own code (``op.swap(processor)``, from any
thread) or from outside (``rhino swap``: a request in the operator's state schema
document naming importable code, :func:`request_from_doc`). It is checked when asked
(the new processor's state variables against the operator's: an incompatible change is
refused there, and the old processor goes on) and takes effect at the next batch
barrier b, before batch b's first task (``Control.swap_to``):

1. the new code's variables are registered as a driver's start registers them; the
   variables it no longer declares are marked removed in b (``state/variables.py``),
   and every instance's task of b deletes their entries;
2. the new version is recorded in force from b (``driver/code_version.py``): an
   attempt of b that runs again, in this driver or a restarted one, runs the new code;
3. the operator's config (processor, output schema, version) is replaced: b's tasks
   get the new one with their attempt, and the sink sees the new output schema from b.

Timers carry over as they are: they belong to the key, not to the processor.

A swap may carry a per-key **migration**, for a change the schema rules cannot express:
``migrate(key, old, processor)`` runs in every instance's task of batch b, once per key
with state there, before b's input: ``old`` maps each variable of the code before the
swap to its state for the key (read as the old code wrote it), and the new processor's
own variables (got in its ``init``) are the key's, to write, as in ``handleInitialState``.
It runs again, from b-1's state, if b runs again; the variables the swap removes are
deleted after it. The code history names the swap's old variables, so a driver restarted
in batch b runs the same migration (it must be given ``migrate=`` again, or is refused).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from rhino.errors import InvalidArgumentError

__all__ = ["Swap", "load_processor", "request_from_doc"]

log = logging.getLogger("rhino.spark")


@dataclass(eq=False)
class Swap:
    """One swap request and, once the barrier took it, where it took effect."""

    processor: Any
    output_schema: Any  # a StructType; None: the operator's, unchanged
    code_version: str
    request: Optional[str] = None  # an external request's id (``rhino swap``); None: op.swap's
    migrate: Any = None  # migrate(key, old, processor), once per key with state in the swap's batch
    requested_at: float = field(default_factory=time.time)
    batch: Optional[int] = None  # the batch from which the new code runs
    applied_at: Optional[float] = None
    previous_version: Optional[str] = None
    error: Optional[BaseException] = None  # refused at the barrier: the old code went on
    _done: threading.Event = field(default_factory=threading.Event, repr=False)

    def took_effect(self, batch: int, previous: str) -> None:
        self.batch, self.previous_version, self.applied_at = int(batch), previous, time.time()
        self._done.set()

    def refused(self, error: BaseException) -> None:
        self.error, self.applied_at = error, time.time()
        self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: Optional[float] = None) -> int:
        """The batch from which the new code runs, once a barrier took the swap; raises the
        refusal if it was refused, TimeoutError if no barrier came in ``timeout`` s."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the swap to {self.code_version} has not reached a batch barrier in {timeout} s")
        if self.error is not None:
            raise self.error
        assert self.batch is not None
        return self.batch

    def to_dict(self) -> dict:
        return {"code_version": self.code_version, "previous_version": self.previous_version, "batch": self.batch,
                "requested_at": self.requested_at, "applied_at": self.applied_at, "request": self.request,
                "error": None if self.error is None else str(self.error)}


def load_processor(code: str, args: Optional[dict] = None) -> Any:
    """``package.module:Class`` (or ``:factory``), called with ``args`` as keywords: the
    processor an external request names. The module is imported on the driver; the
    executors get the processor as PySpark ships code (cloudpickle, by reference: the
    module must be importable there too, installed or shipped with ``addPyFile`` /
    ``spark.archives``)."""
    if not isinstance(code, str) or code.count(":") != 1:
        raise InvalidArgumentError(f"code must be 'package.module:Class', not {code!r}")
    mod_name, attr = code.split(":")
    try:
        obj: Any = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise InvalidArgumentError(f"cannot load {code}: {type(e).__name__}: {e}") from None
    if not callable(obj):
        raise InvalidArgumentError(f"{code} is not a class or a function")
    if args is not None and not isinstance(args, dict):
        raise InvalidArgumentError(f"the arguments of {code} must be a JSON object, not {type(args).__name__}")
    try:
        return obj(**(args or {}))
    except Exception as e:  # noqa: BLE001 - the user's constructor: any error refuses the swap
        raise InvalidArgumentError(f"{code}(**{args!r}) failed: {type(e).__name__}: {e}") from None


def request_from_doc(doc: Optional[dict]) -> Optional[dict]:
    """The external swap request waiting in the document, if any (``rhino swap`` puts it
    there: ``rhino/cli/swap.py``)."""
    req = (doc or {}).get("swap_request")
    return req if isinstance(req, dict) and isinstance(req.get("id"), str) else None
