"""Local clusters of real processes on loopback addresses, for tests, benchmarks and the demo.

- :mod:`rhino_testing.harness.workers`: real ``rhino worker`` / ``rhino coordinator`` processes on
  127.0.0.N, secret files, /proc CPU and memory readings, an independent RocksDB reader;
- :mod:`rhino_testing.harness.spark_cluster`: a Spark standalone + Rhino cluster, one "host" per
  address (``rhino-bench cluster``);
- :mod:`rhino_testing.harness.engine`: an in-process micro-batch writer on the library's engine.

Not a public API (unlike ``pyspark.testing``): its shape follows what our tests and
benchmarks need (process handles, SIGKILL and restart of hosts, /proc CPU readings, an
independent RocksDB reader), and it starts whole Spark standalone clusters. A small
public fixture for users to test their own processors on Rhino (a coordinator and a few
workers beside a local SparkSession) is worth designing with the operator's next
shape rather than freezing this one.
"""
