// Partitioner: key -> key group -> vnode (docs/design.md §1).
//
//   key group = top log2(K) bits of XXH3_64(key_bytes, seed)     unit of hashing
//   vnode     = floor(kg * V / K), a contiguous range of key groups  unit of migration
//
// An int64 key is hashed as its 8 little-endian bytes, so the int64 key k and
// the bytes key k.to_bytes(8, "little", signed=True) are the same key. A str
// key is its UTF-8 bytes. K and V are fixed for the lifetime of a job.
//
// Keys are plain or routed (docs/protocol.md §7.8). A routed key is
//
//   head | routing | tail | trailer
//   trailer (6 bytes) = u16be len(head) | u16be len(routing) | u8 flags | 0xF5
//
// and a key is routed iff it has at least 6 bytes, its last byte is 0xF5 and
// len(head) + len(routing) + 6 <= its size. What is hashed, for the key group
// and the vnode, is the key's *routing part*: key[len(head), len(head) +
// len(routing)) of a routed key, the whole key of a plain one. So every entry
// whose routing part is r (a grouping key's list elements, map entries and
// timers, each with its own head and tail) lives in the vnode of the plain key
// r, and moves with it in a handover. Flags bit 0 (kRoutedFlagTtl) marks an
// entry whose value starts with its expiry (state_backend.h, TTL clock).
//
// Thread-safety: immutable after construction; safe to share across threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "rhino/status.h"

namespace rhino {

// ---- routed keys ----
constexpr size_t kRoutedTrailerBytes = 6;
constexpr unsigned char kRoutedKeyMarker = 0xF5;  // the last byte of a routed key
constexpr size_t kMaxRoutedPartBytes = 65535;     // len(head) and len(routing) are u16
// The value of a routed key with this flag starts with an 8-byte big-endian
// signed expiry (ms, in batch time): compaction drops the entry once the
// instance's TTL clock reaches it.
constexpr uint8_t kRoutedFlagTtl = 0x01;

struct RoutedKeyParts {
  std::string_view head, routing, tail;
  uint8_t flags = 0;
};

// Splits a routed key into its parts (views into `key`); false for a plain key.
inline bool SplitRoutedKey(std::string_view key, RoutedKeyParts* out) {
  const size_t n = key.size();
  if (n < kRoutedTrailerBytes || static_cast<unsigned char>(key[n - 1]) != kRoutedKeyMarker) return false;
  const auto* t = reinterpret_cast<const unsigned char*>(key.data()) + (n - kRoutedTrailerBytes);
  const size_t head = (size_t{t[0]} << 8) | t[1];
  const size_t routing = (size_t{t[2]} << 8) | t[3];
  if (head + routing + kRoutedTrailerBytes > n) return false;  // a plain key that merely ends in 0xF5
  out->head = key.substr(0, head);
  out->routing = key.substr(head, routing);
  out->tail = key.substr(head + routing, n - kRoutedTrailerBytes - head - routing);
  out->flags = t[4];
  return true;
}

// The bytes a key is hashed by: the routing part of a routed key, the whole
// of a plain key. Every key -> key group / vnode computation goes through it.
inline std::string_view RoutingPart(std::string_view key) {
  RoutedKeyParts p;
  return SplitRoutedKey(key, &p) ? p.routing : key;
}

// Builds head | routing | tail | trailer into *out (replacing its contents);
// InvalidArgument, naming the part, if head or routing exceeds 65535 bytes.
Status MakeRoutedKey(std::string_view head, std::string_view routing, std::string_view tail, uint8_t flags,
                     std::string* out);

struct PartitionerOptions {
  // Number of key groups K. Must be a power of two in [1, 2^30].
  uint32_t num_key_groups = 1u << 15;  // the Rhino paper's default
  // Number of vnodes V. 1 <= V <= K. Default: 4 x a max parallelism of 64.
  uint32_t num_vnodes = 256;
  // XXH3 seed. Changing it reshuffles every key: fix it for a job's lifetime.
  uint64_t seed = 0;
};

class Partitioner {
 public:
  // Validates `options`; returns InvalidArgument on a bad K or V.
  static Status Create(const PartitionerOptions& options, Partitioner* out);
  Partitioner() = default;

  uint32_t num_key_groups() const { return options_.num_key_groups; }
  uint32_t num_vnodes() const { return options_.num_vnodes; }
  uint64_t seed() const { return options_.seed; }

  // XXH3_64 of exactly these bytes (no routing: see KeyGroupOfBytes).
  uint64_t HashBytes(std::string_view key) const;
  // XXH3_64 of the key's 8 little-endian bytes.
  uint64_t HashInt64(int64_t key) const;

  // The key group of a key: of its routing part.
  uint32_t KeyGroupOfBytes(std::string_view key) const { return KeyGroupOfHash(HashBytes(RoutingPart(key))); }
  // The same as KeyGroupOfBytes of the key's 8 little-endian bytes, which are
  // a routed key in the rare case that they end in 0xF5 with fitting lengths.
  uint32_t KeyGroupOfInt64(int64_t key) const;

  uint32_t KeyGroupOfHash(uint64_t h) const {
    // K == 1 has zero bits; a shift by 64 is undefined behaviour in C++.
    return shift_ == 64 ? 0u : static_cast<uint32_t>(h >> shift_);
  }
  uint32_t VnodeOfKeyGroup(uint32_t kg) const {
    return static_cast<uint32_t>((static_cast<uint64_t>(kg) * options_.num_vnodes) /
                                 options_.num_key_groups);
  }
  uint32_t VnodeOfBytes(std::string_view key) const { return VnodeOfKeyGroup(KeyGroupOfBytes(key)); }
  uint32_t VnodeOfInt64(int64_t key) const { return VnodeOfKeyGroup(KeyGroupOfInt64(key)); }
  // The half-open key-group range [first, last) that `vnode` covers.
  void KeyGroupRange(uint32_t vnode, uint32_t* first, uint32_t* last) const;

  // Vectorized forms: n keys in, n results out. No allocation, no locking;
  // callers release the GIL around them.
  void KeyGroupsInt64(const int64_t* keys, size_t n, int32_t* out) const;
  void VnodesInt64(const int64_t* keys, size_t n, int32_t* out) const;
  void KeyGroupsBytes(const std::string_view* keys, size_t n, int32_t* out) const;
  void VnodesBytes(const std::string_view* keys, size_t n, int32_t* out) const;

 private:
  PartitionerOptions options_;
  unsigned shift_ = 64 - 15;
};

// The 8 little-endian bytes an int64 key is hashed and stored as.
inline void EncodeInt64Key(int64_t key, char out[8]) {
  uint64_t u = static_cast<uint64_t>(key);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((u >> (8 * i)) & 0xff);
}

}  // namespace rhino
