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
# Usage: tools/build_rocksdb.sh PREFIX   (installs PREFIX/include, PREFIX/lib)
# Takes ~15 minutes on 2 cores, once; later runs see PREFIX/.complete and exit.
set -euo pipefail

VERSION=7.8.3
URL="http://deb.debian.org/debian/pool/main/r/rocksdb/rocksdb_${VERSION}.orig.tar.gz"
SHA256=b85408a374770897332bf15e51620a5f35720dd416a4749e3899057f9cfaf84d
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

prefix=$(mkdir -p "$1" && cd "$1" && pwd)
stamp="$prefix/.complete"
want="rocksdb ${VERSION} sha256=${SHA256} ${CMAKE_FLAGS[*]} soname=${SONAME}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  touch "$stamp"  # newer than this script, so make does not ask again
  exit 0
fi

work="$prefix.work"
rm -rf "$work" "$prefix"/{include,lib,lib64}
mkdir -p "$work"
echo "[setup] downloading RocksDB ${VERSION} source from deb.debian.org"
curl -fsSL --retry 3 -o "$work/src.tar.gz" "$URL"
echo "${SHA256}  $work/src.tar.gz" | sha256sum -c --quiet - || {
  echo "[setup] RocksDB source tarball does not match its pinned SHA-256" >&2
  exit 1
}
tar -xzf "$work/src.tar.gz" -C "$work"

echo "[setup] building RocksDB ${VERSION} (release; ~15 min on 2 cores, once)"
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
mkdir -p "$prefix/lib"
cp -r "$work/rocksdb-${VERSION}/include" "$prefix/include"
g++ -shared -o "$prefix/lib/$SONAME" -Wl,-soname,"$SONAME" \
  -Wl,--whole-archive "$work/build/librocksdb.a" -Wl,--no-whole-archive \
  -lsnappy -llz4 -lzstd -lz -lpthread -ldl
ln -sf "$SONAME" "$prefix/lib/librocksdb-rhino.so"
rm -rf "$work"
echo "$want" >"$stamp"
echo "[setup] RocksDB ${VERSION} installed in $prefix"
