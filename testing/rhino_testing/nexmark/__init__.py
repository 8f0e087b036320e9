"""NEXMark for ``rhino.spark``: a deterministic generator, a Spark streaming source and the
paper's queries (Q5, Q8, Q11) as standard PySpark ``StatefulProcessor``s, with pandas oracles.

* :mod:`.generator` -- ``generate(start_id, end_id, config=NexmarkConfig(...))`` -> pyarrow Table;
* :mod:`.source` -- ``NexmarkDataSource``, the ``"nexmark"`` Python data source (stream and batch);
* :mod:`.queries` -- ``QUERIES[name]`` with ``prepare``, ``key``, ``processor_factory``,
  ``output_schema``, ``watermark_delay``, ``event_time_column``;
* :mod:`.oracle` -- ``compute(name, events_pdf, **params)`` and ``closed(name, out_pdf, watermark_ms)``.

Importing this package imports neither PySpark nor pandas; the submodules do as they need.
"""
