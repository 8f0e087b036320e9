"""``rhino_bench``: Rhino's benchmarks and the demo.

Not part of the ``rhino-state`` wheel: development tooling, installed into the development
venv (``make setup``: ``pip install -e bench``), run as ``rhino-bench`` (:mod:`rhino_bench.cli`).

- ``restore``, ``replicate``, ``overhead``, ``service``, ``handover``, ``failover``: the data
  plane's and the coordinator's benchmarks (``rhino-bench <name>``), with ``common`` (what
  the drivers that run workers share);
- :mod:`rhino_bench.spark`: NEXMark Q8 on Rhino against Spark's own operator
  (``rhino-bench spark recovery|throughput|glue``);
- :mod:`rhino_bench.demo`: ``rhino-bench demo`` (``make demo``).

The local-cluster harness, the NEXMark workload and the keyed-state workload they run on
are the separate ``rhino_testing`` package (``testing/``), which the tests import too.

Benchmarks measure every figure against a baseline in the same run; results go to
``bench/results/`` with the exact command (bench/README.md).
"""
