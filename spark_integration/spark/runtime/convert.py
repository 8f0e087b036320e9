"""Arrow to the processor's input and its output back to Arrow, as Spark converts them
for ``transformWithStateInPandas`` (pandas frames) and ``transformWithState`` in row form
(``Row`` objects): the same types, nulls and time zones a processor sees on Spark."""

from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from .glue import concat_frames, group_rows

__all__ = ["spark_schema", "to_pandas", "frames_to_arrow", "row_groups", "rows_of", "rows_to_arrow",
           "output_arrow_schema"]


def spark_schema(js: str) -> Any:
    from pyspark.sql.types import StructType

    return StructType.fromJson(json.loads(js))


def to_pandas(table: pa.Table, schema: Any, timezone: str, padded: bool = False) -> Any:
    """The rows as the pandas frame Spark's ``transformWithStateInPandas`` hands over: Spark
    converts the Arrow batch, then rebuilds each key's frame from its rows' Python values
    (PySpark's worker: ``pd.DataFrame(rows)`` of ``itertuples``), so a byte, short or int
    column arrives as int64 and a float column as float64. ``padded`` (batch 0 with an
    initial state, ``runtime/initial.py``): an integral column with nulls (the padding of
    the other side's rows) is kept exact as pandas' Int64; ``Sides`` gives each key's rows
    as int64 again (float64 where the key's own rows hold a null, as Spark's)."""
    import pandas as pd
    from pyspark.sql.conversion import ArrowArrayToPandasConversion
    from pyspark.sql.types import ByteType, FloatType, IntegerType, LongType, ShortType

    cols = {}
    for f in schema.fields:
        col = table.column(f.name)
        integral = isinstance(f.dataType, (ByteType, ShortType, IntegerType, LongType))
        if padded and integral and col.null_count:
            cols[f.name] = col.cast(pa.int64()).to_pandas(types_mapper=lambda t: pd.Int64Dtype())
            continue
        v = ArrowArrayToPandasConversion.convert(col, f.dataType, ser_name=f.name, timezone=timezone,
                                                 struct_in_pandas="dict")
        if integral and v.dtype.kind == "i" and v.dtype.itemsize < 8:
            v = v.astype(np.int64)
        elif isinstance(f.dataType, FloatType) and v.dtype == np.float32:
            v = v.astype(np.float64)
        cols[f.name] = v
    return pd.DataFrame(cols, index=pd.RangeIndex(table.num_rows))


def frames_to_arrow(frames: list, schema: Any, timezone: str) -> Optional[pa.RecordBatch]:
    from pyspark.sql.conversion import PandasToArrowConversion

    pdf = concat_frames(frames)
    if not len(pdf):
        return None
    missing = [f.name for f in schema.fields if f.name not in pdf.columns]
    if missing:
        raise ValueError(f"the processor's output lacks columns {missing} of the output schema "
                         f"({schema.simpleString()}); it has {list(pdf.columns)}")
    return PandasToArrowConversion.convert(pdf[[f.name for f in schema.fields]], schema, timezone=timezone,
                                           assign_cols_by_name=True, safecheck=True)


def row_groups(table: pa.Table, key_columns: list[str]) -> tuple[Any, list[tuple[bytes, tuple, int, int]]]:
    """The row form's grouping: the rows sorted by key, as a frame of Python values (Arrow's
    ``as_py``: None for a null, a datetime in the column's time zone for a timestamp), and
    the groups (``glue.group_rows``), whose key tuples are Python values too. Spark's row
    form converts a row the same way (PySpark's worker, ``transformWithStateInPySpark``)."""
    import pandas as pd

    pdf = pd.DataFrame({c: pd.Series(table.column(c).to_pylist(), dtype=object) for c in table.column_names},
                       index=pd.RangeIndex(table.num_rows))
    return group_rows(table, pdf, key_columns)


def rows_of(pdf: Any) -> list:
    """A frame of Python values (``row_groups``) as ``Row`` objects, with its columns' names."""
    from pyspark.sql import Row

    make = Row(*pdf.columns)
    return [make(*vals) for vals in pdf.itertuples(index=False, name=None)]


def rows_to_arrow(rows: list, schema: Any) -> Optional[pa.RecordBatch]:
    """The row form's output, converted as Spark converts it (``pa.RecordBatch.from_pylist``
    of ``row.asDict(True)``, in the output schema's Arrow types with time zone UTC)."""
    from pyspark.sql.pandas.types import to_arrow_type

    if not rows:
        return None
    arrow_type = to_arrow_type(schema, timezone="UTC", prefers_large_types=False)
    return pa.RecordBatch.from_pylist([r.asDict(True) if hasattr(r, "asDict") else dict(r) for r in rows],
                                      schema=pa.schema(list(arrow_type)))


def output_arrow_schema(out_schema: Any) -> pa.Schema:
    """The Arrow schema of the task's output: the operator's columns, nullable, timestamps
    in UTC (Spark's own Python runners send them so)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return pa.schema([f.with_nullable(True) for f in to_arrow_schema(out_schema, timezone="UTC")])
