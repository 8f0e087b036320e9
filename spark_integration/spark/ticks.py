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
input stream's rows. The query's checkpoint records the rate source's offsets too,
and Spark refuses to restart a checkpoint with another number of sources ("There
are [1] sources in the checkpoint offsets and now there are [2]"). So a query that
first ran without ticks gains them with ``checkpoint_location``: its checkpoint's
offset log gets the rate source's starting offset appended to each batch's entry,
through Spark's own Hadoop filesystem (any filesystem Spark checkpoints to), before
the query restarts. Spark's own operator needs no such step: it asks for its
no-data batches itself once it has run a batch since its (re)start (issue 45).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from rhino.errors import InvalidArgumentError

__all__ = ["with_ticks"]

log = logging.getLogger("rhino.spark")

_OFFSET_LOG_VERSION = "v1"  # the offset log's format this module appends to (Spark 3.x, 4.x)
_TICKS_START = "0"  # the rate source's first offset (a LongOffset's JSON)


def with_ticks(stream: Any, *, checkpoint_location: Optional[str] = None) -> Any:
    """``stream`` (a streaming DataFrame) with a batch at every trigger, quiet or not: see the
    module's docstring. Use it as the query's input::

        rhino.spark.with_ticks(spark.readStream...).writeStream.foreachBatch(op.for_each_batch(sink))

    ``checkpoint_location``: the query's checkpoint (``writeStream``'s option). Given, a
    checkpoint made without ticks is made ready for them (its offset log gains the ticks'
    starting offset), so a query can gain quiet-stream batches after its first start; one
    made with them, or none yet, is left as it is.
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
    ticked = stream.unionByName(empty)
    if checkpoint_location is not None:
        from .driver.watermark import HadoopFiles

        adopt_ticks(HadoopFiles(stream.sparkSession, checkpoint_location), checkpoint_location, _sources(ticked))
    return ticked


def _sources(df: Any) -> int:
    """The number of streaming sources of a streaming DataFrame's plan (its streaming leaves)."""
    leaves = df._jdf.queryExecution().logical().collectLeaves()
    return sum(1 for i in range(leaves.size()) if leaves.apply(i).isStreaming())


def adopt_ticks(files: Any, location: str, sources: int) -> list[int]:
    """Appends the ticks' starting offset to each entry of the checkpoint's offset log that
    has one source fewer than the ticked query (the ticks' rate source is its last source,
    as ``unionByName`` puts it). Idempotent: an entry with as many sources is left alone,
    and one with another count is left for Spark to refuse with its own message. ``files``: the
    checkpoint's files (driver/watermark.py's ``HadoopFiles``, or ``LocalFiles``). Answers the
    batches whose entries gained the ticks."""
    adopted: list[int] = []
    for name in sorted((n for n in files.list("offsets") if n.isdigit()), key=int):
        data = files.read(f"offsets/{name}")
        if data is None:
            continue
        lines = data.decode("utf-8").rstrip("\n").split("\n")
        if not lines or lines[0] != _OFFSET_LOG_VERSION:
            raise InvalidArgumentError(f"with_ticks: {location}/offsets/{name} is of offset log format "
                                       f"{lines[0] if lines else '(empty)'!r}, not {_OFFSET_LOG_VERSION!r}: "
                                       "ticks cannot be added to this checkpoint")
        if len(lines) - 2 == sources - 1:  # the version line, the batch's metadata, one line per source
            files.write_new(f"offsets/{name}", ("\n".join(lines + [_TICKS_START])).encode("utf-8"))
            adopted.append(int(name))
    if adopted:
        log.warning("rhino.spark.with_ticks: the checkpoint at %s was made without ticks; its offset log "
                    "now has the ticks' source (batches %d..%d), so the query can restart with them",
                    location, adopted[0], adopted[-1])
    return adopted
