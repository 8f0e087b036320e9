"""The operator's side of the control plane: its coordinator connection, the operator's
creation, and the registration of its state variables (design §2.1, §8)."""

from __future__ import annotations

import logging
from typing import Any, Optional

from rhino.errors import BusyError, InvalidArgumentError
from rhino.tls.config import for_host

from ..runtime.connections import this_host
from .config import OperatorConfig

__all__ = ["Control"]

# Rounds of read-resolve-write of the state schema before giving up (another driver of the
# same operator changing it each time).
SCHEMA_ROUNDS = 5

log = logging.getLogger("rhino.spark")


class Control:
    """A lazily connected coordinator client, and the operator it creates once."""

    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.client: Any = None  # a rhino.coordinator.client connection (tests may wrap it)
        self.state_doc: Optional[dict] = None  # the state schema document, read at the first batch
        # the operator's instance count at the coordinator when this driver created it (None
        # before): config.parallelism is only the initial one (issue 45)
        self.parallelism: Optional[int] = None
        # the operator's last committed batch when this driver created it (None: none yet)
        self.last_batch: Optional[int] = None
        self.grouping: Any = None  # the StructType of the grouping key's columns (at the first batch)

    def coordinator(self) -> Any:
        if self.client is None:
            from rhino.coordinator.client import connect_coordinator

            self.client = connect_coordinator(self.config.coordinator, secret=self.config.secret,
                                              tls=for_host(self.config.tls, this_host()))
        return self.client

    def ensure_created(self, in_schema: Any, first_batch: int = 0) -> dict:
        """Creates the operator and registers its state; returns the state schema document.
        Once per driver.

        An operator that exists is taken as it is at the coordinator: the config's
        parallelism is the initial one, and after a rescale (a person's or the
        autoscaler's) the driver runs at the coordinator's instance count, and says so
        (issue 45). Every batch routes by the placement it is given, never by the config."""
        if self.state_doc is None:
            c = self.config
            copies = {k: getattr(c, k) for k in ("min_copies", "min_copies_strict", "min_copies_wait_s")
                      if getattr(c, k) is not None}
            pl = self.coordinator().create_operator(c.operator_id, parallelism=c.parallelism,
                                                    num_vnodes=c.num_vnodes, replicas=c.replicas,
                                                    placement=c.placement, **copies)
            self.parallelism = len(pl.instances)
            self.last_batch = pl.last_batch
            if self.parallelism != c.parallelism:
                log.warning("rhino.spark %s: the operator runs at the coordinator's parallelism %d, not the "
                            "code's %d (the code's is the initial one; it was rescaled since)",
                            c.operator_id, self.parallelism, c.parallelism)
            from pyspark.sql.types import StructType

            self.grouping = None if in_schema is None else StructType([in_schema[k] for k in c.key_columns])
            self.state_doc = self._register(c, first_batch, start=True)
        return self.state_doc

    def _register(self, c: OperatorConfig, b: int, *, start: bool, request: Optional[str] = None,
                  refused: Optional[dict] = None, migrate_from: Optional[dict] = None) -> dict:
        """Registers ``c``'s code from batch ``b`` at the coordinator, in one compare-and-set
        of the state schema document: the state variables its ``init`` declares (ids, schema
        versions; an incompatible change is refused here, before the batch runs:
        ``state/variables.py``) and its code version (``code_version.py``). A version new to
        the operator comes into force at ``b``; there, the variables it no longer declares are
        removed. ``start``: a driver's first batch, where an older version is refused.
        ``request``/``refused``: the external swap request taken or refused (``swap.py``)."""
        from ..state.variables import resolve_schema_doc
        from .code_version import check_version, in_force, record

        declared = _declared(c)
        for _ in range(SCHEMA_ROUNDS):
            cur = self.coordinator().state_schema(c.operator_id)
            new = check_version(cur["doc"], c.code_version, c.operator_id) if start else True
            # an operator with no code history (none yet, or made before there was one) drops nothing
            drop_at = b if new and in_force(cur["doc"]) is not None else None
            doc, changed = resolve_schema_doc(cur["doc"], declared, grouping_key=self.grouping,
                                              drop_undeclared_at=drop_at)
            if new:
                record(doc, c.code_version, c.processor, b, request, migrate_from)
                changed = True
            if request is not None or refused is not None:
                doc.pop("swap_request", None)
                if refused is not None:
                    doc["swap_refused"] = refused
                changed = True
            if not changed:
                return doc
            try:
                self.coordinator().set_state_schema(c.operator_id, doc, cur["revision"])
                return doc
            except BusyError:  # another driver (or rhino swap) changed it meanwhile: read it again
                continue
        raise InvalidArgumentError(f"operator {c.operator_id}: the state schema kept changing under this "
                                   "driver (another driver of the same operator?)")

    def check_swap(self, c: OperatorConfig) -> None:
        """Raises what registering ``c``'s code would (an incompatible state variable, a
        TTL in the wrong time mode), without registering it: a swap is refused when it is
        asked for, while the old code goes on. Nothing to check against before the
        operator's first batch (its state schema is read then)."""
        from ..state.variables import resolve_schema_doc

        declared = _declared(c)
        if self.state_doc is not None:
            resolve_schema_doc(self.coordinator().state_schema(c.operator_id)["doc"], declared,
                               grouping_key=self.grouping, drop_undeclared_at=0)

    def swap_to(self, c: OperatorConfig, b: int, request: Optional[str] = None,
                migrate_from: Optional[dict] = None) -> dict:
        """Puts ``c``'s code in force from batch ``b`` (``swap.py``'s steps 1-2); returns
        the new state schema document. Raises (and changes nothing) if it is refused."""
        self.state_doc = self._register(c, b, start=False, request=request, migrate_from=migrate_from)
        return self.state_doc

    def refuse_request(self, c: OperatorConfig, b: int, request: dict, error: BaseException) -> None:
        """Records an external swap request's refusal in the document, for ``rhino swap`` to
        show; the operator's code is unchanged."""
        refused = {"id": request.get("id"), "batch": b, "error": f"{type(error).__name__}: {error}"}
        self.state_doc = self._register(c, b, start=True, refused=refused)

    def read_doc(self) -> dict:
        """The state schema document as the coordinator has it now."""
        return self.coordinator().state_schema(self.config.operator_id)["doc"] or {}

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def _declared(c: OperatorConfig) -> dict:
    """The state variables ``c``'s processor declares in ``init``, with Spark's checks."""
    from ..state.variables import declared_variables

    declared = declared_variables(c.processor)
    ttl = sorted(n for n, d in declared.items() if d.ttl_ms is not None)
    if ttl and c.time_mode != "processingtime":
        # Spark refuses the same (CANNOT_ASSIGN_TTL_IN_TIME_MODE): TTL runs on batch time
        raise InvalidArgumentError(f"state {ttl[0]!r} has a TTL, which needs time_mode='ProcessingTime' "
                                   f"(this operator runs with time mode {c.time_mode!r}), as in Spark")
    return declared
