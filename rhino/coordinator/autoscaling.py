"""An operator's autoscaling as the coordinator runs it: its settings and decisions kept
in the metadata, and the policy (:mod:`.autoscaler`) applied after each commit.

``rhino autoscale`` (the coordinator's ``autoscale``) turns it on or off. From then on
every ``commit_batch`` with a report is decided on, and a rescale the policy asks for is
planned with the Handover Manager, to run at the operator's next barriers. The
metadata's ``autoscale:<operator>`` entry holds the settings, the policy's state, the
last decision and the last rescale decisions, so a restarted coordinator goes on with
them, and ``drop_operator`` removes them with the operator.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from typing import Any, Callable, Optional

from ..errors import InvalidArgumentError, RhinoError
from .autoscaler import DECISIONS_KEPT, AutoscaleSettings, Autoscaler
from .gateway import WorkerGateway
from .handover_manager import HandoverManager
from .metadata import Metadata

__all__ = ["Autoscaling"]

logger = logging.getLogger("rhino.coordinator")

_KEY = "autoscale:"  # + operator id: the metadata's entry of its autoscaling (JSON)


class Autoscaling:
    """The operators' autoscaling over the metadata. Every method REQUIRES the
    coordinator's lock."""

    def __init__(self, meta: Metadata, workers: WorkerGateway, hm: HandoverManager,
                 log: Callable[..., None]) -> None:
        self.meta = meta
        self.workers = workers
        self.hm = hm
        self.log = log

    def configure(self, operator_id: str, enabled: bool, min_parallelism: Optional[int],
                  max_parallelism: Optional[int], **policy: Any) -> Optional[dict]:
        """Turns the operator's autoscaler on or off (the coordinator's ``autoscale``, which
        documents the arguments); ``policy`` holds the other settings of
        :class:`.AutoscaleSettings`. Answers :meth:`status`."""
        op = self.meta.require_operator(operator_id)
        doc = self._doc(operator_id) or {}
        old = doc.get("settings") or {}
        if not isinstance(enabled, bool):
            raise InvalidArgumentError(f"autoscale: enabled must be true or false, got {enabled!r}")
        if min_parallelism is None or max_parallelism is None:
            if enabled or not old:
                raise InvalidArgumentError("autoscale: min_parallelism and max_parallelism are needed to turn "
                                           "autoscaling on")
            settings = AutoscaleSettings(**dict(old, enabled=False))
        else:
            settings = AutoscaleSettings(enabled=enabled, min_parallelism=min_parallelism,
                                         max_parallelism=max_parallelism, **policy)
        settings.check(op.num_vnodes)
        doc["settings"] = asdict(settings)
        with self.meta.tx() as c:
            self.meta.set_meta(c, _KEY + operator_id, json.dumps(doc))
            self.meta.event(c, "autoscale_set", operator=operator_id, **doc["settings"])
        self.log("autoscale_set", operator=operator_id, **doc["settings"])
        logger.info("operator %s: autoscaling %s: %s", operator_id, "on" if settings.enabled else "off",
                    doc["settings"])
        return self.status(operator_id)

    def _doc(self, operator_id: str) -> Optional[dict]:
        """The operator's autoscaling in the metadata: ``settings``, the policy's ``state``,
        the ``last`` decision and the last rescale ``decisions``; None if never set."""
        got = self.meta.get_meta(_KEY + operator_id)
        return json.loads(got) if got else None

    def status(self, operator_id: str) -> Optional[dict]:
        """The operator's autoscaling as ``status`` shows it (None: never set)."""
        doc = self._doc(operator_id)
        if doc is None:
            return None
        st = doc.get("settings") or {}
        return {"enabled": bool(st.get("enabled")), "settings": st, "last": doc.get("last"),
                "decisions": doc.get("decisions") or []}

    def after_commit(self, operator_id: str, batch: int, rep: Any) -> Optional[dict]:
        """The autoscaler's decision on the report of ``batch``, just committed, and its
        rescale planned if it asks for one. Never raises: the batch is committed already; a
        failure is logged and answered as ``error``."""
        doc = self._doc(operator_id)
        if doc is None or not (doc.get("settings") or {}).get("enabled"):
            return None
        try:
            return self._decide(operator_id, batch, rep, doc)
        except Exception as e:  # noqa: BLE001 - the commit stands whatever the autoscaler does
            err = f"{type(e).__name__}: {e}"
            self.log("autoscale_failed", operator=operator_id, batch=batch, error=err)
            logger.exception("operator %s batch %d: autoscaler failed", operator_id, batch)
            return {"batch": batch, "action": "hold", "error": err}

    def _decide(self, operator_id: str, batch: int, rep: Any, doc: dict) -> dict:
        settings = AutoscaleSettings(**doc["settings"])
        policy = Autoscaler(settings, doc.get("state"))
        hm = self.hm
        usable = self.workers.alive_ids() - self.workers.draining()
        d = policy.observe(rep, batch=batch, parallelism=len(self.meta.instances(operator_id)),
                           plan_open=hm.open_plan(operator_id) is not None,
                           workers_available=len(usable), now=time.time())
        out = d.doc()
        if d.rescale:
            try:
                plan = hm.plan_rescale(operator_id, d.to, strategy=settings.strategy, after_batch=None)
                out["plan"] = plan["plan"]
            except RhinoError as e:
                out["error"] = f"{type(e).__name__}: {e}"
        doc["state"], doc["last"] = policy.to_doc(), out
        if d.rescale:
            doc["decisions"] = ((doc.get("decisions") or []) + [out])[-DECISIONS_KEPT:]
        with self.meta.tx() as c:
            self.meta.set_meta(c, _KEY + operator_id, json.dumps(doc))
            if d.rescale:  # the event has its own time
                self.meta.event(c, "autoscale_decision", operator=operator_id,
                                **{k: v for k, v in out.items() if k != "at"})
        if d.rescale:
            self.log("autoscale_decision", operator=operator_id, **{k: v for k, v in out.items() if k != "at"})
            logger.info("operator %s batch %d: autoscaler: %s%s", operator_id, batch, d.reason,
                        f" (plan #{out['plan']})" if "plan" in out else f"; not planned: {out.get('error')}")
        else:
            logger.debug("operator %s batch %d: autoscaler: hold: %s", operator_id, batch, d.reason)
        return out
