"""Helpers for tests, benchmarks and the demo; not part of the library API.

- :mod:`rhino.testing.cluster`: a local multi-host cluster of real ``rhino worker``
  processes on 127.0.0.N, secret files, /proc CPU and memory readings, and an
  independent RocksDB reader.
"""
