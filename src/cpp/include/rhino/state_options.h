// StateOptions: how an instance's state is opened (StateBackend::Open), as a
// plain struct with its defaults (LevelDB's Options). state/rocksdb_options.cc
// turns it into RocksDB's options.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rhino/partitioner.h"

namespace rhino {

enum class CompactionStyle { kLevel, kUniversal };

// "level" / "universal"; false for anything else.
bool ParseCompactionStyle(const std::string& name, CompactionStyle* out);
const char* CompactionStyleName(CompactionStyle style);

// The most vnodes an instance's state may have: each is a RocksDB column
// family (its own memtable, files and options), so an unbounded num_vnodes
// (the partitioner allows up to 2^30) would let one open request exhaust a
// worker's memory and file descriptors (issue 46). InvalidArgument above it.
constexpr uint32_t kMaxNumVnodes = 65536;

struct StateOptions {
  // For a new DB, the partitioner to create it with. For an existing DB it
  // must match the stored one if check_partitioner is set.
  PartitionerOptions partitioner;
  bool check_partitioner = true;
  std::string operator_id = "op";
  uint32_t instance = 0;
  // Vnodes to create column families for in a new DB; empty means all V.
  // Ignored when opening an existing DB, which knows its own vnodes.
  std::vector<uint32_t> vnodes;
  // Memtable budget of this instance. Each vnode gets budget / vnodes held
  // (at least 1 MiB), so memtables hold about 2 x max(budget, vnodes x 1 MiB).
  uint64_t write_buffer_budget = 256ull << 20;
  // Per-vnode memtable size; 0 = the budget's share, budget / vnodes held,
  // clamped to [1 MiB, 64 MiB] (set when the DB is opened).
  uint64_t write_buffer_size = 0;
  // Block cache shared by all column families of this instance.
  uint64_t block_cache_bytes = 64ull << 20;
  // How each vnode's LSM is compacted (bench/README.md, "Compaction style").
  // Leveled (RocksDB's default) keeps the fewest files and bytes; universal
  // rewrites less per byte written once vnodes are large, and every byte a
  // compaction writes is a byte the next checkpoint replicates. A DB may be
  // reopened or restored with either style.
  CompactionStyle compaction = CompactionStyle::kLevel;
  // RocksDB flush threads of this DB (1..16). A checkpoint flushes every
  // vnode's memtable at once, so with 2 the flushes overlap: faster
  // checkpoints where a core is free during them, at the cost of that core.
  uint32_t flush_threads = 1;
  // A checkpoint whose write-ahead log holds less than this many bytes (since
  // the memtables were last flushed) does not flush: it copies the WAL into
  // the checkpoint, and a restore replays it (RocksDB's log_size_for_flush).
  // A micro-batch that touched a few keys in every vnode then commits one
  // small WAL file instead of one SST per vnode (one fsync and one MANIFEST
  // write each: ~1 ms apiece). The delta is the WAL since the last flush, so
  // it grows batch by batch up to this bound, then a flush resets it.
  // 0 = flush at every checkpoint.
  uint64_t checkpoint_wal_bytes = 256ull << 10;
  // The DB is a restored checkpoint, whose WAL must replay whole: a damaged
  // record fails the open (set by StateBackend::Restore).
  bool whole_wal = false;
  // false: the open itself does not fsync (open_without_sync.h says why and
  // who makes the directory durable instead); the DB syncs as usual afterwards.
  bool sync_open = true;
  // Fail instead of creating a missing DB.
  bool error_if_missing = false;
  bool read_only = false;
};

}  // namespace rhino
