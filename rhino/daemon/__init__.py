"""The ``rhino worker`` daemon: one host's runtime (docs/design.md §2).

- :mod:`rhino.daemon.worker`: the daemon's shell (options, logging, signals);
  ``rhino worker``, ``rhino-worker`` or ``python -m rhino.daemon.worker``.
- :mod:`rhino.daemon.metrics`: its Prometheus ``/metrics`` endpoint.
"""
