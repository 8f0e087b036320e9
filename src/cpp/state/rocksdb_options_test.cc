// The RocksDB options a StateOptions makes (state/rocksdb_options.h). The
// oracle is what StateOptions' comments promise: each vnode's memtable is its
// share of the budget within [1 MiB, 64 MiB] unless set, the compaction style
// is the one asked for, a restored checkpoint's WAL replays whole, and the
// flush threads are 1..16.
#include "state/rocksdb_options.h"

#include <rocksdb/write_buffer_manager.h>

#include <memory>

#include "state/ttl_filter.h"
#include "testing/test_util.h"

namespace rhino::state_internal {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

TEST(RocksdbOptionsTest, FlushThreadsAreOneToSixteen) {
  StateOptions o;
  for (uint32_t n : {1u, 2u, 16u}) {
    o.flush_threads = n;
    EXPECT_OK(CheckFlushThreads(o));
  }
  for (uint32_t n : {0u, 17u}) {
    o.flush_threads = n;
    EXPECT_CODE(CheckFlushThreads(o), kInvalidArgument);
  }
}

TEST(RocksdbOptionsTest, EachVnodesMemtableIsItsShareOfTheBudgetWithinBounds) {
  TtlCompactionFilter ttl;
  StateOptions o;
  o.write_buffer_budget = 256 * kMiB;
  EXPECT_EQ(VnodeColumnFamilyOptions(o, 16, &ttl).write_buffer_size, 16 * kMiB);
  EXPECT_EQ(VnodeColumnFamilyOptions(o, 1024, &ttl).write_buffer_size, 1 * kMiB) << "at least 1 MiB";
  EXPECT_EQ(VnodeColumnFamilyOptions(o, 1, &ttl).write_buffer_size, 64 * kMiB) << "at most 64 MiB";
  EXPECT_EQ(VnodeColumnFamilyOptions(o, 0, &ttl).write_buffer_size, 64 * kMiB) << "no vnode counts as one";
  o.write_buffer_size = 3 * kMiB;
  EXPECT_EQ(VnodeColumnFamilyOptions(o, 16, &ttl).write_buffer_size, 3 * kMiB) << "a size set wins";
}

TEST(RocksdbOptionsTest, VnodesGetTheTtlFilterAndTheCompactionStyleAskedFor) {
  TtlCompactionFilter ttl;
  StateOptions o;
  rocksdb::ColumnFamilyOptions level = VnodeColumnFamilyOptions(o, 4, &ttl);
  EXPECT_EQ(level.compaction_filter, &ttl);
  EXPECT_EQ(level.compaction_style, rocksdb::kCompactionStyleLevel);
  o.compaction = CompactionStyle::kUniversal;
  EXPECT_EQ(VnodeColumnFamilyOptions(o, 4, &ttl).compaction_style, rocksdb::kCompactionStyleUniversal);
}

TEST(RocksdbOptionsTest, ARestoredCheckpointsWalReplaysWhole) {
  auto wbm = std::make_shared<rocksdb::WriteBufferManager>(64 * kMiB);
  StateOptions o;
  o.flush_threads = 2;
  rocksdb::DBOptions live = DbOptions(o, wbm);
  EXPECT_EQ(live.write_buffer_manager, wbm);
  EXPECT_EQ(live.max_background_flushes, 2);
  EXPECT_EQ(live.max_file_opening_threads, 1);
  EXPECT_NE(live.wal_recovery_mode, rocksdb::WALRecoveryMode::kAbsoluteConsistency);
  EXPECT_FALSE(live.avoid_flush_during_recovery);
  o.whole_wal = true;
  rocksdb::DBOptions restored = DbOptions(o, wbm);
  EXPECT_EQ(restored.wal_recovery_mode, rocksdb::WALRecoveryMode::kAbsoluteConsistency);
  EXPECT_TRUE(restored.avoid_flush_during_recovery);
}

}  // namespace
}  // namespace rhino::state_internal
