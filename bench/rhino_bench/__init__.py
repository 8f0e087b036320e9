"""``rhino_bench``: Rhino's benchmarks, the demo, the NEXMark workload and the local-cluster harness.

Not part of the ``rhino-state`` wheel: development tooling, installed into the development
venv (``make setup``: ``pip install -e bench``), run as ``rhino-bench`` (:mod:`rhino_bench.cli`).

- ``restore``, ``replicate``, ``overhead``, ``service``, ``handover``, ``failover``: the data
  plane's and the coordinator's benchmarks (``rhino-bench <name>``), with ``workload`` (the
  synthetic keyed state they write) and ``common`` (what the drivers that run workers share);
- :mod:`rhino_bench.spark`: NEXMark Q8 on Rhino against Spark's own operator
  (``rhino-bench spark recovery|throughput|glue``);
- :mod:`rhino_bench.nexmark`: the NEXMark generator, Spark source, queries and pandas oracles;
- :mod:`rhino_bench.harness`: local clusters of real processes on 127.0.0.N: ``workers``
  (``rhino worker`` and ``rhino coordinator`` processes), ``spark_cluster`` (a Spark
  standalone + Rhino cluster, ``rhino-bench cluster``) and ``engine`` (an in-process
  micro-batch writer for tests and benchmarks);
- :mod:`rhino_bench.demo`: ``rhino-bench demo`` (``make demo``).

Benchmarks measure every figure against a baseline in the same run; results go to
``bench/results/`` with the exact command (bench/README.md).
"""
