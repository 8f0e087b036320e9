// StateBackendImpl's upkeep: the TTL clock, full compactions through the TTL
// filter, flushes, per-vnode statistics, and waiting for RocksDB's
// background work to settle.
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/options.h>

#include <chrono>
#include <limits>
#include <optional>
#include <thread>

#include "state/state_backend_impl.h"
#include "state/state_internal.h"
#include "state/ttl_filter.h"

namespace rhino {
using namespace state_internal;

// ---------------------------------------------------------------- TTL

std::optional<int64_t> StateBackendImpl::ttl_clock() const { return ttl_filter_->clock(); }

Status StateBackendImpl::SetTtlClock(int64_t ms) {
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

uint64_t StateBackendImpl::LiveVnodeBytes() const {
  uint64_t total = 0;
  for (auto* h : cf_by_vnode_) {
    uint64_t v = 0;
    if (h && db_->GetIntProperty(h, "rocksdb.live-sst-files-size", &v)) total += v;
  }
  return total;
}

Status StateBackendImpl::CompactVnodes(uint64_t* bytes_before, uint64_t* bytes_after) {
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

void StateBackendImpl::AbortCompaction() { compaction_aborted_.store(true); }

Status StateBackendImpl::Stats(std::vector<VnodeStats>* out) const {
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

Status StateBackendImpl::Flush() {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  return FlushColumnFamilies();
}

Status StateBackendImpl::FlushColumnFamilies() {
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

Status StateBackendImpl::WaitForCompactions(std::chrono::milliseconds timeout, bool* settled) const {
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
