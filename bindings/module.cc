// rhino._core: the private compiled module. rhino/__init__.py re-exports a
// curated API from it; nothing else should import it directly.
#include <pybind11/pybind11.h>
#include <rocksdb/version.h>

#include <string>

#include "bind_common.h"
#include "errors.h"
#include "rhino/state_backend.h"

// Not in RocksDB's public headers, but exported by every build of it
// (util/crc32c.h): says whether CRC32C, which guards every WAL record, runs
// on the CPU's crc32 instructions or on the table-driven fallback.
namespace rocksdb::crc32c {
std::string IsFastCrc32Supported();
}

#ifndef RHINO_VERSION
#define RHINO_VERSION "dev"
#endif
#ifndef RHINO_ROCKSDB_BUILD
#define RHINO_ROCKSDB_BUILD "unknown"
#endif

PYBIND11_MODULE(_core, m) {
  m.doc() = "Rhino's C++ core: hashing, routing, state backend, checkpoints, replica store, data plane, "
            "coordinator transport.";
  m.attr("__version__") = RHINO_VERSION;
  // Which RocksDB this module was compiled and linked against (CMakeLists.txt).
  m.attr("ROCKSDB_VERSION") = std::to_string(ROCKSDB_MAJOR) + "." + std::to_string(ROCKSDB_MINOR) + "." +
                              std::to_string(ROCKSDB_PATCH);
  m.attr("ROCKSDB_BUILD") = RHINO_ROCKSDB_BUILD;
  m.attr("ROCKSDB_CRC32C") = rocksdb::crc32c::IsFastCrc32Supported();
  // The most vnodes (column families) an instance may have: the coordinator
  // refuses more before it places anything (issue 46).
  m.attr("MAX_NUM_VNODES") = rhino::kMaxNumVnodes;
  rhino::py_bindings::BindErrors(m);
  rhino::py_bindings::BindRouting(m);
  rhino::py_bindings::BindStore(m);
  rhino::py_bindings::BindState(m);
  rhino::py_bindings::BindWorker(m);
  rhino::py_bindings::BindService(m);
  rhino::py_bindings::BindCoord(m);
}
