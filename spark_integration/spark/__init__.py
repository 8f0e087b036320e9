"""``rhino.spark``: the PySpark layer of Rhino (docs/design.md §2).

The operator API (``transform_with_state``: an unmodified PySpark
``StatefulProcessor`` per micro-batch from ``foreachBatch``, each task pinned to
the host of its instance's primary; ``apply_in_pandas_with_state``; ``Pipeline``, a
chain of them that stages can be inserted into and removed from while it runs), its state
(``state/``), and the ``rhino-state`` data source that reads a committed
checkpoint's state as a DataFrame (``register_state_source``). This package is installed as ``rhino.spark`` from ``spark_integration/spark``
(pyproject.toml, ``[tool.scikit-build.wheel.packages]``); it uses the ``rhino`` API,
never ``rhino._core``.

PySpark is an optional dependency (``pip install rhino-state[spark]``): importing this
package does not import it; :func:`require_pyspark` does, with a clear error.
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["require_pyspark", "transform_with_state", "TransformWithState", "apply_in_pandas_with_state",
           "register_state_source", "with_ticks", "InputLostError", "FreshCheckpointError", "Pipeline"]

_LAZY = {"transform_with_state": ".operator", "TransformWithState": ".operator",
         "apply_in_pandas_with_state": ".grouped", "register_state_source": ".state_source", "with_ticks": ".ticks",
         "InputLostError": ".errors", "FreshCheckpointError": ".errors", "Pipeline": ".pipeline"}


def __getattr__(name: str):  # PEP 562: the operator API imports PySpark only when used
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'rhino.spark' has no attribute {name!r}")
    require_pyspark()
    import importlib

    return getattr(importlib.import_module(mod, __name__), name)


def require_pyspark() -> ModuleType:
    """Imports and returns ``pyspark``, or raises ImportError naming the ``spark`` extra."""
    try:
        import pyspark
    except ImportError as e:
        raise ImportError("rhino.spark needs PySpark: pip install 'rhino-state[spark]'") from e
    return pyspark
