// The RocksDB options of an instance's state, made from its StateOptions
// (rhino/state_options.h): one DB, one column family per vnode, all sharing
// one block cache and one write-buffer budget. Internal to the state folder.
#pragma once

#include <rocksdb/compaction_filter.h>
#include <rocksdb/options.h>

#include <cstddef>
#include <memory>

#include "rhino/state_options.h"
#include "rhino/status.h"

namespace rocksdb {
class WriteBufferManager;
}  // namespace rocksdb

namespace rhino::state_internal {

// InvalidArgument unless options.flush_threads is 1..16: checked before
// anything is written.
Status CheckFlushThreads(const StateOptions& options);

// The DB's options; every memtable is charged to `wbm`.
rocksdb::DBOptions DbOptions(const StateOptions& options, std::shared_ptr<rocksdb::WriteBufferManager> wbm);

// Every vnode column family's options, for a DB holding `vnodes_held`
// vnodes (their memtables share the budget), with the TTL filter
// `ttl_filter` (which must outlive the DB). One block cache is made here:
// the caller shares the result among the column families.
rocksdb::ColumnFamilyOptions VnodeColumnFamilyOptions(const StateOptions& options, size_t vnodes_held,
                                                      const rocksdb::CompactionFilter* ttl_filter);

}  // namespace rhino::state_internal
