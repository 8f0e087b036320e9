// StateBackendImpl's keys: each routed to its vnode's column family, read
// and written one at a time or in batches (grouped by vnode and sorted, as
// RocksDB's memtables and MultiGet read them fastest), scanned, and the
// metadata the state keeps beside them (its version, its last checkpoint).
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/perf_level.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "state/state_backend_impl.h"
#include "state/state_internal.h"
#include "state/ttl_filter.h"

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

}  // namespace

// ---------------------------------------------------------------- routing

std::vector<uint32_t> StateBackendImpl::vnodes() const {
  ReaderMutexLock lock(&cf_mu_);
  std::vector<uint32_t> r;
  for (uint32_t v = 0; v < cf_by_vnode_.size(); ++v)
    if (cf_by_vnode_[v]) r.push_back(v);
  return r;
}

Status StateBackendImpl::Route(std::string_view key, rocksdb::ColumnFamilyHandle** cf) const {
  uint32_t v = partitioner_.VnodeOfBytes(key);
  *cf = cf_by_vnode_[v];
  if (*cf == nullptr) {
    return Status::UnknownVnode("key routes to vnode " + std::to_string(v) + ", which instance " +
                                std::to_string(instance_) + " of '" + operator_id_ + "' does not hold");
  }
  return Status::OK();
}

Status StateBackendImpl::CheckWritable() const {
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

Status StateBackendImpl::WriteResult(const rocksdb::Status& s, const std::string& context) const {
  if (s.IsIOError()) write_error_.store(true, std::memory_order_release);
  return FromRocks(s, context);
}

// ---------------------------------------------------------------- single keys

Status StateBackendImpl::Get(std::string_view key, std::string* value) const {
  ReaderMutexLock lock(&cf_mu_);
  rocksdb::ColumnFamilyHandle* cf;
  RHINO_RETURN_IF_ERROR(Route(key, &cf));
  SkipPerfCounters();
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cf, rocksdb::Slice(key.data(), key.size()), value);
  if (s.IsNotFound()) return Status::NotFound("key not found");
  return FromRocks(s, "get");
}

Status StateBackendImpl::Put(std::string_view key, std::string_view value) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  ReaderMutexLock lock(&cf_mu_);
  rocksdb::ColumnFamilyHandle* cf;
  RHINO_RETURN_IF_ERROR(Route(key, &cf));
  SkipPerfCounters();
  if (AnyOnBase() && OnBase(partitioner_.VnodeOfBytes(key))) {
    rocksdb::WriteBatch wb;
    wb.Put(cf, rocksdb::Slice(key.data(), key.size()), rocksdb::Slice(value.data(), value.size()));
    RHINO_RETURN_IF_ERROR(NoteBaseWrite(&wb, partitioner_.VnodeOfBytes(key), key, true));
    return WriteResult(db_->Write(rocksdb::WriteOptions(), &wb), "put");
  }
  return WriteResult(db_->Put(rocksdb::WriteOptions(), cf, rocksdb::Slice(key.data(), key.size()),
                              rocksdb::Slice(value.data(), value.size())),
                     "put");
}

Status StateBackendImpl::Delete(std::string_view key) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  ReaderMutexLock lock(&cf_mu_);
  rocksdb::ColumnFamilyHandle* cf;
  RHINO_RETURN_IF_ERROR(Route(key, &cf));
  SkipPerfCounters();
  if (AnyOnBase() && OnBase(partitioner_.VnodeOfBytes(key))) {
    rocksdb::WriteBatch wb;
    wb.Delete(cf, rocksdb::Slice(key.data(), key.size()));
    RHINO_RETURN_IF_ERROR(NoteBaseWrite(&wb, partitioner_.VnodeOfBytes(key), key, false));
    return WriteResult(db_->Write(rocksdb::WriteOptions(), &wb), "delete");
  }
  return WriteResult(db_->Delete(rocksdb::WriteOptions(), cf, rocksdb::Slice(key.data(), key.size())), "delete");
}

// ---------------------------------------------------------------- batches

Status StateBackendImpl::BatchPut(WriteBatch* batch, const std::vector<std::string_view>& keys,
                              const std::vector<std::string_view>& values) const {
  if (keys.size() != values.size()) {
    return Status::InvalidArgument(std::to_string(keys.size()) + " keys but " + std::to_string(values.size()) +
                                   " values");
  }
  return AddToBatch(batch, keys, &values);
}

Status StateBackendImpl::BatchDelete(WriteBatch* batch, const std::vector<std::string_view>& keys) const {
  return AddToBatch(batch, keys, nullptr);
}

// The keys of a batch, grouped by vnode and, within a vnode, ordered bytewise
// (the column families' comparator). Stable: a key repeated in a batch keeps
// its relative order, so its last write still wins. Batches are applied in
// this order because each vnode's memtable is a skip list that keeps an
// insert hint (see VnodeColumnFamilyOptions), so ordered inserts skip most of
// the search, and MultiGet can be told its input is sorted.
struct StateBackendImpl::VnodeOrder {
  std::vector<uint32_t> vnode_of;  // per key, in input order
  std::vector<size_t> start;       // keys of vnode v are order[start[v], start[v + 1])
  std::vector<size_t> order;       // key indices, grouped and sorted
};

Status StateBackendImpl::OrderKeys(const std::vector<std::string_view>& keys, VnodeOrder* out) const {
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
Status StateBackendImpl::AddToBatch(WriteBatch* batch, const std::vector<std::string_view>& keys,
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
    if (AnyOnBase() && OnBase(vo.vnode_of[i])) {
      RHINO_RETURN_IF_ERROR(NoteBaseWrite(&wb, vo.vnode_of[i], keys[i], values != nullptr));
    }
  }
  return Status::OK();
}

Status StateBackendImpl::Write(WriteBatch* batch, std::optional<uint64_t> version, std::optional<int64_t> batch_time_ms) {
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

Status StateBackendImpl::MultiGet(const std::vector<std::string_view>& keys, MultiGetResult* out) const {
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

Status StateBackendImpl::BatchOrder(const std::vector<std::string_view>& keys, std::vector<size_t>* order) const {
  ReaderMutexLock lock(&cf_mu_);
  VnodeOrder vo;
  RHINO_RETURN_IF_ERROR(OrderKeys(keys, &vo));
  *order = std::move(vo.order);
  return Status::OK();
}

Status StateBackendImpl::Scan(uint32_t vnode,
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

std::optional<uint64_t> StateBackendImpl::ReadU64Meta(const std::string& key) const {
  std::string v;
  uint64_t r;
  if (db_->Get(rocksdb::ReadOptions(), default_cf_, key, &v).ok() && DecodeU64(v, &r)) return r;
  return std::nullopt;
}

std::optional<uint64_t> StateBackendImpl::version() const { return ReadU64Meta(kVersionKey); }

std::optional<VersionBase> StateBackendImpl::BaseOf(uint64_t version) const {
  std::string v;
  uint64_t of = 0, base = 0;
  if (!db_->Get(rocksdb::ReadOptions(), default_cf_, kBaseKey, &v).ok() || v.size() != 17) return std::nullopt;
  if (!DecodeU64(v.substr(0, 8), &of) || !DecodeU64(v.substr(9, 8), &base) || (v[8] != 0 && v[8] != 1)) {
    return std::nullopt;
  }
  if (of != version || this->version() != version) return std::nullopt;  // a record of an older version
  return VersionBase{v[8] == 1 ? std::optional<uint64_t>(base) : std::nullopt};
}
std::optional<uint64_t> StateBackendImpl::last_checkpoint() const { return ReadU64Meta(kCheckpointKey); }

}  // namespace rhino
