#include "state/session_batch.h"

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "rhino/state_backend.h"
#include "state/state_backend_impl.h"
#include "state/state_internal.h"
#include "state/ttl_filter.h"
#include "state/vnode_base.h"

namespace rhino {

using namespace state_internal;  // FromRocks, EncodeU64, kVersionKey, kTtlClockKey

namespace {

// Bytes that never move once written (the index views them): blocks of 1 MiB,
// or one block of its own for a larger item.
class Arena {
 public:
  std::string_view Copy(std::string_view s) {
    if (blocks_.empty() || blocks_.back().capacity() - blocks_.back().size() < s.size()) {
      blocks_.emplace_back();
      blocks_.back().reserve(std::max<size_t>(s.size(), size_t{1} << 20));
    }
    std::string& b = blocks_.back();
    const size_t at = b.size();
    b.append(s.data(), s.size());  // within capacity: no reallocation
    return std::string_view(b.data() + at, s.size());
  }

 private:
  std::deque<std::string> blocks_;
};

struct Write {
  uint32_t vnode = 0;
  bool put = false;
  std::string_view key;
  std::string_view value;
};

// What a session's scan of one vnode reads under its own writes, in key
// order: the DB's entries with the prefix and, for a vnode on a base, the
// base's entries that the DB neither holds nor had deleted since the move
// (state/vnode_base.h), read from the base a page at a time.
class LowerCursor {
 public:
  static constexpr size_t kPage = 1024;

  LowerCursor(rocksdb::Iterator* it, rocksdb::Slice prefix, BaseReader* base, uint32_t vnode,
              std::vector<std::string> gone, std::optional<std::string> after)
      : it_(it), prefix_(prefix), base_(base), vnode_(vnode), gone_(std::move(gone)), last_(std::move(after)) {
    more_ = base_ != nullptr;
  }

  Status Init() { return Settle(); }
  bool Valid() const { return cur_ != kNone; }
  rocksdb::Slice key() const { return cur_ == kDb ? it_->key() : rocksdb::Slice(page_[at_].first); }
  rocksdb::Slice value() const { return cur_ == kDb ? it_->value() : rocksdb::Slice(page_[at_].second); }
  Status Next() {
    if (cur_ == kDb) {
      it_->Next();
    } else {
      ++at_;
    }
    return Settle();
  }

 private:
  enum Source { kNone, kDb, kBase };

  bool DbValid() const { return it_->Valid() && it_->key().starts_with(prefix_); }
  bool Gone(const std::string& k) const { return std::binary_search(gone_.begin(), gone_.end(), k); }

  // Makes the smaller of the two sources current, skipping base entries the
  // DB shadows (the same key) or that were deleted here.
  Status Settle() {
    const rocksdb::Comparator* cmp = rocksdb::BytewiseComparator();
    for (;;) {
      if (at_ == page_.size() && more_) {
        page_.clear();
        at_ = 0;
        std::optional<std::string_view> after;
        if (last_) after = *last_;
        RHINO_RETURN_IF_ERROR(
            base_->Scan(vnode_, std::string_view(prefix_.data(), prefix_.size()), after, kPage, &page_, &more_));
        if (!page_.empty()) last_ = page_.back().first;
      }
      const bool base_ok = at_ < page_.size();
      if (base_ok && Gone(page_[at_].first)) {
        ++at_;
        continue;
      }
      const bool db_ok = DbValid();
      if (!db_ok && !base_ok) {
        cur_ = kNone;
      } else if (!base_ok) {
        cur_ = kDb;
      } else if (!db_ok) {
        cur_ = kBase;
      } else {
        const int c = cmp->Compare(it_->key(), rocksdb::Slice(page_[at_].first));
        if (c == 0) {  // this instance's entry shadows the base's
          ++at_;
          continue;
        }
        cur_ = c < 0 ? kDb : kBase;
      }
      return Status::OK();
    }
  }

  rocksdb::Iterator* it_;
  rocksdb::Slice prefix_;
  BaseReader* base_;
  uint32_t vnode_;
  std::vector<std::string> gone_;  // sorted
  std::optional<std::string> last_;
  std::vector<std::pair<std::string, std::string>> page_;
  size_t at_ = 0;
  bool more_ = false;
  Source cur_ = kNone;
};

}  // namespace

struct SessionBatch::Rep {
  rocksdb::WriteBatch batch;                            // what Commit writes
  Arena arena;                                          // keys and values the index views
  std::vector<Write> writes;                            // every write, in order
  std::unordered_map<std::string_view, uint32_t> last;  // key -> its last write
};

SessionBatch::SessionBatch(StateBackend* db) : db_(db->impl_.get()), rep_(std::make_unique<Rep>()) {}
SessionBatch::~SessionBatch() = default;

Status SessionBatch::Add(bool put, const std::vector<std::string_view>& keys,
                         const std::vector<std::string_view>* values) {
  if (put && keys.size() != values->size()) {
    return Status::InvalidArgument(std::to_string(keys.size()) + " keys but " + std::to_string(values->size()) +
                                   " values");
  }
  ReaderMutexLock lock(&db_->cf_mu_);
  // Route every key first: a batch with one key of a vnode not held adds nothing.
  std::vector<rocksdb::ColumnFamilyHandle*> cfs(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) RHINO_RETURN_IF_ERROR(db_->Route(keys[i], &cfs[i]));
  Rep& r = *rep_;
  r.writes.reserve(r.writes.size() + keys.size());
  r.last.reserve(r.last.size() + keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const rocksdb::Slice k(keys[i].data(), keys[i].size());
    rocksdb::Status s = put ? r.batch.Put(cfs[i], k, rocksdb::Slice((*values)[i].data(), (*values)[i].size()))
                            : r.batch.Delete(cfs[i], k);
    if (!s.ok()) return FromRocks(s, put ? "session put" : "session delete");
    Write w;
    w.vnode = db_->partitioner_.VnodeOfBytes(keys[i]);
    if (db_->AnyOnBase() && db_->OnBase(w.vnode)) RHINO_RETURN_IF_ERROR(db_->NoteBaseWrite(&r.batch, w.vnode, keys[i], put));
    w.put = put;
    w.key = r.arena.Copy(keys[i]);
    if (put) w.value = r.arena.Copy((*values)[i]);
    r.last[w.key] = static_cast<uint32_t>(r.writes.size());
    r.writes.push_back(w);
    bytes_ += keys[i].size() + (put ? (*values)[i].size() : 0);
  }
  count_ += keys.size();
  return Status::OK();
}

Status SessionBatch::Put(const std::vector<std::string_view>& keys, const std::vector<std::string_view>& values) {
  return Add(true, keys, &values);
}

Status SessionBatch::Delete(const std::vector<std::string_view>& keys) { return Add(false, keys, nullptr); }

Status SessionBatch::MultiGet(const std::vector<std::string_view>& keys, size_t from,
                              const std::function<bool(size_t, bool, std::string_view)>& fn) const {
  if (from >= keys.size()) return Status::OK();
  const Rep& r = *rep_;
  const size_t n = keys.size() - from;
  // Keys the session wrote answer from its writes; the rest from the DB, in
  // one MultiGet (the in-process path: grouped by vnode, sorted, pinned).
  std::vector<int64_t> own(n, -1);
  std::vector<std::string_view> misses;
  std::vector<size_t> miss_of;
  if (!r.last.empty()) {
    misses.reserve(n);
    miss_of.assign(n, 0);
    for (size_t j = 0; j < n; ++j) {
      auto it = r.last.find(keys[from + j]);
      if (it != r.last.end()) {
        own[j] = it->second;
      } else {
        miss_of[j] = misses.size();
        misses.push_back(keys[from + j]);
      }
    }
  }
  MultiGetResult db;
  if (r.last.empty()) {
    std::vector<std::string_view> rest(keys.begin() + from, keys.end());
    RHINO_RETURN_IF_ERROR(db_->MultiGet(rest, &db));
  } else if (!misses.empty()) {
    RHINO_RETURN_IF_ERROR(db_->MultiGet(misses, &db));
  }
  // What the DB does not hold of a vnode on a base is read through to the base.
  std::vector<uint8_t> base_found;
  std::vector<std::string> base_values;
  if (db_->AnyOnBase()) {
    std::vector<std::string_view> looked;  // the keys db answered for, in its order
    if (r.last.empty()) {
      looked.assign(keys.begin() + from, keys.end());
    } else {
      looked = misses;
    }
    RHINO_RETURN_IF_ERROR(ReadThrough(looked, db, &base_found, &base_values));
  }
  for (size_t j = 0; j < n; ++j) {
    bool found;
    std::string_view v;
    if (own[j] >= 0) {
      const Write& w = r.writes[static_cast<size_t>(own[j])];
      found = w.put;
      v = w.value;
    } else {
      const size_t k = r.last.empty() ? j : miss_of[j];
      found = db.found(k);
      if (found) {
        v = db.value(k);
      } else if (!base_found.empty() && base_found[k]) {
        found = true;
        v = base_values[k];
      }
    }
    if (!fn(from + j, found, v)) break;
  }
  return Status::OK();
}

Status SessionBatch::ReadThrough(const std::vector<std::string_view>& misses, const MultiGetResult& db,
                                 std::vector<uint8_t>* found, std::vector<std::string>* values) const {
  found->assign(misses.size(), 0);
  values->assign(misses.size(), std::string());
  std::vector<size_t> at;  // indices into misses of keys of vnodes on a base
  std::vector<uint32_t> vnodes;
  std::vector<std::string_view> keys;
  {
    ReaderMutexLock lock(&db_->cf_mu_);
    for (size_t k = 0; k < misses.size(); ++k) {
      if (db.found(k)) continue;
      const uint32_t v = db_->partitioner_.VnodeOfBytes(misses[k]);
      if (!db_->OnBase(v)) continue;
      at.push_back(k);
      vnodes.push_back(v);
      keys.push_back(misses[k]);
    }
  }
  if (at.empty()) return Status::OK();
  if (base_ == nullptr) {
    return Status::InvalidArgument("vnode " + std::to_string(vnodes[0]) + " is on a base not merged yet, and this "
                                   "session has no reader of it");
  }
  // Deleted here since the move: absent, whatever the base holds.
  std::vector<uint8_t> gone;
  RHINO_RETURN_IF_ERROR(db_->Gone(vnodes, keys, &gone));
  std::vector<uint32_t> ask_vnodes;
  std::vector<std::string_view> ask;
  std::vector<size_t> ask_at;
  for (size_t i = 0; i < at.size(); ++i) {
    if (gone[i]) continue;
    ask_vnodes.push_back(vnodes[i]);
    ask.push_back(keys[i]);
    ask_at.push_back(at[i]);
  }
  if (ask.empty()) return Status::OK();
  std::vector<uint8_t> f;
  std::vector<std::string> vals;
  RHINO_RETURN_IF_ERROR(base_->Get(ask_vnodes, ask, &f, &vals));
  if (f.size() != ask.size() || vals.size() != ask.size()) {
    return Status::Corruption("a base reader answered " + std::to_string(f.size()) + " keys of " +
                              std::to_string(ask.size()));
  }
  for (size_t i = 0; i < ask.size(); ++i) {
    (*found)[ask_at[i]] = f[i];
    if (f[i]) (*values)[ask_at[i]] = std::move(vals[i]);
  }
  return Status::OK();
}

Status SessionBatch::MultiGetAll(
    const std::vector<std::string_view>& keys, size_t from,
    const std::function<void(const std::vector<uint8_t>&, const std::vector<std::string_view>&)>& all) const {
  const size_t n = keys.size() > from ? keys.size() - from : 0;
  std::vector<uint8_t> found(n, 0);
  std::vector<std::string_view> values(n);
  // The views stay valid inside MultiGet's callback chain: collect, then hand over there.
  size_t seen = 0;
  return MultiGet(keys, from, [&](size_t i, bool f, std::string_view v) {
    found[i - from] = f;
    values[i - from] = v;
    if (++seen == n) all(found, values);
    return true;
  });
}

Status SessionBatch::Scan(std::optional<uint32_t> vnode, std::string_view prefix, std::optional<uint32_t> after_vnode,
                          std::optional<std::string_view> after_key,
                          const std::function<bool(uint32_t, std::string_view, std::string_view)>& fn) const {
  ReaderMutexLock lock(&db_->cf_mu_);
  if (vnode && (*vnode >= db_->cf_by_vnode_.size() || db_->cf_by_vnode_[*vnode] == nullptr)) {
    return Status::UnknownVnode("cannot scan vnode " + std::to_string(*vnode) + ": instance " +
                                std::to_string(db_->instance_) + " of '" + db_->operator_id_ + "' does not hold it");
  }
  const Rep& r = *rep_;
  const rocksdb::Slice pfx(prefix.data(), prefix.size());
  const rocksdb::Comparator* cmp = rocksdb::BytewiseComparator();
  for (uint32_t v = vnode ? *vnode : 0; v < db_->cf_by_vnode_.size(); ++v) {
    if (vnode && v != *vnode) break;
    if (db_->cf_by_vnode_[v] == nullptr) continue;
    if (after_vnode && v < *after_vnode) continue;
    const bool resume = after_vnode && after_key && v == *after_vnode;
    // The session's last write of each key of this vnode in range, sorted.
    std::vector<const Write*> mine;
    for (const auto& [key, idx] : r.last) {
      const Write& w = r.writes[idx];
      if (w.vnode != v || !rocksdb::Slice(key.data(), key.size()).starts_with(pfx)) continue;
      if (resume && cmp->Compare(rocksdb::Slice(key.data(), key.size()),
                                 rocksdb::Slice(after_key->data(), after_key->size())) <= 0) {
        continue;
      }
      mine.push_back(&w);
    }
    std::sort(mine.begin(), mine.end(), [cmp](const Write* a, const Write* b) {
      return cmp->Compare(rocksdb::Slice(a->key.data(), a->key.size()), rocksdb::Slice(b->key.data(), b->key.size())) < 0;
    });
    rocksdb::ReadOptions ro;
    std::unique_ptr<rocksdb::Iterator> it(db_->db_->NewIterator(ro, db_->cf_by_vnode_[v]));
    if (resume) {
      it->Seek(rocksdb::Slice(after_key->data(), after_key->size()));
      if (it->Valid() && it->key() == rocksdb::Slice(after_key->data(), after_key->size())) it->Next();
    } else {
      it->Seek(pfx);
    }
    BaseReader* base = nullptr;
    std::vector<std::string> gone;
    if (db_->OnBase(v)) {
      if (base_ == nullptr) {
        return Status::InvalidArgument("vnode " + std::to_string(v) + " is on a base not merged yet, and this "
                                       "session has no reader of it");
      }
      base = base_;
      RHINO_RETURN_IF_ERROR(db_->GoneWithPrefix(v, prefix, &gone));
    }
    std::optional<std::string> base_after;
    if (resume) base_after = std::string(*after_key);
    LowerCursor low(it.get(), pfx, base, v, std::move(gone), std::move(base_after));
    RHINO_RETURN_IF_ERROR(low.Init());
    size_t m = 0;
    for (;;) {
      const bool low_ok = low.Valid();
      if (!low_ok && m == mine.size()) break;
      int c;  // < 0: the lower entry comes first; > 0: the session's; 0: the session's write replaces it
      if (!low_ok) {
        c = 1;
      } else if (m == mine.size()) {
        c = -1;
      } else {
        c = cmp->Compare(low.key(), rocksdb::Slice(mine[m]->key.data(), mine[m]->key.size()));
      }
      if (c < 0) {
        rocksdb::Slice k = low.key(), val = low.value();
        if (!fn(v, std::string_view(k.data(), k.size()), std::string_view(val.data(), val.size()))) return Status::OK();
        RHINO_RETURN_IF_ERROR(low.Next());
        continue;
      }
      const Write* w = mine[m++];
      if (c == 0) RHINO_RETURN_IF_ERROR(low.Next());
      if (w->put && !fn(v, w->key, w->value)) return Status::OK();
    }
    if (!it->status().ok()) return FromRocks(it->status(), "session scan of vnode " + std::to_string(v));
  }
  return Status::OK();
}

Status SessionBatch::Commit(uint64_t version, std::optional<int64_t> batch_time_ms, std::optional<VersionBase> base) {
  RHINO_RETURN_IF_ERROR(db_->CheckWritable());
  if (batch_time_ms && *batch_time_ms == std::numeric_limits<int64_t>::min()) {
    return Status::InvalidArgument("a batch time of INT64_MIN is not a TTL clock");
  }
  ReaderMutexLock lock(&db_->cf_mu_);
  rocksdb::Status s = rep_->batch.Put(db_->default_cf_, kVersionKey, EncodeU64(version));
  // The clock goes with the version: a checkpoint of this version, and every
  // restore of it, has the clock its compactions must use.
  if (s.ok() && batch_time_ms) {
    s = rep_->batch.Put(db_->default_cf_, kTtlClockKey, EncodeU64(static_cast<uint64_t>(*batch_time_ms)));
  }
  // The base goes with the version too: a rerun of this batch from a restore
  // of its checkpoint rolls back to what it was built on (issue 47).
  if (s.ok() && base) {
    const std::string rec = EncodeU64(version) + std::string(1, base->version ? '\x01' : '\x00') +
                            EncodeU64(base->version.value_or(0));
    s = rep_->batch.Put(db_->default_cf_, kBaseKey, rec);
  }
  if (!s.ok()) return FromRocks(s, "session version");
  RHINO_RETURN_IF_ERROR(db_->WriteResult(db_->db_->Write(rocksdb::WriteOptions(), &rep_->batch), "session commit"));
  if (batch_time_ms) db_->ttl_filter_->set_clock(*batch_time_ms);
  rep_ = std::make_unique<Rep>();
  count_ = 0;
  bytes_ = 0;
  return Status::OK();
}

}  // namespace rhino
