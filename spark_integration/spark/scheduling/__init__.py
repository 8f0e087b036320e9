"""Placement-aware scheduling: run partition i of an RDD on the host that holds instance i's
state (docs/design.md §2, §8).

- :func:`with_preferred_locations` wraps an RDD so that each partition prefers given hosts
  (a small JVM class, ``io.rhino.spark.PreferredLocationsRDD``, that overrides
  ``getPreferredLocations``; its source ships in this package and is compiled with javac
  on first use, :mod:`rhino.spark.scheduling.jar`);
- :func:`spark_conf_for_locality`: the ``spark.jars`` entry a session needs for it;
- :func:`task_location`, :func:`job_task_locations`, :func:`locality_report`: where tasks
  ran, compared with where they were asked to run.

Importing this package does not import PySpark.
"""

from typing import Any

# Imported on first use (PEP 562), so that `python -m rhino.spark.scheduling.jar` runs its
# module fresh rather than one this package already imported.
_WHERE = {"jar_path": ".jar", "JAVA_CLASS": ".locality", "LocalityReport": ".locality",
          "TaskLocation": ".locality", "job_task_locations": ".locality", "locality_report": ".locality",
          "spark_conf_for_locality": ".locality", "task_location": ".locality",
          "with_preferred_locations": ".locality"}


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod, __name__), name)
    globals()[name] = value
    return value


__all__ = ["jar_path", "JAVA_CLASS", "with_preferred_locations", "spark_conf_for_locality", "task_location",
           "TaskLocation", "job_task_locations", "locality_report", "LocalityReport"]
