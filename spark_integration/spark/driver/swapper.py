"""The operator's swaps, from being asked for to the barrier that takes them
(``driver/swap.py`` says what a swap does; issue 47).

:class:`Swapper` keeps the swaps asked for since the last barrier, and the batch
runner calls :meth:`Swapper.barrier` before each batch's first attempt. There the
driver's own swaps, then an external request (``rhino swap``), take effect in order,
and a swap recorded in batch b by a driver that died in it has its per-key migration
run again.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, Callable, Optional

from rhino.errors import InvalidArgumentError

from .code_version import CodeVersionError, in_force
from .config import OperatorConfig, checked_code_version
from .swap import Swap, load_processor, request_from_doc

__all__ = ["Swapper"]

log = logging.getLogger("rhino.spark")


class Swapper:
    """The swaps of one operator (``op``: its ``TransformWithState``, whose config a swap replaces)."""

    def __init__(self, op: Any) -> None:
        self.op = op
        self._lock = threading.Lock()
        self._pending: list[Swap] = []
        self.swaps: list[Swap] = []  # those a barrier took or refused, in order

    def ask(self, processor: Any, output_schema: Any, code_version: Optional[str],
            migrate: Optional[Callable[[tuple, dict, Any], None]]) -> Swap:
        """Checks a swap now (an incompatible state variable raises) and keeps it for the next barrier."""
        if migrate is not None and not callable(migrate):
            raise InvalidArgumentError(f"migrate must be a function (key, old, processor), not {migrate!r}")
        new = self._config_with(processor, output_schema, code_version)
        self.op.control.check_swap(new)
        swap = Swap(processor, new.output_schema, new.code_version, migrate=migrate)
        with self._lock:
            self._pending.append(swap)
        log.info("rhino.spark %s: swap to %s asked for; it takes effect at the next batch barrier",
                 self.op.operator_id, swap.code_version)
        return swap

    def _config_with(self, processor: Any, output_schema: Any, code_version: Optional[str]) -> OperatorConfig:
        from pyspark.sql.types import StructType

        if not hasattr(processor, "init") or not hasattr(processor, "handleInputRows"):
            raise InvalidArgumentError(f"{type(processor).__name__} is not a StatefulProcessor (no init or "
                                       "handleInputRows)")
        config = self.op.config
        schema = config.output_schema if output_schema is None else (
            StructType.fromDDL(output_schema) if isinstance(output_schema, str) else output_schema)
        return dataclasses.replace(config, processor=processor, output_schema=schema,
                                   code_version=checked_code_version(processor, code_version),
                                   migrate=None, migrate_batch=None, migrate_from=None)

    def barrier(self, b: int) -> None:
        """Batch ``b``'s barrier (before its first attempt): the swaps asked for since the
        last one, then an external request (``rhino swap``), take effect in order."""
        with self._lock:
            pending, self._pending = self._pending, []
        self._migration_at(b)
        control = self.op.control
        req = request_from_doc(control.read_doc())
        if req is not None:
            try:
                proc = load_processor(req["code"], req.get("args"))
                new = self._config_with(proc, req.get("output_schema"), req.get("code_version"))
                pending.append(Swap(proc, new.output_schema, new.code_version, request=req["id"]))
            except Exception as e:  # noqa: BLE001 - any failure to load refuses the request
                log.error("rhino.spark %s batch %d: swap request %s (%s) refused: %s", self.op.operator_id, b,
                          req["id"], req.get("code"), e)
                control.refuse_request(self.op.config, b, req, e)
        for swap in pending:
            self._take(swap, b)

    def _migration_at(self, b: int) -> None:
        """The per-key migration of batch ``b``'s swap, if it has one: ours (a swap of this
        driver) stays until the batch is past; a swap recorded at ``b`` by a driver that died
        in it is run again with ``migrate=`` given to this one (CodeVersionError without)."""
        c = self.op.config
        if c.migrate_batch is not None and c.migrate_batch < b:
            self.op.set_config(dataclasses.replace(c, migrate_batch=None, migrate_from=None))
            return
        e = in_force(self.op.control.state_doc, b)
        if c.migrate_batch == b or e is None or int(e["from_batch"]) != b or "migrate_from" not in e:
            return
        if c.migrate is None:
            raise CodeVersionError(f"operator {c.operator_id}: batch {b} is the batch of the swap to {e['version']}, "
                                   "which migrates each key's state, and it did not commit: restart this driver with "
                                   "the same migrate= function, so that the batch runs as it first did")
        self.op.set_config(dataclasses.replace(c, migrate_batch=b, migrate_from=e["migrate_from"]))

    def _take(self, swap: Swap, b: int) -> None:
        op = self.op
        new = self._config_with(swap.processor, swap.output_schema, swap.code_version)
        old_vars = (op.control.state_doc or {}).get("vars") or {}
        if swap.migrate is not None:
            new = dataclasses.replace(new, migrate=swap.migrate, migrate_batch=b, migrate_from=old_vars)
        try:
            op.control.swap_to(new, b, request=swap.request,
                               migrate_from=old_vars if swap.migrate is not None else None)
        except Exception as e:  # noqa: BLE001 - refused at the barrier: the old code goes on
            log.error("rhino.spark %s batch %d: swap to %s refused, %s goes on: %s", op.operator_id, b,
                      swap.code_version, op.code_version, e)
            if swap.request is not None:
                op.control.refuse_request(op.config, b, {"id": swap.request}, e)
            swap.refused(e)
            self.swaps.append(swap)
            return
        prev = op.code_version
        op.set_config(new)
        op.runner.swapped_from[b] = prev
        swap.took_effect(b, prev)
        self.swaps.append(swap)
        log.warning("rhino.spark %s: swapped %s -> %s from batch %d, state kept (%.3f s after the request)",
                    op.operator_id, prev, new.code_version, b, swap.applied_at - swap.requested_at)
