"""The Spark layer's own error (the library's are in :mod:`rhino.errors`)."""

from __future__ import annotations

from rhino.errors import InvalidArgumentError, RhinoError

__all__ = ["InputLostError", "FreshCheckpointError", "output_lost"]


class FreshCheckpointError(InvalidArgumentError):
    """A query's first batch does not follow its operator's committed batches: it started
    from a fresh (or an older) Spark checkpoint on an operator that has state, or from an
    old checkpoint on an operator that has none (issue 45). Nothing ran. To start over,
    drop the operator first (``rhino drop``); to keep its state, restart from the query's
    own checkpoint location (docs/spark.md, "Operators: namespaces, a fresh start, drop")."""


class InputLostError(RhinoError):
    """An operator's input was the output of another operator (``transform``), and part of
    it was lost with an executor (Spark's ``CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND``): its lineage
    ends at its checkpoint, so Spark cannot compute it again and running this operator again
    cannot help. Nothing was committed. Run the chain again from its first operator (each
    runs the batch again from b-1, the one that had committed it as a replay): see
    docs/spark.md, "One micro-batch"."""


def output_lost(e: BaseException) -> bool:
    """True if a job failed because blocks of a materialized output were lost with their
    executor, ours or (reported as :class:`InputLostError`) an upstream operator's."""
    from rhino.engine import checkpoint_blocks_lost

    return isinstance(e, InputLostError) or checkpoint_blocks_lost(str(e))
