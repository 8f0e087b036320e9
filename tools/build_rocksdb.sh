#!/usr/bin/env bash
# Builds the RocksDB that Rhino links: 7.8.3, the version Debian 12 ships, from
# Debian's own source tarball (checked against a pinned SHA-256), in release
# mode, as a shared library that `make wheel` bundles with auditwheel, as it
# would bundle Debian's.
#
# Why not Debian's librocksdb binary: it is compiled without NDEBUG, so its
# ~6,400 assert() calls and its test sync points run in production. That costs
# Rhino's point lookups and memtable inserts (bench/README.md, "The release RocksDB build", has the
# measurement), and a failed assertion aborts the process where a release
# build returns a Status.
#
# The library's soname is librocksdb-rhino.so.7.8.3, not Debian's
# librocksdb.so.7.8, so the dynamic loader can never hand Rhino Debian's build
# in its place (say, when another extension has already loaded it).
#
# Usage: tools/build_rocksdb.sh PREFIX
#
# The build lives in a cache outside the clone, keyed by everything that goes
# into its stamp: ${RHINO_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/rhino}/rocksdb-<hash>.
# PREFIX becomes a symbolic link to it, so a second clone on the same machine
# (a CI run, a worktree) links the build in a second instead of spending ~15
# minutes on 2 cores. A missing, partial or stale cache entry is built again;
# concurrent builds of one entry wait on its lock.
#
# The source comes through apt's own configured sources (`apt-get source`),
# never from a host named here. If the machine has no deb-src entries, they are
# derived from its deb entries in a private apt state directory, so the
# machine's apt configuration is not touched.
set -euo pipefail

VERSION=7.8.3
SHA256=b85408a374770897332bf15e51620a5f35720dd416a4749e3899057f9cfaf84d
ORIG="rocksdb_${VERSION}.orig.tar.gz"
# Everything that changes the library goes into the stamp, so a change rebuilds.
CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release          # -O3 -DNDEBUG
  -DPORTABLE=ON                       # no -march=native: the wheel runs on any x86-64
  # PORTABLE alone also compiles CRC32C (every WAL record) table-driven. With
  # these two, util/crc32c.cc alone is compiled with -msse4.2 -mpclmul and
  # picks the crc32 instructions at run time (cpuid); nothing else changes.
  -DHAVE_SSE42=ON
  "-DCMAKE_CXX_FLAGS=-DHAVE_SSE42 -DHAVE_PCLMUL"
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON  # the static archive's objects become the shared library
  -DROCKSDB_BUILD_SHARED=OFF           # RocksDB's own shared target would compile everything twice
  -DUSE_RTTI=ON
  -DFAIL_ON_WARNINGS=OFF
  -DWITH_GFLAGS=OFF -DWITH_TESTS=OFF -DWITH_TOOLS=OFF -DWITH_CORE_TOOLS=OFF
  -DWITH_BENCHMARK_TOOLS=OFF -DWITH_TRACE_TOOLS=OFF
  -DWITH_SNAPPY=ON -DWITH_LZ4=ON -DWITH_ZSTD=ON -DWITH_ZLIB=ON -DWITH_BZ2=OFF -DWITH_LIBURING=OFF
)
SONAME="librocksdb-rhino.so.${VERSION}"
want="rocksdb ${VERSION} sha256=${SHA256} ${CMAKE_FLAGS[*]} soname=${SONAME} cxx=$(c++ -dumpfullversion 2>/dev/null || echo ?)"

[ $# -eq 1 ] || { echo "usage: $0 PREFIX" >&2; exit 2; }
link="$1"
cache_root="${RHINO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rhino}"
key=$(printf '%s' "$want" | sha256sum | cut -c1-16)
prefix="$cache_root/rocksdb-$key"

# PREFIX -> the cache entry. An older layout's real directory is replaced.
place_link() {
  mkdir -p "$(dirname "$link")"
  if [ -L "$link" ] || [ ! -e "$link" ]; then
    ln -sfn "$prefix" "$link"
  else
    rm -rf "$link" && ln -s "$prefix" "$link"
  fi
  touch -h "$link" 2>/dev/null || true
}

if [ -f "$prefix/.complete" ] && [ "$(cat "$prefix/.complete")" = "$want" ]; then
  touch "$prefix/.complete"  # newer than this script, so make does not ask again
  place_link
  echo "[setup] RocksDB ${VERSION}: using the cached build in $prefix"
  exit 0
fi

mkdir -p "$cache_root"
exec 9>"$prefix.lock"
echo "[setup] waiting for the RocksDB cache lock ($prefix.lock)"
flock 9
# Another build may have finished while this one waited.
if [ -f "$prefix/.complete" ] && [ "$(cat "$prefix/.complete")" = "$want" ]; then
  touch "$prefix/.complete"  # newer than this script, so make does not ask again
  place_link
  echo "[setup] RocksDB ${VERSION}: using the cached build in $prefix"
  exit 0
fi

work="$prefix.work"
rm -rf "$work" "$prefix"
mkdir -p "$work/src"

# The source, through apt. `apt-get source --download-only` fetches the .dsc,
# the orig tarball and the Debian diff into the current directory.
fetch_source() {
  local apt_dir="$work/apt" opts=()
  if ! grep -rqsE '^(deb-src|Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
       /etc/apt/sources.list.d/*.sources; then
    echo "[setup] no deb-src entries: deriving them from this machine's deb entries (private to this build)"
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/sources.list.d"
    : >"$apt_dir/sources.list"
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [ -f "$f" ] && sed -nE 's/^[[:space:]]*deb([[:space:]])/deb-src\1/p' "$f" >>"$apt_dir/sources.list"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -f "$f" ] && sed -E 's/^Types:.*/Types: deb-src/' "$f" >"$apt_dir/sources.list.d/$(basename "$f")"
    done
    opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
          -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o "Debug::NoLocking=1")
    echo "[setup] apt-get update (source indices only)"
    apt-get "${opts[@]}" -q update >"$work/apt-update.log" 2>&1 || {
      tail -20 "$work/apt-update.log" >&2; echo "[setup] apt-get update failed" >&2; return 1; }
  fi
  echo "[setup] fetching RocksDB ${VERSION} source with apt-get source"
  (cd "$work/src" && apt-get "${opts[@]}" -q source --download-only rocksdb >"$work/apt-source.log" 2>&1) || {
    tail -20 "$work/apt-source.log" >&2; echo "[setup] apt-get source rocksdb failed" >&2; return 1; }
}
fetch_source
[ -f "$work/src/$ORIG" ] || {
  echo "[setup] apt-get source gave no $ORIG (the archive's RocksDB is not ${VERSION}); see $work/apt-source.log" >&2
  exit 1
}
echo "${SHA256}  $work/src/$ORIG" | sha256sum -c --quiet - || {
  echo "[setup] RocksDB source tarball does not match its pinned SHA-256" >&2
  exit 1
}
tar -xzf "$work/src/$ORIG" -C "$work"

echo "[setup] building RocksDB ${VERSION} (release; ~15 min on 2 cores, once per machine) into $prefix"
cmake -S "$work/rocksdb-${VERSION}" -B "$work/build" -G Ninja \
  "${CMAKE_FLAGS[@]}" >"$work/configure.log" 2>&1 || {
  tail -40 "$work/configure.log" >&2
  exit 1
}
# ninja prints one status line per object; keep a progress line every 10%.
ninja -C "$work/build" -j "${RHINO_BUILD_JOBS:-2}" rocksdb 2>&1 | tee "$work/build.log" |
  awk '/^\[[0-9]+\/[0-9]+\]/ { split(substr($1, 2), a, "/"); pct = int(100 * a[1] / a[2]);
         if (pct >= next_pct) { printf "[setup] RocksDB build %3d%% (%s objects)\n", pct, $1; fflush(); next_pct = pct + 10 } }
       /FAILED:|error:/ { print; fflush() }'
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "[setup] RocksDB build failed; see $work/build.log" >&2; exit 1; }
# Assembled beside the entry and renamed into place, so a killed build never
# leaves an entry that looks complete.
stage="$prefix.stage"
rm -rf "$stage" && mkdir -p "$stage/lib"
cp -r "$work/rocksdb-${VERSION}/include" "$stage/include"
g++ -shared -o "$stage/lib/$SONAME" -Wl,-soname,"$SONAME" \
  -Wl,--whole-archive "$work/build/librocksdb.a" -Wl,--no-whole-archive \
  -lsnappy -llz4 -lzstd -lz -lpthread -ldl
ln -sf "$SONAME" "$stage/lib/librocksdb-rhino.so"
echo "$want" >"$stage/.complete"
mv "$stage" "$prefix"
rm -rf "$work"
place_link
echo "[setup] RocksDB ${VERSION} installed in $prefix (linked from $link)"
