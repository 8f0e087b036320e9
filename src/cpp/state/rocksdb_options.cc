// The RocksDB options a StateOptions makes: the DB's, and every vnode column
// family's. Why each is set as it is, is said beside it; the figures are
// from bench/README.md and bench/results/.
#include "state/rocksdb_options.h"

#include <rocksdb/cache.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/slice_transform.h>
#include <rocksdb/table.h>
#include <rocksdb/write_buffer_manager.h>

#include <algorithm>
#include <memory>
#include <string>

namespace rhino {

namespace state_internal {
namespace {

constexpr uint64_t kMaxManifestBytes = 64 << 10;
constexpr int kMaxOpenFiles = 1 << 16;

}  // namespace

rocksdb::DBOptions DbOptions(const StateOptions& options, std::shared_ptr<rocksdb::WriteBufferManager> wbm) {
  rocksdb::DBOptions dbo;
  dbo.create_if_missing = true;
  dbo.create_missing_column_families = true;
  dbo.write_buffer_manager = std::move(wbm);
  dbo.max_background_jobs = 2;
  // Flush threads: RocksDB derives one from max_background_jobs = 2, and the
  // compactions keep their one thread either way (bench/README.md, "Flush
  // threads").
  dbo.max_background_flushes = static_cast<int>(options.flush_threads);
  // A checkpoint's write-ahead log was copied whole, at a record boundary: a
  // bad record is damage, and must fail the restore, not end the replay
  // early (RocksDB's default for a crashed DB's own log), which would lose
  // the writes after it without a word.
  if (options.whole_wal) dbo.wal_recovery_mode = rocksdb::WALRecoveryMode::kAbsoluteConsistency;
  // A restored checkpoint's WAL holds a few small writes in many vnodes (the
  // checkpoint copied it instead of flushing: state_checkpoint.cc). Flushing it
  // on open wrote one SST per vnode it touched, each synced: most of a
  // takeover's open under load. Kept in the memtables instead, it is flushed
  // with the next batch's writes (RocksDB keeps the old log until then, and a
  // checkpoint copies it along).
  if (options.whole_wal) dbo.avoid_flush_during_recovery = true;
  // RocksDB loads each column family's table readers on open with
  // max_file_opening_threads threads (default 16), creating them even for a
  // column family of one file: with one column family per vnode that was
  // ~4,000 threads and about half of every open (V = 256). Vnodes hold few
  // files each, so one thread per column family loses nothing.
  dbo.max_file_opening_threads = 1;
  // Open each SST's table reader (footer, index, filter: several reads per file)
  // when a read first needs it, not all of them in DB::Open (RocksDB's default,
  // max_open_files = -1). An open, a takeover's above all, then costs O(1) in
  // the files: it read every file's blocks before, ~0.2-0.6 s under load once
  // the page cache had dropped them (bench/results/takeover_open.md), and
  // growing with the state. RocksDB still preloads up to 16 files. The bound is
  // far above what an instance holds, so readers are not evicted in steady state.
  dbo.max_open_files = kMaxOpenFiles;
  // Nor read the table properties of files at open to seed compaction's
  // estimates; they are filled in as files are opened.
  dbo.skip_stats_update_on_db_open = true;
  // An open with sync_open = false leaves the OPTIONS file to after the open
  // (open_without_sync.h): RocksDB must go on when it cannot write it. (False
  // is RocksDB 7's default; later versions turn it on.)
  dbo.fail_if_options_file_error = false;
  // A checkpoint copies the MANIFEST whole (it is the one file a checkpoint does not
  // hard-link), so it is in every delta; each commit's flushes append to it. With
  // RocksDB's default (1 GiB before it starts a new one) the delta grew by ~5 KiB per
  // batch for as long as the DB stayed open (1.5 MiB at batch 300, 32 vnodes touched
  // per batch). A new MANIFEST starts with a snapshot of the live files, small here.
  dbo.max_manifest_file_size = kMaxManifestBytes;
  // Write flush and compaction output back as it is written, 1 MiB at a time
  // (sync_file_range), instead of leaving the kernel to flush a compaction's
  // hundreds of MB in one burst when its dirty limits trip. Those bursts hold
  // up the file system's journal for everyone on the disk: a takeover's link
  // calls on a replica of the same host waited up to a second behind them
  // (bench/results/spark_recovery.md, 4 GiB). RocksDB's default is 0 (never).
  dbo.bytes_per_sync = 1 << 20;
  return dbo;
}

// Options shared by every vnode column family of one instance: one block cache
// and (through DBOptions) one write-buffer budget, so memory does not grow
// with the number of vnodes. A bloom filter answers lookups of absent keys
// (new keys, common in streaming state) without reading data blocks.
rocksdb::ColumnFamilyOptions VnodeColumnFamilyOptions(const StateOptions& options, size_t vnodes_held,
                                                      const rocksdb::CompactionFilter* ttl_filter) {
  rocksdb::ColumnFamilyOptions cfo;
  // Every vnode column family, created, opened or imported, drops expired TTL
  // entries when it compacts (state/ttl_filter.h).
  cfo.compaction_filter = ttl_filter;
  // RocksDB 7.8 enforces the shared WriteBufferManager budget by flushing one
  // column family per write, which does not keep up with one column family
  // per vnode (a 384 MB load held ~330 MB of memtables at V = 256), and
  // atomic_flush, which flushes them all at once, stalls writes on tiny L0
  // files (~20 MB/s). So each vnode's memtable is sized to its share of the
  // budget, and the budget holds by construction: about 2 x budget at most
  // (one active and one flushing memtable per vnode).
  cfo.write_buffer_size = options.write_buffer_size != 0
                              ? options.write_buffer_size
                              : std::clamp<uint64_t>(options.write_buffer_budget / std::max<size_t>(vnodes_held, 1),
                                                     1ull << 20, 64ull << 20);
  // Batches arrive sorted (StateBackendImpl::OrderKeys), so each insert lands near the
  // previous one in the same memtable. The default insert path reuses its
  // position only for strictly adjacent keys and otherwise searches from the
  // top of the skip list; with a hint (one per memtable: every key has the
  // same, empty prefix) RocksDB repairs the previous position level by level,
  // O(log distance). A put_batch of 100k random int64 keys over 256 vnodes
  // ran ~1.3x faster.
  cfo.memtable_insert_with_hint_prefix_extractor.reset(rocksdb::NewCappedPrefixTransform(0));
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  // Keyed state is read by point lookups. A hash index in each data block
  // takes a lookup straight to its restart interval, and short intervals keep
  // the linear scan after it short (RocksDB's default is 16). Both cost a few
  // bytes per entry; the delta encoding of keys they give up matters little
  // next to the values.
  // The hash index has one byte per bucket and marks a bucket that keys of two
  // restart intervals share as a collision, which falls back to the binary
  // search. At RocksDB's default of 0.75 keys per bucket that is about half of
  // all lookups (1 - e^-0.75 with 4-key intervals); at 0.25 it is about a
  // fifth, for 4 bytes per key instead of 1.3 (~3% of a 100-byte value's
  // entry). A 100k-key get_batch then took 5-10% less CPU.
  table.data_block_index_type = rocksdb::BlockBasedTableOptions::kDataBlockBinaryAndHash;
  table.data_block_hash_table_util_ratio = 0.25;
  table.block_restart_interval = 4;
  // 16 KiB data blocks (RocksDB's default is 4 KiB): the index, which every
  // open SST file keeps in memory, is 4x smaller, which matters at the TB
  // scale Rhino targets, and a batch of sorted lookups crosses fewer blocks
  // (~10% faster). A single cold lookup reads 16 KiB instead of 4 KiB, which
  // costs an SSD about the same.
  table.block_size = 16 * 1024;
  cfo.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  // RocksDB's default universal options (a run of 4 sorted runs triggers,
  // size amplification up to 200%): the ones measured in bench/README.md.
  // Universal keeps each sorted run on its own level, so a DB written under
  // one style opens under the other.
  if (options.compaction == CompactionStyle::kUniversal) cfo.compaction_style = rocksdb::kCompactionStyleUniversal;
  return cfo;
}

Status CheckFlushThreads(const StateOptions& options) {
  if (options.flush_threads >= 1 && options.flush_threads <= 16) return Status::OK();
  return Status::InvalidArgument("flush_threads must be 1..16, got " + std::to_string(options.flush_threads));
}

}  // namespace state_internal
}  // namespace rhino
