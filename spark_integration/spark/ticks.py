"""Micro-batches for a quiet stream: timers fire when no input arrives.

Spark runs a micro-batch when a source has new data, or, with no new data, when
a stateful operator of the query asks for one (``shouldRunAnotherBatch``):
Spark's own ``transformWithState`` asks every trigger in processing time, and
whenever the watermark has advanced in event time. A Rhino operator runs inside
``foreachBatch``, where Spark sees no stateful operator, so a quiet stream runs no
batch, and due timers wait for the next input.

:func:`with_ticks` gives Spark's micro-batch engine the reason it needs, in the
engine's own terms: the stream is unioned with Spark's ``rate`` source, whose
offset advances every second, filtered to no rows. A trigger then finds new data
at least once a second, so the query runs a batch at every trigger interval (or
once a second, whichever is longer) even when the real input is quiet. Such a
batch has no rows; the operator runs it like any other (the watermark from the
batches before, the batch's own time), so the timers that are due fire in it,
and its output goes to the sink with its batch id: nothing is written outside a
batch.

Since the rate branch has no rows, what reaches ``foreachBatch`` is exactly the
input stream's rows; its checkpoint records the rate source's offsets too, so add
ticks when a query is first started, not to a query restarted from a checkpoint
made without them (Spark refuses a changed set of sources).
"""

from __future__ import annotations

from typing import Any

from rhino.errors import InvalidArgumentError

__all__ = ["with_ticks"]


def with_ticks(stream: Any) -> Any:
    """``stream`` (a streaming DataFrame) with a batch at every trigger, quiet or not: see the
    module's docstring. Use it as the query's input::

        rhino.spark.with_ticks(spark.readStream...).writeStream.foreachBatch(op.for_each_batch(sink))
    """
    from pyspark.sql import functions as F

    if not getattr(stream, "isStreaming", False):
        raise InvalidArgumentError("with_ticks needs a streaming DataFrame (spark.readStream...), "
                                   f"not {type(stream).__name__}")
    ticks = (stream.sparkSession.readStream.format("rate").option("rowsPerSecond", 1)
             .option("numPartitions", 1).load())
    # No rows: only the rate source's offsets matter (they make the batch). The columns are the
    # stream's own, as nulls, so the union has the stream's schema.
    empty = ticks.where(F.lit(False)).select(*[F.lit(None).cast(f.dataType).alias(f.name)
                                               for f in stream.schema.fields])
    return stream.unionByName(empty)
