"""Shared data and settings of the micro-benchmarks (`make bench`).

Every figure is a pair measured in the same pytest run: Rhino through its
bindings, and a baseline doing the same work (see benchutil.record).
"""

from __future__ import annotations

import os
import shlex
import sys

import numpy as np
import pytest

# pyspark.rdd.portable_hash refuses to run without a fixed PYTHONHASHSEED (as
# Spark's Python workers have); int keys hash the same whatever the seed.
os.environ.setdefault("PYTHONHASHSEED", "0")

from rhino._machine import describe_machine  # noqa: E402

SEED = 20240601
_LOAD_AT_START: list[float] = []


def pytest_sessionstart(session):
    _LOAD_AT_START[:] = [round(x, 2) for x in os.getloadavg()]


def pytest_benchmark_update_machine_info(config, machine_info):
    """Stores our machine description and the exact command in the JSON."""
    machine_info["rhino_machine"] = describe_machine(str(config.rootpath))
    machine_info["rhino_machine"]["loadavg_at_start"] = list(_LOAD_AT_START)
    args = " ".join(shlex.quote(a) for a in config.invocation_params.args)
    machine_info["rhino_command"] = f"{os.path.basename(sys.executable)} -m pytest {args}"


@pytest.fixture(scope="session")
def rng() -> np.random.Generator:
    return np.random.default_rng(SEED)
