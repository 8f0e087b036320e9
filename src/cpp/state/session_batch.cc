#include "rhino/session_batch.h"

#include <rocksdb/db.h>
#include <rocksdb/utilities/write_batch_with_index.h>

#include <algorithm>
#include <mutex>
#include <shared_mutex>

#include "rhino/state_backend.h"
#include "state/state_internal.h"

namespace rhino {

using namespace state_internal;  // FromRocks, EncodeU64, kVersionKey

struct SessionBatch::Rep {
  // overwrite_key: a key written twice keeps one index entry, its last write.
  rocksdb::WriteBatchWithIndex batch{rocksdb::BytewiseComparator(), 0, /*overwrite_key=*/true};
};

SessionBatch::SessionBatch(StateBackend* db) : db_(db), rep_(std::make_unique<Rep>()) {}
SessionBatch::~SessionBatch() = default;

Status SessionBatch::Put(const std::vector<std::string_view>& keys, const std::vector<std::string_view>& values) {
  if (keys.size() != values.size()) {
    return Status::InvalidArgument(std::to_string(keys.size()) + " keys but " + std::to_string(values.size()) +
                                   " values");
  }
  std::shared_lock lock(db_->cf_mu_);
  // Route every key first: a batch with one key of a vnode not held adds nothing.
  std::vector<rocksdb::ColumnFamilyHandle*> cfs(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) RHINO_RETURN_IF_ERROR(db_->Route(keys[i], &cfs[i]));
  for (size_t i = 0; i < keys.size(); ++i) {
    rocksdb::Status s = rep_->batch.Put(cfs[i], rocksdb::Slice(keys[i].data(), keys[i].size()),
                                        rocksdb::Slice(values[i].data(), values[i].size()));
    if (!s.ok()) return FromRocks(s, "session put");
    bytes_ += keys[i].size() + values[i].size();
  }
  count_ += keys.size();
  return Status::OK();
}

Status SessionBatch::Delete(const std::vector<std::string_view>& keys) {
  std::shared_lock lock(db_->cf_mu_);
  std::vector<rocksdb::ColumnFamilyHandle*> cfs(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) RHINO_RETURN_IF_ERROR(db_->Route(keys[i], &cfs[i]));
  for (size_t i = 0; i < keys.size(); ++i) {
    rocksdb::Status s = rep_->batch.Delete(cfs[i], rocksdb::Slice(keys[i].data(), keys[i].size()));
    if (!s.ok()) return FromRocks(s, "session delete");
    bytes_ += keys[i].size();
  }
  count_ += keys.size();
  return Status::OK();
}

Status SessionBatch::MultiGet(const std::vector<std::string_view>& keys, size_t from,
                              const std::function<bool(size_t, bool, std::string_view)>& fn) const {
  if (from >= keys.size()) return Status::OK();
  std::shared_lock lock(db_->cf_mu_);
  const size_t n = keys.size() - from;
  // One MultiGetFromBatchAndDB per vnode over its keys in bytewise order
  // (sorted_input), as StateBackend::MultiGet does for the DB alone.
  std::vector<uint32_t> vnode_of(n);
  for (size_t j = 0; j < n; ++j) {
    rocksdb::ColumnFamilyHandle* cf = nullptr;
    RHINO_RETURN_IF_ERROR(db_->Route(keys[from + j], &cf));
    vnode_of[j] = db_->partitioner_.VnodeOfBytes(keys[from + j]);
  }
  std::vector<size_t> order(n);
  for (size_t j = 0; j < n; ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (vnode_of[a] != vnode_of[b]) return vnode_of[a] < vnode_of[b];
    return keys[from + a] < keys[from + b];
  });
  std::vector<rocksdb::PinnableSlice> values(n);
  std::vector<rocksdb::Status> statuses(n);
  std::vector<rocksdb::Slice> slices(n);
  for (size_t k = 0; k < n; ++k) slices[k] = rocksdb::Slice(keys[from + order[k]].data(), keys[from + order[k]].size());
  rocksdb::ReadOptions ro;
  size_t begin = 0;
  while (begin < n) {
    size_t end = begin;
    while (end < n && vnode_of[order[end]] == vnode_of[order[begin]]) ++end;
    rocksdb::ColumnFamilyHandle* cf = db_->cf_by_vnode_[vnode_of[order[begin]]];
    rep_->batch.MultiGetFromBatchAndDB(db_->db_.get(), ro, cf, end - begin, &slices[begin], &values[begin],
                                       &statuses[begin], /*sorted_input=*/true);
    begin = end;
  }
  std::vector<size_t> slot(n);
  for (size_t k = 0; k < n; ++k) slot[order[k]] = k;
  for (size_t j = 0; j < n; ++j) {
    const size_t k = slot[j];
    const rocksdb::Status& s = statuses[k];
    if (!s.ok() && !s.IsNotFound()) return FromRocks(s, "session get");
    bool found = s.ok();
    std::string_view v = found ? std::string_view(values[k].data(), values[k].size()) : std::string_view();
    if (!fn(from + j, found, v)) break;
  }
  return Status::OK();
}

Status SessionBatch::Scan(std::optional<uint32_t> vnode, std::string_view prefix, std::optional<uint32_t> after_vnode,
                          std::optional<std::string_view> after_key,
                          const std::function<bool(uint32_t, std::string_view, std::string_view)>& fn) const {
  std::shared_lock lock(db_->cf_mu_);
  const auto& cfs = db_->cf_by_vnode_;
  if (vnode && (*vnode >= cfs.size() || cfs[*vnode] == nullptr)) {
    return Status::UnknownVnode("cannot scan vnode " + std::to_string(*vnode) + ": instance " +
                                std::to_string(db_->instance_) + " of '" + db_->operator_id_ + "' does not hold it");
  }
  const rocksdb::Slice pfx(prefix.data(), prefix.size());
  for (uint32_t v = vnode ? *vnode : 0; v < cfs.size(); ++v) {
    if (vnode && v != *vnode) break;
    if (cfs[v] == nullptr) continue;
    if (after_vnode && v < *after_vnode) continue;
    const bool resume = after_vnode && after_key && v == *after_vnode;
    rocksdb::ReadOptions ro;
    std::unique_ptr<rocksdb::Iterator> it(
        rep_->batch.NewIteratorWithBase(cfs[v], db_->db_->NewIterator(ro, cfs[v]), &ro));
    if (resume) {  // the cursor key starts with the prefix: it was returned by this scan
      it->Seek(rocksdb::Slice(after_key->data(), after_key->size()));
      if (it->Valid() && it->key() == rocksdb::Slice(after_key->data(), after_key->size())) it->Next();
    } else {
      it->Seek(pfx);
    }
    for (; it->Valid() && it->key().starts_with(pfx); it->Next()) {
      rocksdb::Slice k = it->key(), val = it->value();
      if (!fn(v, std::string_view(k.data(), k.size()), std::string_view(val.data(), val.size()))) return Status::OK();
    }
    if (!it->status().ok()) return FromRocks(it->status(), "session scan of vnode " + std::to_string(v));
  }
  return Status::OK();
}

Status SessionBatch::Commit(uint64_t version) {
  RHINO_RETURN_IF_ERROR(db_->CheckWritable());
  std::shared_lock lock(db_->cf_mu_);
  rocksdb::Status s = rep_->batch.Put(db_->default_cf_, kVersionKey, EncodeU64(version));
  if (!s.ok()) return FromRocks(s, "session version");
  RHINO_RETURN_IF_ERROR(
      db_->WriteResult(db_->db_->Write(rocksdb::WriteOptions(), rep_->batch.GetWriteBatch()), "session commit"));
  rep_->batch.Clear();
  count_ = 0;
  bytes_ = 0;
  return Status::OK();
}

}  // namespace rhino
