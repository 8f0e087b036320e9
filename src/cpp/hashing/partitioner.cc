#include "rhino/partitioner.h"

// XXH3 compiled inline here rather than called in libxxhash: routing hashes
// one 8-byte key per record, and the call through the shared library cost as
// much as the hash (Partitioner.vnodes went from ~110 to ~250 M keys/s on one
// core). Same algorithm and version (the header comes with the library), so
// the same hashes.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace rhino {

Status MakeRoutedKey(std::string_view head, std::string_view routing, std::string_view tail, uint8_t flags,
                     std::string* out) {
  if (head.size() > kMaxRoutedPartBytes) {
    return Status::InvalidArgument("the head of a routed key has " + std::to_string(head.size()) +
                                   " bytes, more than 65535");
  }
  if (routing.size() > kMaxRoutedPartBytes) {
    return Status::InvalidArgument("the routing part of a routed key has " + std::to_string(routing.size()) +
                                   " bytes, more than 65535");
  }
  out->clear();
  out->reserve(head.size() + routing.size() + tail.size() + kRoutedTrailerBytes);
  out->append(head).append(routing).append(tail);
  const char trailer[kRoutedTrailerBytes] = {
      static_cast<char>(head.size() >> 8),    static_cast<char>(head.size() & 0xff),
      static_cast<char>(routing.size() >> 8), static_cast<char>(routing.size() & 0xff),
      static_cast<char>(flags),               static_cast<char>(kRoutedKeyMarker)};
  out->append(trailer, sizeof(trailer));
  return Status::OK();
}

Status Partitioner::Create(const PartitionerOptions& options, Partitioner* out) {
  const uint32_t k = options.num_key_groups;
  if (k == 0 || (k & (k - 1)) != 0 || k > (1u << 30)) {
    return Status::InvalidArgument("num_key_groups must be a power of two in [1, 2^30], got " +
                                   std::to_string(k));
  }
  if (options.num_vnodes == 0 || options.num_vnodes > k) {
    return Status::InvalidArgument("num_vnodes must be in [1, num_key_groups=" + std::to_string(k) +
                                   "], got " + std::to_string(options.num_vnodes));
  }
  out->options_ = options;
  unsigned bits = 0;
  while ((1u << bits) < k) ++bits;
  out->shift_ = 64 - bits;
  return Status::OK();
}

uint64_t Partitioner::HashBytes(std::string_view key) const {
  return XXH3_64bits_withSeed(key.data(), key.size(), options_.seed);
}

uint64_t Partitioner::HashInt64(int64_t key) const {
  char buf[8];
  EncodeInt64Key(key, buf);
  return XXH3_64bits_withSeed(buf, sizeof(buf), options_.seed);
}

uint32_t Partitioner::KeyGroupOfInt64(int64_t key) const {
  char buf[8];
  EncodeInt64Key(key, buf);
  // The common case stays one inline hash of 8 bytes; only keys whose top
  // byte is 0xF5 can be routed (and few of those are).
  if (static_cast<unsigned char>(buf[7]) != kRoutedKeyMarker) {
    return KeyGroupOfHash(XXH3_64bits_withSeed(buf, sizeof(buf), options_.seed));
  }
  const std::string_view r = RoutingPart(std::string_view(buf, sizeof(buf)));
  return KeyGroupOfHash(XXH3_64bits_withSeed(r.data(), r.size(), options_.seed));
}

void Partitioner::KeyGroupRange(uint32_t vnode, uint32_t* first, uint32_t* last) const {
  // Smallest kg with floor(kg * V / K) >= vnode is ceil(vnode * K / V).
  const uint64_t k = options_.num_key_groups, v = options_.num_vnodes;
  *first = static_cast<uint32_t>((vnode * k + v - 1) / v);
  *last = static_cast<uint32_t>(((vnode + 1) * k + v - 1) / v);
}

void Partitioner::KeyGroupsInt64(const int64_t* keys, size_t n, int32_t* out) const {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(KeyGroupOfInt64(keys[i]));
}

void Partitioner::VnodesInt64(const int64_t* keys, size_t n, int32_t* out) const {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(VnodeOfInt64(keys[i]));
}

void Partitioner::KeyGroupsBytes(const std::string_view* keys, size_t n, int32_t* out) const {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(KeyGroupOfBytes(keys[i]));
}

void Partitioner::VnodesBytes(const std::string_view* keys, size_t n, int32_t* out) const {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(VnodeOfBytes(keys[i]));
}

}  // namespace rhino
