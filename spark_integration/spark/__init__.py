"""``rhino.spark``: the PySpark layer of Rhino (docs/design.md §2).

The operator API (run a keyed processor per micro-batch from ``foreachBatch`` /
``mapPartitions``, with each task pinned to the host of its instance's primary),
placement-aware scheduling and the NEXMark source and queries land with the Spark
issue. This package is installed as ``rhino.spark`` from ``spark_integration/spark``
(pyproject.toml, ``[tool.scikit-build.wheel.packages]``); it uses the ``rhino`` API,
never ``rhino._core``.

PySpark is an optional dependency (``pip install rhino-state[spark]``): importing this
package does not import it; :func:`require_pyspark` does, with a clear error.
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["require_pyspark"]


def require_pyspark() -> ModuleType:
    """Imports and returns ``pyspark``, or raises ImportError naming the ``spark`` extra."""
    try:
        import pyspark
    except ImportError as e:
        raise ImportError("rhino.spark needs PySpark: pip install 'rhino-state[spark]'") from e
    return pyspark
