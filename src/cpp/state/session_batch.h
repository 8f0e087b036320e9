// SessionBatch: the uncommitted writes of one session (docs/design.md §1
// "session", §5 exactly-once).
//
// A session for micro-batch b reads the state at version b-1 and writes in
// batches; nothing it writes is visible to anybody else until Commit, which
// applies every write and the new version in one atomic RocksDB write.
//
// Writes are appended to a rocksdb::WriteBatch (the commit writes it as it
// is) and indexed by key in a hash table, so reads inside the session see
// them: a lookup answers from the index, or else from the DB (one
// StateBackend::MultiGet for all the keys the session has not written); a
// scan merges the session's sorted writes of the vnode with a DB iterator,
// without building the vnode in memory. RocksDB's WriteBatchWithIndex does
// the same job, but its skiplist compares keys by decoding them from the
// batch, twice per put when a key may be written again: staging 100k puts
// cost 4x a direct write of them (bench/README.md, "State service").
//
// Thread-safety: none; the state service uses one SessionBatch from one
// instance's strand at a time. The StateBackend must outlive it, and must not
// import or drop vnodes while it holds writes (the service refuses that while
// a session is open).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rhino/state_backend.h"
#include "rhino/status.h"

namespace rhino {

class BaseReader;  // state/vnode_base.h
class StateBackend;
class StateBackendImpl;  // state/state_backend_impl.h

class SessionBatch {
 public:
  explicit SessionBatch(StateBackend* db);
  ~SessionBatch();
  SessionBatch(const SessionBatch&) = delete;
  SessionBatch& operator=(const SessionBatch&) = delete;

  // Where the session reads the keys of vnodes on a base that it and the DB
  // do not hold (state/vnode_base.h; the early hand-over, issue 48). Without
  // one, such a read is refused (InvalidArgument), never answered "absent".
  // `reader` must outlive the session's reads.
  void SetBaseReader(BaseReader* reader) { base_ = reader; }

  // UnknownVnode (adding nothing) if any key's vnode is not held.
  Status Put(const std::vector<std::string_view>& keys, const std::vector<std::string_view>& values);
  Status Delete(const std::vector<std::string_view>& keys);

  // Looks up keys[from..], calling fn(i, found, value) in input order, i = from,
  // from+1, ...; stops (OK) after the first key for which fn returns false.
  // The value view is valid only during the call.
  Status MultiGet(const std::vector<std::string_view>& keys, size_t from,
                  const std::function<bool(size_t, bool, std::string_view)>& fn) const;
  // The same lookups of keys[from..], handed over at once: found[j] and
  // values[j] for key from + j (views valid during the call only), so that
  // the caller can size its answer before it copies anything.
  Status MultiGetAll(const std::vector<std::string_view>& keys, size_t from,
                     const std::function<void(const std::vector<uint8_t>&, const std::vector<std::string_view>&)>& all)
      const;

  // Calls fn(vnode, key, value) for the session's view of the entries whose key
  // starts with `prefix`, vnode by vnode in ascending order (only `vnode` if
  // set), keys in RocksDB's order within a vnode, starting strictly after
  // (after_vnode, after_key) if `after_key` is set. Stops when fn returns false.
  Status Scan(std::optional<uint32_t> vnode, std::string_view prefix, std::optional<uint32_t> after_vnode,
              std::optional<std::string_view> after_key,
              const std::function<bool(uint32_t, std::string_view, std::string_view)>& fn) const;

  // Applies every write and the state version `version` in one atomic write,
  // with `batch_time_ms` as the new TTL clock if set (else the clock stays),
  // and `base`, what the version was built on, if set (only where that is not
  // version - 1: StateBackend::BaseOf). The batch is empty afterwards.
  Status Commit(uint64_t version, std::optional<int64_t> batch_time_ms = std::nullopt,
                std::optional<VersionBase> base = std::nullopt);

  size_t count() const { return count_; }     // puts and deletes so far
  uint64_t bytes() const { return bytes_; }   // key and value bytes so far

 private:
  struct Rep;
  Status Add(bool put, const std::vector<std::string_view>& keys, const std::vector<std::string_view>* values);
  // Looks the keys `db` did not find up in the bases of their vnodes:
  // (*found)[j] and (*values)[j] for looked[j], where a base holds it and this
  // instance has not deleted it since the move.
  Status ReadThrough(const std::vector<std::string_view>& looked, const MultiGetResult& db,
                     std::vector<uint8_t>* found, std::vector<std::string>* values) const;
  StateBackendImpl* const db_;  // the StateBackend's
  BaseReader* base_ = nullptr;
  std::unique_ptr<Rep> rep_;
  size_t count_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace rhino
