"""NEXMark Q8 on Rhino against Spark's own operator: ``rhino-bench spark recovery|throughput``."""
