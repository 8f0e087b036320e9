// The TTL compaction filter of every vnode column family (docs/protocol.md
// §7.8, docs/design.md §1 "TTL clock"). Internal to the C++ core.
//
// A routed key with flag TTL carries its expiry in the first 8 bytes of its
// value (int64, big-endian, ms of batch time). Compactions drop such an entry
// once its expiry is <= the instance's TTL clock: the batch time of the
// version the live DB is at, set by the commit that wrote that version (in
// the same atomic write) and loaded whenever the DB is opened, so a restore,
// takeover or rollback brings back the clock of its checkpoint. Dropping is
// safe for exactly-once: an entry at or past its expiry is already dead to
// every reader of that version and later ones, so a compaction that runs
// sooner or later than on another replica changes nothing anybody reads.
//
// Without a clock (no commit has set one) nothing is dropped. Plain keys,
// routed keys without the flag and values shorter than 8 bytes are kept:
// the filter never fails a compaction. The default column family (Rhino's
// metadata) shares the options, but none of its keys is routed.
//
// Thread-safety: one filter per open DB, shared by every vnode's
// compactions on RocksDB's background threads; the clock is an atomic.
#pragma once

#include <rocksdb/compaction_filter.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace rhino {

class TtlCompactionFilter : public rocksdb::CompactionFilter {
 public:
  void set_clock(std::optional<int64_t> ms) { clock_.store(ms ? *ms : kNoClock, std::memory_order_release); }
  std::optional<int64_t> clock() const {
    const int64_t c = clock_.load(std::memory_order_acquire);
    return c == kNoClock ? std::nullopt : std::optional<int64_t>(c);
  }
  // True if the entry `key` -> `value` has expired under `clock`.
  static bool Expired(std::string_view key, std::string_view value, int64_t clock);

  bool Filter(int level, const rocksdb::Slice& key, const rocksdb::Slice& existing_value, std::string* new_value,
              bool* value_changed) const override;
  const char* Name() const override { return "rhino.TtlCompactionFilter"; }

 private:
  // INT64_MIN stands for "no clock": an expiry can equal it, a clock cannot
  // (StateBackend refuses it), so no entry is ever dropped without a clock.
  static constexpr int64_t kNoClock = std::numeric_limits<int64_t>::min();
  std::atomic<int64_t> clock_{kNoClock};
};

}  // namespace rhino
