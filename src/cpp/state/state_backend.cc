#include "rhino/state_backend.h"

#include <rocksdb/db.h>
#include <rocksdb/metadata.h>
#include <rocksdb/cache.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>
#include <rocksdb/write_buffer_manager.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "util/crash_point.h"
#include "util/fs.h"

namespace rhino {
namespace {

using json = nlohmann::json;

constexpr char kMetaKey[] = "rhino:meta";
constexpr char kVersionKey[] = "rhino:version";
constexpr char kCheckpointKey[] = "rhino:checkpoint";
constexpr char kExportManifest[] = "RHINO_EXPORT.json";

Status FromRocks(const rocksdb::Status& s, const std::string& context) {
  if (s.ok()) return Status::OK();
  std::string msg = context + ": " + s.ToString();
  if (s.IsNotFound()) return Status::NotFound(msg);
  if (s.IsCorruption()) return Status::Corruption(msg);
  if (s.IsInvalidArgument()) return Status::InvalidArgument(msg);
  if (s.IsNoSpace()) return Status::NoSpace(msg);
  if (s.IsBusy() || s.IsTryAgain()) return Status::Busy(msg);
  if (s.IsIOError() && s.ToString().find("No space left") != std::string::npos) return Status::NoSpace(msg);
  return Status::IOError(msg);
}

std::string EncodeU64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

bool DecodeU64(const std::string& s, uint64_t* v) {
  if (s.size() != 8) return false;
  *v = 0;
  for (int i = 7; i >= 0; --i) *v = (*v << 8) | static_cast<unsigned char>(s[i]);
  return true;
}

std::string Hex(const std::string& s) {
  static const char* k = "0123456789abcdef";
  std::string r;
  for (unsigned char c : s) {
    r.push_back(k[c >> 4]);
    r.push_back(k[c & 15]);
  }
  return r;
}

std::string Unhex(const std::string& h) {
  std::string r;
  auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i + 1 < h.size(); i += 2) r.push_back(static_cast<char>((v(h[i]) << 4) | v(h[i + 1])));
  return r;
}

json PartitionerJson(const PartitionerOptions& p) {
  return {{"num_key_groups", p.num_key_groups}, {"num_vnodes", p.num_vnodes}, {"seed", p.seed}};
}

PartitionerOptions PartitionerFromJson(const json& j) {
  PartitionerOptions p;
  p.num_key_groups = j.at("num_key_groups").get<uint32_t>();
  p.num_vnodes = j.at("num_vnodes").get<uint32_t>();
  p.seed = j.at("seed").get<uint64_t>();
  return p;
}

bool SamePartitioner(const PartitionerOptions& a, const PartitionerOptions& b) {
  return a.num_key_groups == b.num_key_groups && a.num_vnodes == b.num_vnodes && a.seed == b.seed;
}

std::string DescribePartitioner(const PartitionerOptions& p) {
  return "K=" + std::to_string(p.num_key_groups) + " V=" + std::to_string(p.num_vnodes) +
         " seed=" + std::to_string(p.seed);
}

// The keys of a batch, grouped by vnode and, within a vnode, ordered bytewise
// (the column families' comparator). Stable: a key repeated in a batch keeps
// its relative order, so its last write still wins. Batches are applied in
// this order because each vnode's memtable is a skip list that remembers where
// its previous insert went, so ordered inserts skip most of the search (a
// put_batch of 100k random int64 keys over 256 vnodes took about half the
// time), and MultiGet can be told its input is sorted.
struct VnodeOrder {
  std::vector<uint32_t> vnode_of;  // per key, in input order
  std::vector<size_t> start;       // keys of vnode v are order[start[v], start[v + 1])
  std::vector<size_t> order;       // key indices, grouped and sorted
};

// False, with *bad = the first key whose vnode has no column family (not held).
bool OrderByVnode(const Partitioner& p, const std::vector<rocksdb::ColumnFamilyHandle*>& cf_by_vnode,
                  const std::vector<std::string_view>& keys, VnodeOrder* out, size_t* bad) {
  const size_t n = keys.size(), num_vnodes = cf_by_vnode.size();
  out->vnode_of.resize(n);
  out->start.assign(num_vnodes + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t v = p.VnodeOfBytes(keys[i]);
    if (cf_by_vnode[v] == nullptr) {
      *bad = i;
      return false;
    }
    out->vnode_of[i] = v;
    ++out->start[v + 1];
  }
  for (size_t v = 0; v < num_vnodes; ++v) out->start[v + 1] += out->start[v];
  out->order.resize(n);
  std::vector<size_t> next(out->start.begin(), out->start.end() - 1);
  for (size_t i = 0; i < n; ++i) out->order[next[out->vnode_of[i]]++] = i;
  // string_view's operator< compares like memcmp (as unsigned char), then by length:
  // exactly RocksDB's BytewiseComparator.
  for (size_t v = 0; v < num_vnodes; ++v) {
    std::stable_sort(out->order.begin() + out->start[v], out->order.begin() + out->start[v + 1],
                     [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  }
  return true;
}

// Options shared by every vnode column family of one instance: one block cache
// and (through DBOptions) one write-buffer budget, so memory does not grow
// with the number of vnodes. A bloom filter answers lookups of absent keys
// (new keys, common in streaming state) without reading data blocks.
rocksdb::ColumnFamilyOptions VnodeColumnFamilyOptions(const StateOptions& options, size_t vnodes_held) {
  rocksdb::ColumnFamilyOptions cfo;
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
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  cfo.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  return cfo;
}

}  // namespace

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
};
MultiGetResult::MultiGetResult() : rep_(std::make_unique<Rep>()) {}
MultiGetResult::~MultiGetResult() = default;
size_t MultiGetResult::size() const { return rep_->slot.size(); }
bool MultiGetResult::found(size_t i) const { return rep_->slot[i] != Rep::kMissing; }
std::string_view MultiGetResult::value(size_t i) const {
  const rocksdb::PinnableSlice& p = rep_->pinned[rep_->slot[i]];
  return std::string_view(p.data(), p.size());
}

// ---------------------------------------------------------------- open / close

Status StateBackend::Open(const std::string& dir, const StateOptions& options,
                          std::unique_ptr<StateBackend>* out) {
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
  b->wbm_ = std::make_shared<rocksdb::WriteBufferManager>(options.write_buffer_budget);

  rocksdb::DBOptions dbo;
  dbo.create_if_missing = true;
  dbo.create_missing_column_families = true;
  dbo.write_buffer_manager = b->wbm_;
  dbo.max_background_jobs = 2;
  // RocksDB loads each column family's table readers on open with
  // max_file_opening_threads threads (default 16), creating them even for a
  // column family of one file: with one column family per vnode that was
  // ~4,000 threads and about half of every open (V = 256). Vnodes hold few
  // files each, so one thread per column family loses nothing.
  dbo.max_file_opening_threads = 1;
  std::vector<std::string> cf_names;
  if (exists) {
    rocksdb::Status s = rocksdb::DB::ListColumnFamilies(dbo, dir, &cf_names);
    if (!s.ok()) return FromRocks(s, "listing column families of " + dir);
  } else {
    Partitioner p;
    RHINO_RETURN_IF_ERROR(Partitioner::Create(options.partitioner, &p));
    std::set<uint32_t> vnodes(options.vnodes.begin(), options.vnodes.end());
    if (vnodes.size() != options.vnodes.size()) return Status::InvalidArgument("duplicate vnodes in options");
    if (vnodes.empty())
      for (uint32_t v = 0; v < p.num_vnodes(); ++v) vnodes.insert(v);
    cf_names.push_back(rocksdb::kDefaultColumnFamilyName);
    for (uint32_t v : vnodes) {
      if (v >= p.num_vnodes()) {
        return Status::UnknownVnode("vnode " + std::to_string(v) + " is outside [0, " +
                                    std::to_string(p.num_vnodes()) + ")");
      }
      cf_names.push_back(VnodeColumnFamilyName(v));
    }
    RHINO_RETURN_IF_ERROR(fs::MakeDirs(fs::Parent(dir)));
  }
  b->cf_options_ = std::make_shared<rocksdb::ColumnFamilyOptions>(
      VnodeColumnFamilyOptions(options, cf_names.size() > 1 ? cf_names.size() - 1 : 1));
  const rocksdb::ColumnFamilyOptions& cfo = *b->cf_options_;

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
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status rs = options.read_only ? rocksdb::DB::OpenForReadOnly(dbo, dir, descs, &handles, &raw)
                                         : rocksdb::DB::Open(dbo, dir, descs, &handles, &raw);
  if (!rs.ok()) return FromRocks(rs, "opening state at " + dir);
  b->db_.reset(raw);
  if (!exists && cf_names.size() > 1) {
    std::vector<std::string> vnode_cfs(cf_names.begin() + 1, cf_names.end());
    std::vector<rocksdb::ColumnFamilyHandle*> created;
    rs = b->db_->CreateColumnFamilies(cfo, vnode_cfs, &created);
    handles.insert(handles.end(), created.begin(), created.end());
    if (!rs.ok()) {
      for (auto* h : handles) b->db_->DestroyColumnFamilyHandle(h);
      b->db_.reset();
      return FromRocks(rs, "creating vnode column families in " + dir);
    }
  }

  // Until the metadata is validated, a failure must still close the handles.
  auto fail = [&](Status s) {
    for (auto* h : handles) b->db_->DestroyColumnFamilyHandle(h);
    b->db_.reset();
    return s;
  };
  std::string meta;
  rs = b->db_->Get(rocksdb::ReadOptions(), handles[0], kMetaKey, &meta);
  PartitionerOptions popts = options.partitioner;
  if (rs.ok()) {
    try {
      json j = json::parse(meta);
      PartitionerOptions stored = PartitionerFromJson(j.at("partitioner"));
      if (exists && options.check_partitioner && !SamePartitioner(stored, options.partitioner)) {
        return fail(Status::InvalidArgument("state at " + dir + " was created with " + DescribePartitioner(stored) +
                                            ", opened with " + DescribePartitioner(options.partitioner)));
      }
      popts = stored;
      b->operator_id_ = j.at("operator_id").get<std::string>();
      b->instance_ = j.at("instance").get<uint32_t>();
    } catch (const std::exception& e) {
      return fail(Status::Corruption("Rhino metadata of " + dir + " is malformed: " + e.what()));
    }
  } else if (rs.IsNotFound() && !options.read_only) {
    b->operator_id_ = options.operator_id;
    b->instance_ = options.instance;
    json j = {{"partitioner", PartitionerJson(popts)},
              {"operator_id", b->operator_id_},
              {"instance", b->instance_}};
    rocksdb::WriteOptions wo;
    wo.sync = true;
    rs = b->db_->Put(wo, handles[0], kMetaKey, j.dump());
    if (!rs.ok()) return fail(FromRocks(rs, "writing Rhino metadata"));
  } else {
    return fail(rs.ok() ? Status::NotFound("no Rhino metadata in " + dir)
                        : FromRocks(rs, "reading Rhino metadata of " + dir));
  }
  Status ps = Partitioner::Create(popts, &b->partitioner_);
  if (!ps.ok()) return fail(ps);

  b->cf_by_vnode_.assign(b->partitioner_.num_vnodes(), nullptr);
  for (size_t i = 0; i < handles.size(); ++i) {
    uint32_t v;
    if (i == 0) continue;  // default column family: metadata only
    if (!ParseVnodeColumnFamilyName(cf_names[i], &v) || v >= b->partitioner_.num_vnodes()) {
      return fail(Status::Corruption("unexpected column family '" + cf_names[i] + "' in " + dir));
    }
    b->cf_by_vnode_[v] = handles[i];
  }
  b->default_cf_ = handles[0];
  *out = std::move(b);
  return Status::OK();
}

StateBackend::~StateBackend() {
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
  RHINO_RETURN_IF_ERROR(store.Restore(operator_id, instance, checkpoint_id, target_dir, restore_options, stats));
  auto t0 = std::chrono::steady_clock::now();
  StateOptions o = options;
  o.check_partitioner = false;  // the checkpoint knows its partitioner
  o.error_if_missing = true;
  Status s = Open(target_dir, o, out);
  if (!s.ok()) {
    // RocksDB refused the directory we just built (e.g. a corrupt SST that
    // verify=size cannot see): leave `target_dir` absent, never half-usable,
    // so the caller can retry with another checkpoint or replica.
    fs::RemoveAll(target_dir);
    return s;
  }
  stats->open_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

// ---------------------------------------------------------------- routing

std::vector<uint32_t> StateBackend::vnodes() const {
  std::shared_lock lock(cf_mu_);
  std::vector<uint32_t> r;
  for (uint32_t v = 0; v < cf_by_vnode_.size(); ++v)
    if (cf_by_vnode_[v]) r.push_back(v);
  return r;
}

bool StateBackend::HasVnode(uint32_t vnode) const {
  std::shared_lock lock(cf_mu_);
  return vnode < cf_by_vnode_.size() && cf_by_vnode_[vnode] != nullptr;
}

// REQUIRES: cf_mu_ held (shared).
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
  return Status::OK();
}

// ---------------------------------------------------------------- single keys

Status StateBackend::Get(std::string_view key, std::string* value) const {
  std::shared_lock lock(cf_mu_);
  rocksdb::ColumnFamilyHandle* cf;
  RHINO_RETURN_IF_ERROR(Route(key, &cf));
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cf, rocksdb::Slice(key.data(), key.size()), value);
  if (s.IsNotFound()) return Status::NotFound("key not found");
  return FromRocks(s, "get");
}

Status StateBackend::Put(std::string_view key, std::string_view value) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  std::shared_lock lock(cf_mu_);
  rocksdb::ColumnFamilyHandle* cf;
  RHINO_RETURN_IF_ERROR(Route(key, &cf));
  return FromRocks(db_->Put(rocksdb::WriteOptions(), cf, rocksdb::Slice(key.data(), key.size()),
                            rocksdb::Slice(value.data(), value.size())),
                   "put");
}

Status StateBackend::Delete(std::string_view key) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  std::shared_lock lock(cf_mu_);
  rocksdb::ColumnFamilyHandle* cf;
  RHINO_RETURN_IF_ERROR(Route(key, &cf));
  return FromRocks(db_->Delete(rocksdb::WriteOptions(), cf, rocksdb::Slice(key.data(), key.size())), "delete");
}

// ---------------------------------------------------------------- batches

Status StateBackend::BatchPut(WriteBatch* batch, const std::vector<std::string_view>& keys,
                              const std::vector<std::string_view>& values) const {
  if (keys.size() != values.size()) {
    return Status::InvalidArgument(std::to_string(keys.size()) + " keys but " + std::to_string(values.size()) +
                                   " values");
  }
  std::shared_lock lock(cf_mu_);
  VnodeOrder vo;
  size_t bad = 0;
  if (!OrderByVnode(partitioner_, cf_by_vnode_, keys, &vo, &bad)) {
    rocksdb::ColumnFamilyHandle* unused;
    return Route(keys[bad], &unused);  // the UnknownVnode error; nothing was added
  }
  for (size_t i : vo.order) {
    rocksdb::Status s = batch->rep_->batch.Put(cf_by_vnode_[vo.vnode_of[i]],
                                               rocksdb::Slice(keys[i].data(), keys[i].size()),
                                               rocksdb::Slice(values[i].data(), values[i].size()));
    if (!s.ok()) return FromRocks(s, "batch put");
  }
  return Status::OK();
}

Status StateBackend::BatchDelete(WriteBatch* batch, const std::vector<std::string_view>& keys) const {
  std::shared_lock lock(cf_mu_);
  VnodeOrder vo;
  size_t bad = 0;
  if (!OrderByVnode(partitioner_, cf_by_vnode_, keys, &vo, &bad)) {
    rocksdb::ColumnFamilyHandle* unused;
    return Route(keys[bad], &unused);  // the UnknownVnode error; nothing was added
  }
  for (size_t i : vo.order) {
    rocksdb::Status s = batch->rep_->batch.Delete(cf_by_vnode_[vo.vnode_of[i]],
                                                  rocksdb::Slice(keys[i].data(), keys[i].size()));
    if (!s.ok()) return FromRocks(s, "batch delete");
  }
  return Status::OK();
}

Status StateBackend::Write(WriteBatch* batch, std::optional<uint64_t> version) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  std::shared_lock lock(cf_mu_);
  if (version) {
    rocksdb::Status s = batch->rep_->batch.Put(default_cf_, kVersionKey, EncodeU64(*version));
    if (!s.ok()) return FromRocks(s, "batch version");
  }
  RHINO_RETURN_IF_ERROR(FromRocks(db_->Write(rocksdb::WriteOptions(), &batch->rep_->batch), "write batch"));
  batch->Clear();
  return Status::OK();
}

Status StateBackend::MultiGet(const std::vector<std::string_view>& keys, MultiGetResult* out) const {
  std::shared_lock lock(cf_mu_);
  const size_t n = keys.size();
  MultiGetResult::Rep& r = *out->rep_;
  r.pinned.clear();
  r.pinned.resize(n);
  r.slot.assign(n, MultiGetResult::Rep::kMissing);
  if (n == 0) return Status::OK();
  // One single-column-family MultiGet per vnode, over keys sorted as RocksDB
  // would sort them (so it is told sorted_input and skips its own sort).
  // RocksDB 7.8's multi-column-family MultiGet calls MultiGetImpl once per
  // column family, and each call walks *all* n keys (to clear their
  // timestamps), so one batch over V vnodes cost O(n * V): 100k keys over 256
  // vnodes were 3x slower than per-key Get.
  VnodeOrder vo;
  size_t bad = 0;
  if (!OrderByVnode(partitioner_, cf_by_vnode_, keys, &vo, &bad)) {
    rocksdb::ColumnFamilyHandle* unused;
    return Route(keys[bad], &unused);  // the UnknownVnode error
  }
  const size_t num_vnodes = cf_by_vnode_.size();
  const std::vector<size_t>& start = vo.start;
  const std::vector<size_t>& order = vo.order;
  std::vector<rocksdb::Slice> slices(n);
  for (size_t j = 0; j < n; ++j) slices[j] = rocksdb::Slice(keys[order[j]].data(), keys[order[j]].size());
  std::vector<rocksdb::PinnableSlice>& pinned = r.pinned;  // in sorted order
  std::vector<rocksdb::Status> statuses(n);
  // One snapshot for all vnodes, so the batch reads one consistent cut, as a
  // single multi-column-family MultiGet would.
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
    } else if (!statuses[j].IsNotFound()) {
      return FromRocks(statuses[j], "multiget");
    }
  }
  return Status::OK();
}

Status StateBackend::Scan(uint32_t vnode,
                          const std::function<bool(std::string_view, std::string_view)>& fn) const {
  std::shared_lock lock(cf_mu_);
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

Status StateBackend::Stats(std::vector<VnodeStats>* out) const {
  std::shared_lock lock(cf_mu_);
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
  std::shared_lock lock(cf_mu_);
  std::vector<rocksdb::ColumnFamilyHandle*> cfs{default_cf_};
  for (auto* h : cf_by_vnode_)
    if (h) cfs.push_back(h);
  return FromRocks(db_->Flush(rocksdb::FlushOptions(), cfs), "flush");
}

// ---------------------------------------------------------------- checkpoints

Status StateBackend::Checkpoint(ReplicaStore* store, uint64_t checkpoint_id, uint64_t epoch, Manifest* out) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard admin(admin_mu_);
  const std::optional<uint64_t> last = last_checkpoint();
  std::vector<uint64_t> committed;
  RHINO_RETURN_IF_ERROR(store->ListCheckpoints(operator_id_, instance_, &committed));
  const bool last_committed =
      last && std::binary_search(committed.begin(), committed.end(), *last);
  // Ids must increase. The one exception is a retry of the last id after a
  // crash between writing it into the state and committing its manifest: the
  // state then names a checkpoint that no store holds.
  if (last && (checkpoint_id < *last || (checkpoint_id == *last && last_committed))) {
    return Status::InvalidArgument("checkpoint ids must increase: this state was last checkpointed as " +
                                   std::to_string(*last) + ", got " + std::to_string(checkpoint_id));
  }
  std::unique_ptr<ReplicaStore::Lock> lock;
  RHINO_RETURN_IF_ERROR(store->AcquireLock(false, &lock));

  // The checkpoint id goes into the state itself, so a DB restored from it
  // knows its parent for the next incremental checkpoint.
  rocksdb::WriteOptions wo;
  RHINO_RETURN_IF_ERROR(FromRocks(db_->Put(wo, default_cf_, kCheckpointKey, EncodeU64(checkpoint_id)), "meta"));
  auto undo_meta = [&] {
    if (last) {
      db_->Put(wo, default_cf_, kCheckpointKey, EncodeU64(*last));
    } else {
      db_->Delete(wo, default_cf_, kCheckpointKey);
    }
  };

  std::string staging;
  Status s = store->NewStagingDir("ckpt", &staging);
  if (!s.ok()) {
    undo_meta();
    return s;
  }
  auto fail = [&](Status st) {
    fs::RemoveAll(staging);
    undo_meta();
    return st;
  };

  // Rhino §4.2.2 phase 2, step 1: a RocksDB checkpoint (flushes memtables,
  // hard-links the immutable SST files, copies the small mutable ones).
  const std::string db_dir = fs::Join(staging, "db");
  {
    rocksdb::Checkpoint* raw = nullptr;
    rocksdb::Status rs = rocksdb::Checkpoint::Create(db_.get(), &raw);
    std::unique_ptr<rocksdb::Checkpoint> cp(raw);
    if (rs.ok()) rs = cp->CreateCheckpoint(db_dir, /*log_size_for_flush=*/0);
    if (!rs.ok()) return fail(FromRocks(rs, "creating RocksDB checkpoint"));
  }
  CrashPoint("checkpoint.after_rocksdb_checkpoint");

  // The parent is the checkpoint the delta is computed against: the last one
  // this state took or was restored from, or else (after a crash lost that
  // one) the newest committed checkpoint before this id. Any committed
  // checkpoint is a safe reference, since a file is reused only when it is the
  // same inode as the pooled copy, and pooled files never change.
  std::optional<uint64_t> parent_id;
  if (last_committed && *last < checkpoint_id) {
    parent_id = *last;
  } else {
    for (uint64_t id : committed)
      if (id < checkpoint_id) parent_id = id;
  }
  Manifest parent;
  bool has_parent = parent_id && store->ReadManifest(operator_id_, instance_, *parent_id, &parent).ok();
  std::unordered_map<std::string, const FileEntry*> parent_by_name;
  std::set<std::string> parent_identities;
  if (has_parent) {
    for (const auto& f : parent.files) {
      parent_by_name[f.name] = &f;
      parent_identities.insert(f.identity);
    }
  }

  Manifest m;
  m.operator_id = operator_id_;
  m.instance = instance_;
  m.checkpoint_id = checkpoint_id;
  m.has_parent = has_parent;
  m.parent_id = has_parent ? *parent_id : 0;
  m.epoch = epoch;
  m.version = version().value_or(0);
  m.partitioner.num_key_groups = partitioner_.num_key_groups();
  m.partitioner.num_vnodes = partitioner_.num_vnodes();
  m.partitioner.seed = partitioner_.seed();
  m.vnodes = vnodes();
  m.created_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  std::vector<std::string> names;
  s = fs::ListDir(db_dir, &names);
  if (!s.ok()) return fail(s);
  for (size_t i = 0; i < names.size(); ++i) {
    FileEntry e;
    e.name = names[i];
    auto it = parent_by_name.find(e.name);
    s = store->PoolFile(fs::Join(db_dir, e.name), it == parent_by_name.end() ? nullptr : it->second, &e);
    if (!s.ok()) return fail(s);
    e.in_delta = parent_identities.count(e.identity) == 0;
    m.files.push_back(std::move(e));
    if (i == names.size() / 2) CrashPoint("checkpoint.mid_pool");
  }
  s = store->CommitManifest(m);
  if (!s.ok()) return fail(s);
  fs::RemoveAll(staging);
  *out = std::move(m);
  return Status::OK();
}

// ---------------------------------------------------------------- vnode export / import

Status StateBackend::ExportVnodes(const std::vector<uint32_t>& vnodes, const std::string& export_dir) {
  std::lock_guard admin(admin_mu_);
  if (fs::Exists(export_dir)) return Status::AlreadyExists("export directory " + export_dir + " already exists");
  std::shared_lock lock(cf_mu_);
  std::set<uint32_t> uniq(vnodes.begin(), vnodes.end());
  if (uniq.empty()) return Status::InvalidArgument("no vnodes to export");
  for (uint32_t v : uniq) {
    if (v >= cf_by_vnode_.size() || !cf_by_vnode_[v]) {
      return Status::UnknownVnode("cannot export vnode " + std::to_string(v) + ": instance " +
                                  std::to_string(instance_) + " of '" + operator_id_ + "' does not hold it");
    }
  }
  RHINO_RETURN_IF_ERROR(fs::MakeDirs(fs::Parent(export_dir)));
  const std::string stage = export_dir + ".rhino-export-" + std::to_string(::getpid()) + "-" + fs::RandomHex(6);
  if (::mkdir(stage.c_str(), 0755) != 0) return Status::FromErrno(errno, "mkdir " + stage);
  auto fail = [&](Status st) {
    fs::RemoveAll(stage);
    return st;
  };
  rocksdb::Checkpoint* raw = nullptr;
  rocksdb::Status rs = rocksdb::Checkpoint::Create(db_.get(), &raw);
  std::unique_ptr<rocksdb::Checkpoint> cp(raw);
  if (!rs.ok()) return fail(FromRocks(rs, "checkpoint object"));
  json manifest = {{"format", 1},
                   {"operator_id", operator_id_},
                   {"instance", instance_},
                   {"partitioner", PartitionerJson(PartitionerOptions{partitioner_.num_key_groups(),
                                                                      partitioner_.num_vnodes(),
                                                                      partitioner_.seed()})},
                   {"version", version() ? json(*version()) : json(nullptr)}};
  json jvnodes = json::array();
  for (uint32_t v : uniq) {
    const std::string name = VnodeColumnFamilyName(v);
    rocksdb::ExportImportFilesMetaData* meta = nullptr;
    rs = cp->ExportColumnFamily(cf_by_vnode_[v], fs::Join(stage, name), &meta);
    std::unique_ptr<rocksdb::ExportImportFilesMetaData> meta_owner(meta);
    if (!rs.ok()) return fail(FromRocks(rs, "exporting " + name));
    json files = json::array();
    for (const auto& f : meta->files) {
      files.push_back({{"name", f.relative_filename.empty() ? fs::Basename(f.name) : f.relative_filename},
                       {"file_number", f.file_number},
                       {"size", f.size},
                       {"level", f.level},
                       {"smallest_seqno", f.smallest_seqno},
                       {"largest_seqno", f.largest_seqno},
                       {"smallestkey", Hex(f.smallestkey)},
                       {"largestkey", Hex(f.largestkey)},
                       {"num_entries", f.num_entries},
                       {"num_deletions", f.num_deletions}});
    }
    jvnodes.push_back({{"vnode", v}, {"comparator", meta->db_comparator_name}, {"files", files}});
  }
  manifest["vnodes"] = jvnodes;
  Status s = fs::WriteFileAtomic(fs::Join(stage, kExportManifest), manifest.dump());
  if (s.ok()) s = fs::FsyncPath(stage);
  if (s.ok()) s = fs::Rename(stage, export_dir);
  if (!s.ok()) return fail(s);
  return fs::FsyncParent(export_dir);
}

Status StateBackend::ImportVnodes(const std::string& export_dir, std::vector<uint32_t>* imported) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard admin(admin_mu_);
  imported->clear();
  std::string data;
  Status s = fs::ReadFile(fs::Join(export_dir, kExportManifest), &data);
  if (s.IsNotFound()) return Status::NotFound("no vnode export at " + export_dir);
  RHINO_RETURN_IF_ERROR(s);
  json manifest;
  std::vector<std::pair<uint32_t, rocksdb::ExportImportFilesMetaData>> todo;
  try {
    manifest = json::parse(data);
    PartitionerOptions p = PartitionerFromJson(manifest.at("partitioner"));
    PartitionerOptions mine{partitioner_.num_key_groups(), partitioner_.num_vnodes(), partitioner_.seed()};
    if (!SamePartitioner(p, mine)) {
      return Status::InvalidArgument("export was made with " + DescribePartitioner(p) + ", this state uses " +
                                     DescribePartitioner(mine));
    }
    for (const auto& jv : manifest.at("vnodes")) {
      uint32_t v = jv.at("vnode").get<uint32_t>();
      const std::string dir = fs::Join(export_dir, VnodeColumnFamilyName(v));
      rocksdb::ExportImportFilesMetaData meta;
      meta.db_comparator_name = jv.at("comparator").get<std::string>();
      for (const auto& jf : jv.at("files")) {
        rocksdb::LiveFileMetaData f;
        std::string name = jf.at("name").get<std::string>();
        if (!IsPlainFileName(name)) return Status::PathOutsideStore("export names file '" + name + "'");
        f.relative_filename = name;
        f.name = "/" + name;
        f.directory = dir;
        f.db_path = dir;
        f.file_number = jf.at("file_number").get<uint64_t>();
        f.size = jf.at("size").get<uint64_t>();
        f.level = jf.at("level").get<int>();
        f.smallest_seqno = jf.at("smallest_seqno").get<uint64_t>();
        f.largest_seqno = jf.at("largest_seqno").get<uint64_t>();
        f.smallestkey = Unhex(jf.at("smallestkey").get<std::string>());
        f.largestkey = Unhex(jf.at("largestkey").get<std::string>());
        f.num_entries = jf.at("num_entries").get<uint64_t>();
        f.num_deletions = jf.at("num_deletions").get<uint64_t>();
        f.column_family_name = VnodeColumnFamilyName(v);
        meta.files.push_back(std::move(f));
      }
      todo.emplace_back(v, std::move(meta));
    }
  } catch (const std::exception& e) {
    return Status::Corruption("malformed vnode export at " + export_dir + ": " + e.what());
  }

  std::unique_lock lock(cf_mu_);
  for (const auto& [v, meta] : todo) {
    if (v >= cf_by_vnode_.size()) {
      return Status::UnknownVnode("export holds vnode " + std::to_string(v) + ", outside [0, " +
                                  std::to_string(cf_by_vnode_.size()) + ")");
    }
    if (cf_by_vnode_[v]) {
      return Status::AlreadyExists("instance " + std::to_string(instance_) + " already holds vnode " +
                                   std::to_string(v));
    }
  }
  const rocksdb::ColumnFamilyOptions& cfo = *cf_options_;  // the same cache and filter as every vnode
  rocksdb::ImportColumnFamilyOptions io;
  io.move_files = true;  // link into the DB, then unlink from the export: O(files)
  std::vector<uint32_t> done;
  for (const auto& [v, meta] : todo) {
    rocksdb::ColumnFamilyHandle* h = nullptr;
    // An empty vnode exports no files, and RocksDB refuses to import an empty
    // file list: it becomes an empty column family.
    rocksdb::Status rs = meta.files.empty()
                             ? db_->CreateColumnFamily(cfo, VnodeColumnFamilyName(v), &h)
                             : db_->CreateColumnFamilyWithImport(cfo, VnodeColumnFamilyName(v), io, meta, &h);
    if (!rs.ok()) {
      // Roll back the vnodes imported so far: all or nothing.
      for (uint32_t d : done) {
        db_->DropColumnFamily(cf_by_vnode_[d]);
        db_->DestroyColumnFamilyHandle(cf_by_vnode_[d]);
        cf_by_vnode_[d] = nullptr;
      }
      return FromRocks(rs, "importing vnode " + std::to_string(v));
    }
    cf_by_vnode_[v] = h;
    done.push_back(v);
  }
  *imported = done;
  fs::RemoveAll(export_dir);
  return Status::OK();
}

Status StateBackend::DropVnodes(const std::vector<uint32_t>& vnodes) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard admin(admin_mu_);
  std::unique_lock lock(cf_mu_);
  for (uint32_t v : vnodes) {
    if (v >= cf_by_vnode_.size() || !cf_by_vnode_[v]) {
      return Status::UnknownVnode("cannot drop vnode " + std::to_string(v) + ": not held");
    }
  }
  for (uint32_t v : vnodes) {
    if (!cf_by_vnode_[v]) continue;  // listed twice
    RHINO_RETURN_IF_ERROR(FromRocks(db_->DropColumnFamily(cf_by_vnode_[v]), "dropping vnode " + std::to_string(v)));
    db_->DestroyColumnFamilyHandle(cf_by_vnode_[v]);
    cf_by_vnode_[v] = nullptr;
  }
  return Status::OK();
}

}  // namespace rhino
