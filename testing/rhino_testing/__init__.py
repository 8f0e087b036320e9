"""``rhino_testing``: what Rhino's tests (``tests/``) and benchmarks (``bench/``, ``rhino-bench``)
share, apart from both.

Not part of the ``rhino-state`` wheel: development tooling, installed into the development
venv (``make setup``: ``pip install -e testing``).

- :mod:`rhino_testing.harness`: local clusters of real processes on 127.0.0.N: ``workers``
  (``rhino worker`` and ``rhino coordinator`` processes), ``spark_cluster`` (a Spark
  standalone + Rhino cluster, ``rhino-bench cluster``), ``engine`` (an in-process
  micro-batch writer), ``power_loss_fs`` (a filesystem that loses unsynced writes) and
  ``warm`` (warming a new host's executor);
- :mod:`rhino_testing.nexmark`: the NEXMark generator, Spark source, queries and pandas oracles;
- :mod:`rhino_testing.workload`: the synthetic keyed state the data-plane tests and
  benchmarks write.
"""
