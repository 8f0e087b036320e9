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

    def coordinator(self) -> Any:
        if self.client is None:
            from rhino.coordinator.client import connect_coordinator

            self.client = connect_coordinator(self.config.coordinator, secret=self.config.secret,
                                              tls=for_host(self.config.tls, this_host()))
        return self.client

    def ensure_created(self, in_schema: Any) -> dict:
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
            self.state_doc = self._register_state(in_schema)
        return self.state_doc

    def _register_state(self, in_schema: Any) -> dict:
        """The state variables ``init`` declares, registered at the coordinator (ids, schema
        versions); an incompatible change is refused here, before any batch runs
        (``state/variables.py``)."""
        from pyspark.sql.types import StructType

        from ..state.variables import declared_variables, resolve_schema_doc

        c = self.config
        declared = declared_variables(c.processor)
        ttl = sorted(n for n, d in declared.items() if d.ttl_ms is not None)
        if ttl and c.time_mode != "processingtime":
            # Spark refuses the same (CANNOT_ASSIGN_TTL_IN_TIME_MODE): TTL runs on batch time
            raise InvalidArgumentError(f"state {ttl[0]!r} has a TTL, which needs time_mode='ProcessingTime' "
                                       f"(this operator runs with time mode {c.time_mode!r}), as in Spark")
        grouping = StructType([in_schema[k] for k in c.key_columns])
        for _ in range(SCHEMA_ROUNDS):
            cur = self.coordinator().state_schema(c.operator_id)
            doc, changed = resolve_schema_doc(cur["doc"], declared, grouping_key=grouping)
            if not changed:
                return doc
            try:
                self.coordinator().set_state_schema(c.operator_id, doc, cur["revision"])
                return doc
            except BusyError:  # another driver changed it meanwhile: read it again
                continue
        raise InvalidArgumentError(f"operator {c.operator_id}: the state schema kept changing under this "
                                   "driver (another driver of the same operator?)")

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
