"""The package's layout: the library API at the top of `rhino`, the daemon, the
command line, the coordinator, the client and the Spark layer in subpackages; the
benchmarks and the demo in the separate `rhino_bench` package (bench/), the local-cluster
harness, NEXMark and the keyed-state workload in the separate `rhino_testing` package
(testing/), which tests/ and bench/ both import; neither in the wheel; each importable,
and the entry points that name them working.

Each check runs in a fresh interpreter, so what one import pulls in is not hidden
by what the test session imported before."""

from __future__ import annotations

import subprocess
import sys

import pytest

SUBPACKAGES = ["rhino.daemon", "rhino.cli", "rhino.client", "rhino.coordinator", "rhino.spark",
               "rhino_bench", "rhino_bench.spark", "rhino_bench.demo",
               "rhino_testing", "rhino_testing.harness", "rhino_testing.nexmark"]
MODULES = ["rhino.daemon.worker", "rhino.daemon.metrics", "rhino.cli.main", "rhino.cli.verify", "rhino.cli.restore",
           "rhino.cli.progress", "rhino.cli.state", "rhino_bench.cli", "rhino_bench.restore", "rhino_bench.replicate",
           "rhino_bench.overhead", "rhino_testing.workload", "rhino_bench.common", "rhino_bench.frame",
           "rhino_bench.procmem", "rhino_testing.harness.workers",
           "rhino_bench.demo.dataplane"]


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", SUBPACKAGES + MODULES)
def test_every_subpackage_and_module_imports(name):
    p = python(f"import importlib; importlib.import_module({name!r})")
    assert p.returncode == 0, p.stderr


def test_the_library_api_does_not_pull_in_the_tools():
    """`import rhino` is the embedded API: no command line, daemon, bench, harness or their libraries."""
    p = python("import sys, rhino; print(' '.join(sorted(sys.modules)))")
    assert p.returncode == 0, p.stderr
    loaded = set(p.stdout.split())
    unwanted = {"rhino.cli", "rhino.daemon", "rhino_bench", "rhino_testing", "rhino.spark",
                "tqdm", "prometheus_client", "rocksdict", "pyspark"}
    assert not loaded & unwanted, sorted(loaded & unwanted)


def test_rhino_spark_comes_from_spark_integration_and_does_not_import_pyspark():
    p = python("import sys, rhino.spark; print(rhino.spark.__file__); print('pyspark' in sys.modules)")
    assert p.returncode == 0, p.stderr
    path, pyspark_loaded = p.stdout.split()
    assert path.replace("\\", "/").endswith("spark_integration/spark/__init__.py") or "/rhino/spark/" in path
    assert pyspark_loaded == "False"


def test_the_harness_does_not_need_rocksdict_to_import():
    p = python("import sys; sys.modules['rocksdict'] = None; import rhino_testing.harness.workers")
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("argv", [["-m", "rhino", "--help"], ["-m", "rhino.cli", "--help"],
                                  ["-m", "rhino.daemon.worker", "--help"], ["-m", "rhino", "worker", "--help"],
                                  ["-m", "rhino_bench", "overhead", "--help"], ["-m", "rhino_bench", "--help"]])
def test_the_module_entry_points_run(argv):
    p = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.lstrip().startswith(("usage: rhino", "The ``rhino-bench`` command"))


def test_the_benchmarks_and_the_demo_left_the_library():
    """No `rhino bench`, `rhino demo` or `rhino spark`: they are `rhino-bench`'s; and no module of the
    library imports rhino_bench or rhino_testing; and rhino_testing imports nothing of rhino_bench."""
    for argv in (["bench", "restore", "--help"], ["demo", "--help"], ["spark", "--help"]):
        p = subprocess.run([sys.executable, "-m", "rhino", *argv], capture_output=True, text=True, timeout=120)
        assert p.returncode == 2, (argv, p.stdout, p.stderr)
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for tree in (root / "rhino", root / "spark_integration" / "spark"):
        for f in tree.rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                assert not any(n.split(".")[0] in ("rhino_bench", "rhino_testing") for n in names), \
                    f"{f}:{node.lineno} imports it"
    for f in (root / "testing" / "rhino_testing").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "rhino_bench" for n in names), f"{f}:{node.lineno} imports it"
