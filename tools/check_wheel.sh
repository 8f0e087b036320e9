#!/usr/bin/env bash
# Installs a wheel into a fresh virtualenv and checks that `import rhino` works
# and loads the librocksdb bundled in the wheel, not the system one.
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
p = rhino.Partitioner()
assert p.vnodes(np.arange(4, dtype=np.int64)).shape == (4,)
maps = open("/proc/self/maps").read()
libs = sorted(set(re.findall(r"\S*librocksdb\S*", maps)))
print("rhino", rhino.__version__, "from", rhino.__file__)
print("librocksdb loaded:", libs)
if not libs or not all(".libs/" in l and "site-packages" in l for l in libs):
    sys.exit("FAIL: librocksdb does not come from the wheel's bundled libs")
if any(l.startswith("/usr/lib") for l in libs):
    sys.exit("FAIL: the system librocksdb was loaded")
print("OK: the wheel imports in a fresh venv and loads its bundled librocksdb")
PY
