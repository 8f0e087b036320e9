#!/usr/bin/env bash
# Installs a wheel into a fresh virtualenv and checks that `import rhino` works,
# and that it loads the release librocksdb bundled in the wheel, and that
# library's compression libraries, never the system ones.
set -euo pipefail
wheel=$(readlink -f "$1")
venv=$(mktemp -d /tmp/rhino-wheel-check.XXXXXX)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "$wheel"
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
print("OK: the wheel imports in a fresh venv and loads its bundled release librocksdb and compression libraries")
PY
