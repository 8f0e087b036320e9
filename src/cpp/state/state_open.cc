// StateBackendImpl's life: opening a DB (new or existing) with its column
// families and Rhino's metadata, closing it, and restoring a checkpoint into
// a new one.
#include <rocksdb/db.h>
#include <rocksdb/convenience.h>
#include <rocksdb/options.h>
#include <rocksdb/utilities/options_util.h>
#include <rocksdb/write_buffer_manager.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <set>
#include <thread>

#include "state/open_without_sync.h"
#include "state/rocksdb_options.h"
#include "state/state_backend_impl.h"
#include "state/state_internal.h"
#include "state/ttl_filter.h"
#include "util/fs.h"
#include "util/sched.h"

namespace rhino {
using namespace state_internal;

namespace {

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

// Whether an existing DB was created with allow_ingest_behind, from its
// OPTIONS file (RocksDB does not check a DB option against it at open, and the
// reserved last level must have been reserved since the DB began). A DB whose
// OPTIONS file cannot be read is taken as one without: it only loses the
// early hand-over (StateBackend::takes_bases).
bool CreatedWithIngestBehind(const std::string& dir) {
  rocksdb::ConfigOptions co;
  co.ignore_unknown_options = true;
  co.ignore_unsupported_options = true;
  rocksdb::DBOptions dbo;
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
  if (!rocksdb::LoadLatestOptions(co, dir, &dbo, &cfs).ok()) return false;
  return dbo.allow_ingest_behind;
}

}  // namespace

Status StateBackendImpl::Open(const std::string& dir, const StateOptions& options,
                          std::unique_ptr<StateBackendImpl>* out) {
  RHINO_RETURN_IF_ERROR(CheckFlushThreads(options));
  if (!IsValidOperatorId(options.operator_id)) {
    return Status::InvalidArgument("operator id '" + options.operator_id +
                                   "' is not [A-Za-z0-9_.-]{1,128} without a leading '.'");
  }
  const bool exists = fs::Exists(fs::Join(dir, "CURRENT"));
  if (!exists && (options.error_if_missing || options.read_only)) {
    return Status::NotFound("no Rhino state (RocksDB) at " + dir);
  }
  std::unique_ptr<StateBackendImpl> b(new StateBackendImpl());
  b->dir_ = dir;
  b->read_only_ = options.read_only;
  b->checkpoint_wal_bytes_ = options.checkpoint_wal_bytes;
  b->compaction_ = options.compaction;
  b->wbm_ = std::make_shared<rocksdb::WriteBufferManager>(options.write_buffer_budget);
  rocksdb::DBOptions dbo = DbOptions(options, b->wbm_);
  // RocksDB's last level is kept for the bases of vnodes taken on one (issue
  // 48, state/vnode_base.cc): for a new DB from its start, for an existing one
  // only if it was so created.
  b->takes_bases_ = exists ? CreatedWithIngestBehind(dir) : true;
  dbo.allow_ingest_behind = b->takes_bases_;
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
  if (s.ok()) s = b->LoadVnodeBases();
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

Status StateBackendImpl::OpenDb(const rocksdb::DBOptions& dbo, bool read_only, bool exists,
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

Status StateBackendImpl::LoadMetadata(const StateOptions& options, bool exists, rocksdb::ColumnFamilyHandle* meta_cf) {
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

Status StateBackendImpl::MapColumnFamilies(const std::vector<std::string>& cf_names,
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

Status StateBackendImpl::WriteDeferredOptionsFile() {
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

StateBackendImpl::~StateBackendImpl() {
  if (options_file_writer_.joinable()) options_file_writer_.join();
  if (!db_) return;
  for (auto* h : cf_by_vnode_)
    if (h) db_->DestroyColumnFamilyHandle(h);
  if (default_cf_) db_->DestroyColumnFamilyHandle(default_cf_);
  db_->Close();
}

Status StateBackendImpl::Restore(const ReplicaStore& store, const std::string& operator_id, uint32_t instance,
                             uint64_t checkpoint_id, const std::string& target_dir,
                             const RestoreOptions& restore_options, const StateOptions& options,
                             std::unique_ptr<StateBackendImpl>* out, RestoreStats* stats) {
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

}  // namespace rhino
