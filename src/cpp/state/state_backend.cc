#include "rhino/state_backend.h"

#include "open_without_sync.h"

#include <rocksdb/db.h>
#include <rocksdb/metadata.h>
#include <rocksdb/cache.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/perf_level.h>
#include <rocksdb/slice_transform.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>
#include <rocksdb/write_buffer_manager.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <thread>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "state/state_internal.h"
#include "state/ttl_filter.h"
#include "util/fs.h"
#include "util/sched.h"

namespace rhino {
using namespace state_internal;

namespace {

// The first 8 bytes of a key as a big-endian integer, zero-padded: integer
// order of two prefixes is bytewise order of the keys whenever the prefixes
// differ (a shorter key pads with zeros, the smallest byte), so the sort
// compares whole keys only on ties, and int64 keys never tie.
inline uint64_t BytewisePrefix(std::string_view key) {
  uint64_t x = 0;
  std::memcpy(&x, key.data(), std::min<size_t>(key.size(), sizeof(x)));
  return __builtin_bswap64(x);  // the first byte becomes the most significant
}

// RocksDB's default perf level counts every key comparison (and more) in a
// thread-local perf context. Rhino never reads those counters, and with
// librocksdb as a shared library each count is a __tls_get_addr call in the
// innermost loops (~10-20% of a batched put). The level is per thread, so
// each call that reads or writes sets it for the thread it runs on.
inline void SkipPerfCounters() { rocksdb::SetPerfLevel(rocksdb::PerfLevel::kDisable); }

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
  // Batches arrive sorted (StateBackend::OrderKeys), so each insert lands near the
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

}  // namespace

bool ParseCompactionStyle(const std::string& name, CompactionStyle* out) {
  if (name == "level") {
    *out = CompactionStyle::kLevel;
  } else if (name == "universal") {
    *out = CompactionStyle::kUniversal;
  } else {
    return false;
  }
  return true;
}

const char* CompactionStyleName(CompactionStyle style) {
  return style == CompactionStyle::kUniversal ? "universal" : "level";
}

std::string VnodeColumnFamilyName(uint32_t vnode) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "vnode-%05u", vnode);
  return buf;
}

bool ParseVnodeColumnFamilyName(const std::string& name, uint32_t* vnode) {
  if (name.size() < 7 || name.compare(0, 6, "vnode-") != 0) return false;
  uint64_t v = 0;
  for (size_t i = 6; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    v = v * 10 + static_cast<uint64_t>(name[i] - '0');
    if (v > (1u << 30)) return false;
  }
  *vnode = static_cast<uint32_t>(v);
  return true;
}

// ---------------------------------------------------------------- WriteBatch

struct WriteBatch::Rep {
  rocksdb::WriteBatch batch;
};
WriteBatch::WriteBatch() : rep_(std::make_unique<Rep>()) {}
WriteBatch::~WriteBatch() = default;
WriteBatch::WriteBatch(WriteBatch&&) noexcept = default;
WriteBatch& WriteBatch::operator=(WriteBatch&&) noexcept = default;
size_t WriteBatch::count() const { return static_cast<size_t>(rep_->batch.Count()); }
void WriteBatch::Clear() { rep_->batch.Clear(); }

// ---------------------------------------------------------------- MultiGetResult

struct MultiGetResult::Rep {
  static constexpr size_t kMissing = static_cast<size_t>(-1);
  std::vector<rocksdb::PinnableSlice> pinned;  // values, in the order they were looked up
  std::vector<size_t> slot;                    // key index -> index into pinned, or kMissing
  std::vector<size_t> order;                   // index into pinned -> key index
  std::vector<uint8_t> hit;                    // index into pinned -> found
};
MultiGetResult::MultiGetResult() : rep_(std::make_unique<Rep>()) {}
MultiGetResult::~MultiGetResult() = default;
size_t MultiGetResult::size() const { return rep_->slot.size(); }
bool MultiGetResult::found(size_t i) const { return rep_->slot[i] != Rep::kMissing; }
std::string_view MultiGetResult::value(size_t i) const {
  const rocksdb::PinnableSlice& p = rep_->pinned[rep_->slot[i]];
  return std::string_view(p.data(), p.size());
}
size_t MultiGetResult::key_index(size_t j) const { return rep_->order[j]; }
bool MultiGetResult::found_at(size_t j) const { return rep_->hit[j] != 0; }
std::string_view MultiGetResult::value_at(size_t j) const {
  const rocksdb::PinnableSlice& p = rep_->pinned[j];
  return std::string_view(p.data(), p.size());
}

// ---------------------------------------------------------------- open / close

namespace {

constexpr uint64_t kMaxManifestBytes = 64 << 10;
constexpr int kMaxOpenFiles = 1 << 16;

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

// The column families of a new DB: the default one (Rhino's metadata), then
// one per vnode of options.vnodes (all when empty).
Status NewColumnFamilyNames(const StateOptions& options, std::vector<std::string>* cf_names) {
  Partitioner p;
  RHINO_RETURN_IF_ERROR(Partitioner::Create(options.partitioner, &p));
  if (p.num_vnodes() > kMaxNumVnodes) {
    return Status::InvalidArgument("num_vnodes " + std::to_string(p.num_vnodes()) + " is over the limit of " +
                                   std::to_string(kMaxNumVnodes) + " vnodes (column families) per instance");
  }
  std::set<uint32_t> vnodes(options.vnodes.begin(), options.vnodes.end());
  if (vnodes.size() != options.vnodes.size()) return Status::InvalidArgument("duplicate vnodes in options");
  if (vnodes.empty())
    for (uint32_t v = 0; v < p.num_vnodes(); ++v) vnodes.insert(v);
  cf_names->push_back(rocksdb::kDefaultColumnFamilyName);
  for (uint32_t v : vnodes) {
    if (v >= p.num_vnodes()) {
      return Status::UnknownVnode("vnode " + std::to_string(v) + " is outside [0, " + std::to_string(p.num_vnodes()) +
                                  ")");
    }
    cf_names->push_back(VnodeColumnFamilyName(v));
  }
  return Status::OK();
}

}  // namespace

Status StateBackend::Open(const std::string& dir, const StateOptions& options,
                          std::unique_ptr<StateBackend>* out) {
  RHINO_RETURN_IF_ERROR(CheckFlushThreads(options));
  if (!IsValidOperatorId(options.operator_id)) {
    return Status::InvalidArgument("operator id '" + options.operator_id +
                                   "' is not [A-Za-z0-9_.-]{1,128} without a leading '.'");
  }
  const bool exists = fs::Exists(fs::Join(dir, "CURRENT"));
  if (!exists && (options.error_if_missing || options.read_only)) {
    return Status::NotFound("no Rhino state (RocksDB) at " + dir);
  }
  std::unique_ptr<StateBackend> b(new StateBackend());
  b->dir_ = dir;
  b->read_only_ = options.read_only;
  b->checkpoint_wal_bytes_ = options.checkpoint_wal_bytes;
  b->compaction_ = options.compaction;
  b->wbm_ = std::make_shared<rocksdb::WriteBufferManager>(options.write_buffer_budget);
  rocksdb::DBOptions dbo = DbOptions(options, b->wbm_);
  std::shared_ptr<OpenWithoutSyncFileSystem> unsynced;
  if (!options.sync_open && !options.read_only) {
    b->env_ = NewOpenWithoutSyncEnv(&unsynced);
    dbo.env = b->env_.get();
  }
  std::vector<std::string> cf_names;
  if (exists) {
    rocksdb::Status s = rocksdb::DB::ListColumnFamilies(dbo, dir, &cf_names);
    if (!s.ok()) return FromRocks(s, "listing column families of " + dir);
  } else {
    RHINO_RETURN_IF_ERROR(NewColumnFamilyNames(options, &cf_names));
    // The DB's own directory too, durably: RocksDB creates it if missing but
    // never fsyncs its parent, so a power loss could take a new DB whole.
    RHINO_RETURN_IF_ERROR(fs::MakeDirs(dir));
  }
  b->ttl_filter_ = std::make_shared<TtlCompactionFilter>();
  b->cf_options_ = std::make_shared<rocksdb::ColumnFamilyOptions>(
      VnodeColumnFamilyOptions(options, cf_names.size() > 1 ? cf_names.size() - 1 : 1, b->ttl_filter_.get()));
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  RHINO_RETURN_IF_ERROR(b->OpenDb(dbo, options.read_only, exists, cf_names, &handles));
  if (unsynced) unsynced->EndOpen();
  // Until the metadata is validated, a failure must still close the handles.
  Status s = b->LoadMetadata(options, exists, handles[0]);
  if (s.ok()) s = b->MapColumnFamilies(cf_names, handles);
  if (!s.ok()) {
    for (auto* h : handles) b->db_->DestroyColumnFamilyHandle(h);
    b->db_.reset();
    return s;
  }
  if (unsynced) {
    // The file system refused the OPTIONS file during the open: it is written
    // now, off the caller's critical path (open_without_sync.h).
    {
      MutexLock l(&b->options_file_mu_);  // no other thread sees b yet: for the analysis
      b->options_file_deferred_ = true;
    }
    b->options_file_writer_ = std::thread([raw = b.get()] {
      Status ws = raw->WriteDeferredOptionsFile();
      if (!ws.ok()) std::fprintf(stderr, "rhino: %s\n", ws.ToString().c_str());
    });
  }
  *out = std::move(b);
  return Status::OK();
}

Status StateBackend::OpenDb(const rocksdb::DBOptions& dbo, bool read_only, bool exists,
                            const std::vector<std::string>& cf_names,
                            std::vector<rocksdb::ColumnFamilyHandle*>* handles) {
  const rocksdb::ColumnFamilyOptions& cfo = *cf_options_;
  // A new DB is opened with the default column family only, and its vnode
  // column families are then created in one CreateColumnFamilies call: with
  // create_missing_column_families RocksDB creates them one at a time and
  // rewrites the OPTIONS file (which lists every column family) after each,
  // which is O(V^2) and took ~24 s for the default V = 256.
  std::vector<rocksdb::ColumnFamilyDescriptor> descs;
  for (const auto& n : cf_names) {
    descs.emplace_back(n, cfo);
    if (!exists) break;
  }
  rocksdb::DB* raw = nullptr;
  rocksdb::Status rs = read_only ? rocksdb::DB::OpenForReadOnly(dbo, dir_, descs, handles, &raw)
                                 : rocksdb::DB::Open(dbo, dir_, descs, handles, &raw);
  if (!rs.ok()) return FromRocks(rs, "opening state at " + dir_);
  db_.reset(raw);
  if (exists || cf_names.size() <= 1) return Status::OK();
  std::vector<std::string> vnode_cfs(cf_names.begin() + 1, cf_names.end());
  std::vector<rocksdb::ColumnFamilyHandle*> created;
  rs = db_->CreateColumnFamilies(cfo, vnode_cfs, &created);
  handles->insert(handles->end(), created.begin(), created.end());
  if (!rs.ok()) {
    for (auto* h : *handles) db_->DestroyColumnFamilyHandle(h);
    db_.reset();
    return FromRocks(rs, "creating vnode column families in " + dir_);
  }
  return Status::OK();
}

Status StateBackend::LoadMetadata(const StateOptions& options, bool exists, rocksdb::ColumnFamilyHandle* meta_cf) {
  std::string meta;
  rocksdb::Status rs = db_->Get(rocksdb::ReadOptions(), meta_cf, kMetaKey, &meta);
  PartitionerOptions popts = options.partitioner;
  if (rs.ok()) {
    try {
      json j = json::parse(meta);
      PartitionerOptions stored = PartitionerFromJson(j.at("partitioner"));
      if (exists && options.check_partitioner && !SamePartitioner(stored, options.partitioner)) {
        return Status::InvalidArgument("state at " + dir_ + " was created with " + DescribePartitioner(stored) +
                                       ", opened with " + DescribePartitioner(options.partitioner));
      }
      popts = stored;
      operator_id_ = j.at("operator_id").get<std::string>();
      instance_ = j.at("instance").get<uint32_t>();
    } catch (const std::exception& e) {
      return Status::Corruption("Rhino metadata of " + dir_ + " is malformed: " + e.what());
    }
  } else if (rs.IsNotFound() && !options.read_only) {
    // A new DB: its partitioner and identity, written once and for good.
    operator_id_ = options.operator_id;
    instance_ = options.instance;
    json j = {{"partitioner", PartitionerJson(popts)}, {"operator_id", operator_id_}, {"instance", instance_}};
    rocksdb::WriteOptions wo;
    wo.sync = true;
    rs = db_->Put(wo, meta_cf, kMetaKey, j.dump());
    if (!rs.ok()) return FromRocks(rs, "writing Rhino metadata");
  } else {
    return rs.ok() ? Status::NotFound("no Rhino metadata in " + dir_)
                   : FromRocks(rs, "reading Rhino metadata of " + dir_);
  }
  // The TTL clock of the version this DB is at (a restored checkpoint's own).
  std::string clock;
  uint64_t raw = 0;
  if (db_->Get(rocksdb::ReadOptions(), meta_cf, kTtlClockKey, &clock).ok() && DecodeU64(clock, &raw)) {
    ttl_filter_->set_clock(static_cast<int64_t>(raw));
  }
  return Partitioner::Create(popts, &partitioner_);
}

Status StateBackend::MapColumnFamilies(const std::vector<std::string>& cf_names,
                                       const std::vector<rocksdb::ColumnFamilyHandle*>& handles) {
  WriterMutexLock lock(&cf_mu_);  // Open's, before anybody else sees this object: for the analysis
  cf_by_vnode_.assign(partitioner_.num_vnodes(), nullptr);
  for (size_t i = 1; i < handles.size(); ++i) {  // 0: the default column family, metadata only
    uint32_t v;
    if (!ParseVnodeColumnFamilyName(cf_names[i], &v) || v >= partitioner_.num_vnodes()) {
      cf_by_vnode_.assign(partitioner_.num_vnodes(), nullptr);
      return Status::Corruption("unexpected column family '" + cf_names[i] + "' in " + dir_);
    }
    cf_by_vnode_[v] = handles[i];
  }
  default_cf_ = handles[0];
  return Status::OK();
}

Status StateBackend::WriteDeferredOptionsFile() {
  MutexLock l(&options_file_mu_);
  if (!options_file_deferred_ || !db_) return Status::OK();
  options_file_deferred_ = false;
  // SetOptions persists every option to a new OPTIONS file (DBImpl::
  // WriteOptionsFile), even when, as here, the value it sets is unchanged
  // (SetDBOptions skips that case). It also appends an empty edit to the
  // MANIFEST. The metadata column family's own option is set.
  const bool off = db_->GetOptions(default_cf_).disable_auto_compactions;
  rocksdb::Status rs = db_->SetOptions(default_cf_, {{"disable_auto_compactions", off ? "true" : "false"}});
  if (!rs.ok()) return FromRocks(rs, "writing the OPTIONS file of " + dir_);
  return Status::OK();
}

StateBackend::~StateBackend() {
  if (options_file_writer_.joinable()) options_file_writer_.join();
  if (!db_) return;
  for (auto* h : cf_by_vnode_)
    if (h) db_->DestroyColumnFamilyHandle(h);
  if (default_cf_) db_->DestroyColumnFamilyHandle(default_cf_);
  db_->Close();
}

Status StateBackend::Restore(const ReplicaStore& store, const std::string& operator_id, uint32_t instance,
                             uint64_t checkpoint_id, const std::string& target_dir,
                             const RestoreOptions& restore_options, const StateOptions& options,
                             std::unique_ptr<StateBackend>* out, RestoreStats* stats) {
  RHINO_RETURN_IF_ERROR(CheckFlushThreads(options));  // before anything is written
  std::optional<LatencyCritical> critical;  // util/sched.h
  if (restore_options.latency_critical) critical.emplace();
  RHINO_RETURN_IF_ERROR(store.Restore(operator_id, instance, checkpoint_id, target_dir, restore_options, stats));
  // The open runs on this thread (max_file_opening_threads = 1): its figures
  // are read inside the timed interval, so CPU + wait <= open_seconds.
  auto t0 = std::chrono::steady_clock::now();
  const ThreadSchedStat sched0 = ReadThreadSchedStat();
  StateOptions o = options;
  o.check_partitioner = false;  // the checkpoint knows its partitioner
  o.error_if_missing = true;
  o.whole_wal = true;
  Status s = Open(target_dir, o, out);
  if (!s.ok()) {
    // RocksDB refused the directory we just built (e.g. a corrupt SST that
    // verify=size cannot see): leave `target_dir` absent, never half-usable,
    // so the caller can retry with another checkpoint or replica.
    fs::RemoveAll(target_dir);
    return s;
  }
  const ThreadSchedStat sched1 = ReadThreadSchedStat();
  stats->open_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats->open_cpu_seconds = static_cast<double>(sched1.cpu_ns - sched0.cpu_ns) / 1e9;
  stats->open_wait_seconds = static_cast<double>(sched1.wait_ns - sched0.wait_ns) / 1e9;
  return Status::OK();
}

// ---------------------------------------------------------------- routing

std::vector<uint32_t> StateBackend::vnodes() const {
  ReaderMutexLock lock(&cf_mu_);
  std::vector<uint32_t> r;
  for (uint32_t v = 0; v < cf_by_vnode_.size(); ++v)
    if (cf_by_vnode_[v]) r.push_back(v);
  return r;
}

Status StateBackend::Route(std::string_view key, rocksdb::ColumnFamilyHandle** cf) const {
  uint32_t v = partitioner_.VnodeOfBytes(key);
  *cf = cf_by_vnode_[v];
  if (*cf == nullptr) {
    return Status::UnknownVnode("key routes to vnode " + std::to_string(v) + ", which instance " +
                                std::to_string(instance_) + " of '" + operator_id_ + "' does not hold");
  }
  return Status::OK();
}

Status StateBackend::CheckWritable() const {
  if (read_only_) return Status::InvalidArgument("state at " + dir_ + " is open read-only");
  if (write_error_.load(std::memory_order_acquire)) {
    // RocksDB stops all writes after a failed WAL append or flush (a "hard"
    // background error; a full disk is the usual cause), and stays stopped
    // after space is freed until it is resumed: it then flushes the
    // memtables and starts a new WAL. The failed write was never applied,
    // so resuming loses nothing that was committed.
    rocksdb::Status r = db_->Resume();
    if (r.IsBusy()) {
      // A full disk starts RocksDB's own recovery, which polls for free
      // space (every 5 s, and for about one memtable's worth of room).
      return Status::Busy("state at " + dir_ + " is recovering from a write error (RocksDB resumes writes by "
                          "itself once its disk has room again; committed state is intact): retry shortly");
    }
    if (!r.ok()) {
      return FromRocks(r, "state at " + dir_ + " stopped accepting writes after a write error, and resuming "
                          "failed (free space on its disk, then retry; committed state is intact)");
    }
    write_error_.store(false, std::memory_order_release);
  }
  return Status::OK();
}

Status StateBackend::WriteResult(const rocksdb::Status& s, const std::string& context) const {
  if (s.IsIOError()) write_error_.store(true, std::memory_order_release);
  return FromRocks(s, context);
}

// ---------------------------------------------------------------- single keys

Status StateBackend::Get(std::string_view key, std::string* value) const {
  ReaderMutexLock lock(&cf_mu_);
  rocksdb::ColumnFamilyHandle* cf;
  RHINO_RETURN_IF_ERROR(Route(key, &cf));
  SkipPerfCounters();
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cf, rocksdb::Slice(key.data(), key.size()), value);
  if (s.IsNotFound()) return Status::NotFound("key not found");
  return FromRocks(s, "get");
}

Status StateBackend::Put(std::string_view key, std::string_view value) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  ReaderMutexLock lock(&cf_mu_);
  rocksdb::ColumnFamilyHandle* cf;
  RHINO_RETURN_IF_ERROR(Route(key, &cf));
  SkipPerfCounters();
  return WriteResult(db_->Put(rocksdb::WriteOptions(), cf, rocksdb::Slice(key.data(), key.size()),
                              rocksdb::Slice(value.data(), value.size())),
                     "put");
}

Status StateBackend::Delete(std::string_view key) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  ReaderMutexLock lock(&cf_mu_);
  rocksdb::ColumnFamilyHandle* cf;
  RHINO_RETURN_IF_ERROR(Route(key, &cf));
  SkipPerfCounters();
  return WriteResult(db_->Delete(rocksdb::WriteOptions(), cf, rocksdb::Slice(key.data(), key.size())), "delete");
}

// ---------------------------------------------------------------- batches

Status StateBackend::BatchPut(WriteBatch* batch, const std::vector<std::string_view>& keys,
                              const std::vector<std::string_view>& values) const {
  if (keys.size() != values.size()) {
    return Status::InvalidArgument(std::to_string(keys.size()) + " keys but " + std::to_string(values.size()) +
                                   " values");
  }
  return AddToBatch(batch, keys, &values);
}

Status StateBackend::BatchDelete(WriteBatch* batch, const std::vector<std::string_view>& keys) const {
  return AddToBatch(batch, keys, nullptr);
}

// The keys of a batch, grouped by vnode and, within a vnode, ordered bytewise
// (the column families' comparator). Stable: a key repeated in a batch keeps
// its relative order, so its last write still wins. Batches are applied in
// this order because each vnode's memtable is a skip list that keeps an
// insert hint (see VnodeColumnFamilyOptions), so ordered inserts skip most of
// the search, and MultiGet can be told its input is sorted.
struct StateBackend::VnodeOrder {
  std::vector<uint32_t> vnode_of;  // per key, in input order
  std::vector<size_t> start;       // keys of vnode v are order[start[v], start[v + 1])
  std::vector<size_t> order;       // key indices, grouped and sorted
};

Status StateBackend::OrderKeys(const std::vector<std::string_view>& keys, VnodeOrder* out) const {
  const size_t n = keys.size(), num_vnodes = cf_by_vnode_.size();
  out->vnode_of.resize(n);
  out->start.assign(num_vnodes + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t v = partitioner_.VnodeOfBytes(keys[i]);
    if (cf_by_vnode_[v] == nullptr) {
      rocksdb::ColumnFamilyHandle* unused;
      return Route(keys[i], &unused);  // the UnknownVnode error
    }
    out->vnode_of[i] = v;
    ++out->start[v + 1];
  }
  for (size_t v = 0; v < num_vnodes; ++v) out->start[v + 1] += out->start[v];
  // Counting sort by vnode (stable), then each vnode's run by key.
  struct Entry {
    uint64_t prefix;
    size_t index;
  };
  std::vector<Entry> entries(n);
  std::vector<size_t> next(out->start.begin(), out->start.end() - 1);
  for (size_t i = 0; i < n; ++i) entries[next[out->vnode_of[i]]++] = Entry{BytewisePrefix(keys[i]), i};
  auto less = [&](const Entry& a, const Entry& b) {
    if (a.prefix != b.prefix) return a.prefix < b.prefix;
    // string_view's operator< compares like memcmp (as unsigned char), then
    // by length: exactly RocksDB's BytewiseComparator. Equal keys keep their
    // input order.
    const int c = keys[a.index].compare(keys[b.index]);
    return c != 0 ? c < 0 : a.index < b.index;
  };
  for (size_t v = 0; v < num_vnodes; ++v) {
    std::sort(entries.begin() + out->start[v], entries.begin() + out->start[v + 1], less);
  }
  out->order.resize(n);
  for (size_t j = 0; j < n; ++j) out->order[j] = entries[j].index;
  return Status::OK();
}

// Puts (values != null) or deletes, in (vnode, key) order; nothing is added
// if any key's vnode is not held.
Status StateBackend::AddToBatch(WriteBatch* batch, const std::vector<std::string_view>& keys,
                                const std::vector<std::string_view>* values) const {
  ReaderMutexLock lock(&cf_mu_);
  VnodeOrder vo;
  RHINO_RETURN_IF_ERROR(OrderKeys(keys, &vo));
  rocksdb::WriteBatch& wb = batch->rep_->batch;
  if (wb.Count() == 0) {
    // Size a fresh batch once: growing it by doubling copied the whole batch
    // several times over and was a third of building a 10 MB batch. Per entry:
    // a tag and three varints (column family, key and value lengths).
    size_t bytes = 12;  // the batch header (sequence number and count)
    for (size_t i = 0; i < keys.size(); ++i) bytes += 16 + keys[i].size() + (values ? (*values)[i].size() : 0);
    if (bytes > wb.GetDataSize()) wb = rocksdb::WriteBatch(bytes);
  }
  for (size_t i : vo.order) {
    rocksdb::ColumnFamilyHandle* cf = cf_by_vnode_[vo.vnode_of[i]];
    rocksdb::Slice key(keys[i].data(), keys[i].size());
    rocksdb::Status s = values ? wb.Put(cf, key, rocksdb::Slice((*values)[i].data(), (*values)[i].size()))
                               : wb.Delete(cf, key);
    if (!s.ok()) return FromRocks(s, values ? "batch put" : "batch delete");
  }
  return Status::OK();
}

Status StateBackend::Write(WriteBatch* batch, std::optional<uint64_t> version, std::optional<int64_t> batch_time_ms) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  if (batch_time_ms && (!version || *batch_time_ms == std::numeric_limits<int64_t>::min())) {
    return Status::InvalidArgument(version ? "a batch time of INT64_MIN is not a TTL clock"
                                           : "a batch time is written with a version only");
  }
  ReaderMutexLock lock(&cf_mu_);
  if (version) {
    rocksdb::Status s = batch->rep_->batch.Put(default_cf_, kVersionKey, EncodeU64(*version));
    if (s.ok() && batch_time_ms) {
      s = batch->rep_->batch.Put(default_cf_, kTtlClockKey, EncodeU64(static_cast<uint64_t>(*batch_time_ms)));
    }
    if (!s.ok()) return FromRocks(s, "batch version");
  }
  SkipPerfCounters();
  RHINO_RETURN_IF_ERROR(WriteResult(db_->Write(rocksdb::WriteOptions(), &batch->rep_->batch), "write batch"));
  batch->Clear();
  if (version && batch_time_ms) ttl_filter_->set_clock(*batch_time_ms);
  return Status::OK();
}

Status StateBackend::MultiGet(const std::vector<std::string_view>& keys, MultiGetResult* out) const {
  ReaderMutexLock lock(&cf_mu_);
  const size_t n = keys.size();
  MultiGetResult::Rep& r = *out->rep_;
  r.pinned.clear();
  r.pinned.resize(n);
  r.slot.assign(n, MultiGetResult::Rep::kMissing);
  r.order.clear();
  r.hit.assign(n, 0);
  if (n == 0) return Status::OK();
  // One single-column-family MultiGet per vnode, over keys sorted as RocksDB
  // would sort them (so it is told sorted_input and skips its own sort).
  // RocksDB 7.8's multi-column-family MultiGet calls MultiGetImpl once per
  // column family, and each call walks *all* n keys (to clear their
  // timestamps), so one batch over V vnodes cost O(n * V): 100k keys over 256
  // vnodes were 3x slower than per-key Get.
  VnodeOrder vo;
  RHINO_RETURN_IF_ERROR(OrderKeys(keys, &vo));
  const size_t num_vnodes = cf_by_vnode_.size();
  const std::vector<size_t>& start = vo.start;
  const std::vector<size_t>& order = vo.order;
  // The keys, copied in lookup order into one buffer. RocksDB copies each key
  // into its LookupKey deep inside a long chain of dependent work, so a key
  // read from the caller's buffer (in input order, i.e. at a random place)
  // stalled there on a cache miss: perf put 7% of a 100k-key get_batch in that
  // one memcpy. Here the loads are independent of each other, and the CPU
  // overlaps their misses.
  size_t key_bytes = 0;
  for (size_t i = 0; i < n; ++i) key_bytes += keys[i].size();
  std::string sorted_keys(key_bytes, '\0');
  std::vector<rocksdb::Slice> slices(n);
  {
    char* p = sorted_keys.data();
    for (size_t j = 0; j < n; ++j) {
      const std::string_view k = keys[order[j]];
      std::memcpy(p, k.data(), k.size());
      slices[j] = rocksdb::Slice(p, k.size());
      p += k.size();
    }
  }
  std::vector<rocksdb::PinnableSlice>& pinned = r.pinned;  // in sorted order
  std::vector<rocksdb::Status> statuses(n);
  // One snapshot for all vnodes, so the batch reads one consistent cut, as a
  // single multi-column-family MultiGet would.
  SkipPerfCounters();
  rocksdb::ReadOptions ro;
  const rocksdb::Snapshot* snapshot = read_only_ ? nullptr : db_->GetSnapshot();
  ro.snapshot = snapshot;
  for (size_t v = 0; v < num_vnodes; ++v) {
    const size_t a = start[v], b = start[v + 1];
    if (a == b) continue;
    db_->MultiGet(ro, cf_by_vnode_[v], b - a, slices.data() + a, pinned.data() + a, statuses.data() + a,
                  /*sorted_input=*/true);
  }
  if (snapshot != nullptr) db_->ReleaseSnapshot(snapshot);
  for (size_t j = 0; j < n; ++j) {
    const size_t i = order[j];
    if (statuses[j].ok()) {
      r.slot[i] = j;
      r.hit[j] = 1;
    } else if (!statuses[j].IsNotFound()) {
      return FromRocks(statuses[j], "multiget");
    }
  }
  r.order = std::move(vo.order);
  return Status::OK();
}

Status StateBackend::BatchOrder(const std::vector<std::string_view>& keys, std::vector<size_t>* order) const {
  ReaderMutexLock lock(&cf_mu_);
  VnodeOrder vo;
  RHINO_RETURN_IF_ERROR(OrderKeys(keys, &vo));
  *order = std::move(vo.order);
  return Status::OK();
}

Status StateBackend::Scan(uint32_t vnode,
                          const std::function<bool(std::string_view, std::string_view)>& fn) const {
  ReaderMutexLock lock(&cf_mu_);
  if (vnode >= cf_by_vnode_.size() || cf_by_vnode_[vnode] == nullptr) {
    return Status::UnknownVnode("instance " + std::to_string(instance_) + " of '" + operator_id_ +
                                "' does not hold vnode " + std::to_string(vnode));
  }
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf_by_vnode_[vnode]));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (!fn(std::string_view(it->key().data(), it->key().size()),
            std::string_view(it->value().data(), it->value().size())))
      break;
  }
  return FromRocks(it->status(), "scan");
}

// ---------------------------------------------------------------- metadata

std::optional<uint64_t> StateBackend::ReadU64Meta(const std::string& key) const {
  std::string v;
  uint64_t r;
  if (db_->Get(rocksdb::ReadOptions(), default_cf_, key, &v).ok() && DecodeU64(v, &r)) return r;
  return std::nullopt;
}

std::optional<uint64_t> StateBackend::version() const { return ReadU64Meta(kVersionKey); }
std::optional<uint64_t> StateBackend::last_checkpoint() const { return ReadU64Meta(kCheckpointKey); }

// ---------------------------------------------------------------- TTL

std::optional<int64_t> StateBackend::ttl_clock() const { return ttl_filter_->clock(); }

Status StateBackend::SetTtlClock(int64_t ms) {
  if (ms == std::numeric_limits<int64_t>::min()) {
    return Status::InvalidArgument("INT64_MIN is not a TTL clock");
  }
  RHINO_RETURN_IF_ERROR(CheckWritable());
  RHINO_RETURN_IF_ERROR(
      WriteResult(db_->Put(rocksdb::WriteOptions(), default_cf_, kTtlClockKey, EncodeU64(static_cast<uint64_t>(ms))),
                  "ttl clock"));
  ttl_filter_->set_clock(ms);
  return Status::OK();
}

uint64_t StateBackend::LiveVnodeBytes() const {
  uint64_t total = 0;
  for (auto* h : cf_by_vnode_) {
    uint64_t v = 0;
    if (h && db_->GetIntProperty(h, "rocksdb.live-sst-files-size", &v)) total += v;
  }
  return total;
}

Status StateBackend::CompactVnodes(uint64_t* bytes_before, uint64_t* bytes_after) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  // Checkpoints may have left recent writes in the memtables (and the WAL):
  // flushed first, they are counted in bytes_before and filtered like the rest.
  RHINO_RETURN_IF_ERROR(FlushColumnFamilies());
  ReaderMutexLock lock(&cf_mu_);
  *bytes_before = LiveVnodeBytes();
  rocksdb::CompactRangeOptions o;
  // Rewrite the bottommost level too, which holds most of the data: the
  // point is to run every entry through the TTL filter. kForceOptimized
  // skips the files this very compaction has just written there.
  o.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
  o.canceled = &compaction_aborted_;
  for (auto* h : cf_by_vnode_) {
    if (!h) continue;
    rocksdb::Status rs = db_->CompactRange(o, h, nullptr, nullptr);
    if (compaction_aborted_.load()) return Status::Aborted("the compaction of " + dir_ + " was aborted");
    RHINO_RETURN_IF_ERROR(WriteResult(rs, "compacting " + dir_));
  }
  *bytes_after = LiveVnodeBytes();
  return Status::OK();
}

void StateBackend::AbortCompaction() { compaction_aborted_.store(true); }

Status StateBackend::Stats(std::vector<VnodeStats>* out) const {
  ReaderMutexLock lock(&cf_mu_);
  out->clear();
  for (uint32_t v = 0; v < cf_by_vnode_.size(); ++v) {
    if (!cf_by_vnode_[v]) continue;
    VnodeStats st;
    st.vnode = v;
    db_->GetIntProperty(cf_by_vnode_[v], "rocksdb.estimate-num-keys", &st.estimated_keys);
    db_->GetIntProperty(cf_by_vnode_[v], "rocksdb.live-sst-files-size", &st.sst_bytes);
    out->push_back(st);
  }
  return Status::OK();
}

Status StateBackend::Flush() {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  return FlushColumnFamilies();
}

Status StateBackend::FlushColumnFamilies() {
  ReaderMutexLock lock(&cf_mu_);
  std::vector<rocksdb::ColumnFamilyHandle*> cfs{default_cf_};
  for (auto* h : cf_by_vnode_)
    if (h) cfs.push_back(h);
  // RocksDB 7.8 flushes a list of column families one at a time, waiting for
  // each (without atomic_flush, which VnodeColumnFamilyOptions explains we do
  // not use), so no two vnodes' flushes ever overlapped, however many flush
  // threads there were. Asking for every flush first and waiting afterwards
  // lets the flush threads share them.
  rocksdb::FlushOptions start;
  start.wait = false;
  RHINO_RETURN_IF_ERROR(WriteResult(db_->Flush(start, cfs), "flush"));
  return WriteResult(db_->Flush(rocksdb::FlushOptions(), cfs), "flush");
}

Status StateBackend::WaitForCompactions(std::chrono::milliseconds timeout, bool* settled) const {
  if (!db_) return Status::InvalidArgument("state backend is closed");
  // A read-only DB runs no flush or compaction, whatever its LSM would need:
  // nothing is under way, and waiting could never end.
  *settled = read_only_;
  if (read_only_) return Status::OK();
  // Per-column-family properties are summed over every vnode; the running
  // counts are per DB, the queue lengths per process (every StateBackend of a
  // process shares RocksDB's default Env and its thread pools). All are
  // in-memory counters, cheap to poll.
  rocksdb::Env* env = db_->GetEnv();
  auto working = [this, env]() {
    uint64_t v = 0;
    if (db_->GetAggregatedIntProperty("rocksdb.mem-table-flush-pending", &v) && v != 0) return true;
    for (const char* p : {"rocksdb.num-running-compactions", "rocksdb.num-running-flushes"})
      if (db_->GetIntProperty(p, &v) && v != 0) return true;
    return env->GetThreadPoolQueueLen(rocksdb::Env::LOW) != 0 || env->GetThreadPoolQueueLen(rocksdb::Env::HIGH) != 0;
  };
  auto compaction_pending = [this]() {
    uint64_t v = 0;
    return db_->GetAggregatedIntProperty("rocksdb.compaction-pending", &v) && v != 0;
  };
  // "compaction-pending" is RocksDB's NeedsCompaction, which does not always
  // agree with what its picker will run: under universal compaction (RocksDB
  // 7.8) a column family at exactly its trigger of sorted runs has a score of
  // 1 and stays pending, while the picker's last fallback only fires above the
  // trigger, so nothing ever runs. RocksDB schedules a compaction as soon as a
  // flush or compaction that makes one due ends, so "pending" with nothing
  // running or queued, for a quiet period far longer than that hand-off, is
  // settled: nothing will start before the next write. A quiet period under
  // way when the timeout expires is finished first, so a call may return up
  // to kQuiet late (callers poll in slices shorter than any useful period).
  constexpr auto kQuiet = std::chrono::milliseconds(100);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::optional<std::chrono::steady_clock::time_point> idle_since;
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (working()) {
      idle_since.reset();
    } else if (!compaction_pending()) {
      break;
    } else if (!idle_since) {
      idle_since = now;
    } else if (now - *idle_since >= kQuiet) {
      break;
    }
    if (now >= deadline && !idle_since) return Status::OK();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  *settled = true;
  return Status::OK();
}

}  // namespace rhino
