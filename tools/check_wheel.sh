#!/usr/bin/env bash
# Installs a wheel into a fresh virtualenv and checks that `import rhino` works,
# and that it loads the release librocksdb bundled in the wheel, and that
# library's compression libraries, never the system ones; that every subpackage
# (rhino.daemon, rhino.cli, rhino.client, rhino.coordinator, and rhino.spark, which
# comes from spark_integration/) imports; that the wheel holds the library only (no
# benchmark, demo, NEXMark or harness module: those are bench/rhino_bench's and
# testing/rhino_testing's, and no
# test-only binding in rhino._core); and that
# the console scripts run.
set -euo pipefail
wheel=$(readlink -f "$1")
venv=$(mktemp -d /tmp/rhino-wheel-check.XXXXXX)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "$wheel"
# The library only: nothing of the repository's benchmarks, demo, NEXMark workload or harness.
python3 - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
bad = [n for n in names if n.startswith(("rhino_bench", "rhino_testing", "rhino/bench/", "rhino/testing/", "rhino/spark/bench/",
                                         "rhino/spark/nexmark/"))
       or n.endswith(("/demo.py", "/cluster.py", "spark_glue.py"))]
if bad:
    sys.exit(f"FAIL: the wheel holds non-library modules: {bad}")
print(f"OK: the wheel holds {len(names)} files, none of them a benchmark, demo, NEXMark or harness module")
PY
cd "$venv"  # not the source tree, so the installed package is what imports
"$venv/bin/python" - <<'PY'
import re, sys
import numpy as np
import rhino
from rhino import _core
p = rhino.Partitioner()
assert p.vnodes(np.arange(4, dtype=np.int64)).shape == (4,)
maps = open("/proc/self/maps").read()
loaded = sorted(set(re.findall(r"/\S*lib(?:rocksdb|snappy|lz4|zstd)\S*", maps)))
print("rhino", rhino.__version__, "from", rhino.__file__)
print("rocksdb", _core.ROCKSDB_VERSION, "-", _core.ROCKSDB_BUILD)
print("librocksdb and compression libraries loaded:", loaded)
test_only = [n for n in ("MessageDict", "decode_frame", "encode_frame") if hasattr(_core, n)]
if test_only:
    sys.exit(f"FAIL: the extension ships test-only bindings: {test_only}")
if not _core.ROCKSDB_BUILD.startswith("release build"):
    sys.exit("FAIL: the wheel was not built against the release RocksDB")
if not any("librocksdb-rhino" in l for l in loaded):
    sys.exit("FAIL: the bundled librocksdb was not loaded")
if not all(".libs/" in l and "site-packages" in l for l in loaded):
    sys.exit("FAIL: librocksdb or a compression library does not come from the wheel's bundled libs")
with rhino.StateBackend.open("db", partitioner=p) as db:  # RocksDB really runs
    db.put_batch(np.arange(100, dtype=np.int64), [b"v%d" % i for i in range(100)])
    db.flush()
    assert db.get_batch(np.array([7], dtype=np.int64)) == [b"v7"]

import importlib, os, pkgutil
subpackages = sorted(f"rhino.{m.name}" for m in pkgutil.iter_modules(rhino.__path__) if m.ispkg)
for name in ("rhino.daemon", "rhino.cli", "rhino.spark", "rhino.client", "rhino.coordinator"):
    if name not in subpackages:
        sys.exit(f"FAIL: the wheel lacks {name} (it has {subpackages})")
modules = subpackages + ["rhino.daemon.worker", "rhino.daemon.metrics", "rhino.cli.main", "rhino.cli.verify",
                         "rhino.cli.restore", "rhino.cli.progress", "rhino.client.client",
                         "rhino.client.session", "rhino.coordinator.coordinator", "rhino.coordinator.server",
                         "rhino.coordinator.placement", "rhino.coordinator.strategies", "rhino.cli.control",
                         "rhino.daemon.registration", "rhino.spark.scheduling"]
for name in modules:
    mod = importlib.import_module(name)
    if "site-packages" not in mod.__file__:
        sys.exit(f"FAIL: {name} imported from {mod.__file__}, not from the installed wheel")
import rhino.spark
if os.path.dirname(rhino.spark.__file__) != os.path.join(os.path.dirname(rhino.__file__), "spark"):
    sys.exit(f"FAIL: rhino.spark is at {rhino.spark.__file__}, not inside the rhino package")
if "pyspark" in sys.modules:
    sys.exit("FAIL: importing rhino.spark imported pyspark (it is an optional dependency)")
print("modules imported:", ", ".join(modules))

# The state service runs from the wheel: a worker hosting an instance, a
# session over its Unix socket, a commit, and the state read back.
w = rhino.Worker(id="wheel", store_dir=os.path.abspath("store"), secret=b"wheel-check-secret",
                 state_dir=os.path.abspath("state"), unix_socket=os.path.abspath("w.sock"))
w.start()
try:
    # The coordinator from the wheel, served over the framed protocol, places an operator on it.
    from rhino.coordinator import Coordinator, connect_coordinator
    from rhino.coordinator.server import CoordinatorServer
    coord = Coordinator(os.path.abspath("coord"), secret=b"wheel-check-secret", heartbeat_timeout=3600)
    server = CoordinatorServer(coord, "127.0.0.1", 0, secret=b"wheel-check-secret")
    with connect_coordinator(server.address, secret=b"wheel-check-secret") as cc:
        cc.register("wheel", f"127.0.0.1:{w.port}", incarnation="wheel")
        placed = cc.create_operator("placed", parallelism=1, num_vnodes=8, replicas=0)
        assert placed.instances[0].primary == "wheel", placed
    server.close()
    coord.close()
    print("OK: a coordinator from the wheel placed an operator on the worker")
    with rhino.connect(os.path.abspath("w.sock"), secret=b"wheel-check-secret") as c:
        c.open_instance("op", 0, epoch=1, num_vnodes=8)
        with c.session("op", 0, batch=0, epoch=1) as s:
            s.put_batch(np.arange(10, dtype=np.int64), [b"w%d" % i for i in range(10)])
            s.commit()
        with c.session("op", 0, batch=1, epoch=1) as s:
            assert s.get_batch(np.array([3], dtype=np.int64)) == [b"w3"]
finally:
    w.stop()
print("OK: a session on the state service of a worker from the wheel")
print("OK: the wheel imports in a fresh venv and loads its bundled release librocksdb and compression libraries")
PY
"$venv/bin/rhino" version
"$venv/bin/rhino-worker" --help >/dev/null
"$venv/bin/python" -m rhino --help >/dev/null
echo "OK: rhino, rhino-worker and python -m rhino run"
