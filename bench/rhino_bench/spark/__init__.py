"""Rhino against Spark's own operator on Spark: ``rhino-bench spark recovery|throughput`` (NEXMark Q8)
and ``rhino-bench spark state-size`` (one key holding a large MapState or ListState)."""
