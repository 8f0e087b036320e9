#!/usr/bin/env bash
# Runs the venv's Python on a sanitized build of rhino._core (make sanitize, docs/testing.md).
#
#   tools/sanitized_python.sh SANITIZERS BUILD_DIR [python arguments...]
#   (SANITIZERS: address,undefined or thread; BUILD_DIR holds the _core module CMake built)
#
# The package is laid out in BUILD_DIR/pkg as the wheel lays it out (rhino/ from the source tree,
# rhino/spark from spark_integration/spark, the sanitized _core beside them), put first on the
# path; the editable install's import hook is taken out of the way (sitecustomize.py), and
# PYTHONSAFEPATH keeps the source tree's own rhino/ (which has no _core) off sys.path. The
# sanitizer's runtime is preloaded, since python itself is not built with it. Worker processes
# that the tests start inherit all of this.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 SANITIZERS BUILD_DIR [python args...]" >&2; exit 2; }
san=$1 dir=$2
shift 2
repo=$(cd "$(dirname "$0")/.." && pwd)
so=$(ls "$dir"/_core*.so 2>/dev/null | head -1)
[ -n "$so" ] || { echo "$0: no _core module in $dir (build it first: make sanitize)" >&2; exit 1; }

pkg="$dir/pkg"
rm -rf "$pkg"
mkdir -p "$pkg/rhino"
for f in "$repo"/rhino/*; do ln -s "$f" "$pkg/rhino/"; done
ln -s "$repo/spark_integration/spark" "$pkg/rhino/spark"
ln -s "$(realpath "$so")" "$pkg/rhino/"
cat >"$pkg/sitecustomize.py" <<'PY'
# make sanitize: the editable install's finder would map rhino to the unsanitized build.
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
PY

# Every process's report goes to a file here (a worker's stderr is its log): any file fails the run.
reports="$dir/reports"
rm -rf "$reports" && mkdir -p "$reports"
case "$san" in
  *thread*)
    runtime=$(gcc -print-file-name=libtsan.so)
    # Python and RocksDB are not instrumented: what TSan reports inside them is not ours to fix.
    export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 report_signal_unsafe=0 ignore_noninstrumented_modules=1 suppressions=$repo/tools/tsan.supp log_path=$reports/tsan"
    ;;
  *address*)
    runtime=$(gcc -print-file-name=libasan.so)
    # Leaks: the interpreter's own allocations at exit are not ours; the C++ unit tests check leaks.
    export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=0:strict_string_checks=1:log_path=$reports/asan"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan"
    ;;
  *) echo "$0: unknown sanitizers '$san'" >&2; exit 2 ;;
esac
# libstdc++ too: python does not link it, and the runtime's C++ interceptors (__cxa_throw: every
# Status that becomes a Python exception) must find it when they are set up.
export LD_PRELOAD="$runtime $(gcc -print-file-name=libstdc++.so)"
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONSAFEPATH=1
export RHINO_SANITIZED="$san"
cd "$repo"
# setarch -R: TSan's fixed memory layout needs the address space unrandomized on newer kernels.
rc=0
setarch "$(uname -m)" -R "$repo/.venv/bin/python" "$@" || rc=$?
if compgen -G "$reports/*" >/dev/null; then
  for f in "$reports"/*; do echo "== $f"; head -60 "$f"; done
  echo "[sanitize] $san: the reports above (in $reports)" >&2
  exit 1
fi
exit $rc
