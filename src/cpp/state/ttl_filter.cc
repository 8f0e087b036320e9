#include "state/ttl_filter.h"

#include "rhino/partitioner.h"

namespace rhino {

bool TtlCompactionFilter::Expired(std::string_view key, std::string_view value, int64_t clock) {
  RoutedKeyParts parts;
  if (!SplitRoutedKey(key, &parts) || (parts.flags & kRoutedFlagTtl) == 0) return false;
  if (value.size() < 8) return false;  // not ours to judge: kept, and nothing to report
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u = (u << 8) | static_cast<unsigned char>(value[i]);
  return static_cast<int64_t>(u) <= clock;
}

bool TtlCompactionFilter::Filter(int /*level*/, const rocksdb::Slice& key, const rocksdb::Slice& existing_value,
                                 std::string* /*new_value*/, bool* /*value_changed*/) const {
  const int64_t clock = clock_.load(std::memory_order_acquire);
  if (clock == kNoClock) return false;
  // Removing an entry here turns it into a deletion marker, so an older
  // version of the key further down the LSM does not come back.
  return Expired(std::string_view(key.data(), key.size()), std::string_view(existing_value.data(), existing_value.size()),
                 clock);
}

}  // namespace rhino
