// Partitioner: key -> key group -> vnode (docs/design.md §1).
//
//   key group = top log2(K) bits of XXH3_64(key_bytes, seed)     unit of hashing
//   vnode     = floor(kg * V / K), a contiguous range of key groups  unit of migration
//
// An int64 key is hashed as its 8 little-endian bytes, so the int64 key k and
// the bytes key k.to_bytes(8, "little", signed=True) are the same key. A str
// key is its UTF-8 bytes. K and V are fixed for the lifetime of a job.
//
// Thread-safety: immutable after construction; safe to share across threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "rhino/status.h"

namespace rhino {

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

  uint64_t HashBytes(std::string_view key) const;
  uint64_t HashInt64(int64_t key) const;

  uint32_t KeyGroupOfHash(uint64_t h) const {
    // K == 1 has zero bits; a shift by 64 is undefined behaviour in C++.
    return shift_ == 64 ? 0u : static_cast<uint32_t>(h >> shift_);
  }
  uint32_t VnodeOfKeyGroup(uint32_t kg) const {
    return static_cast<uint32_t>((static_cast<uint64_t>(kg) * options_.num_vnodes) /
                                 options_.num_key_groups);
  }
  uint32_t VnodeOfBytes(std::string_view key) const {
    return VnodeOfKeyGroup(KeyGroupOfHash(HashBytes(key)));
  }
  uint32_t VnodeOfInt64(int64_t key) const {
    return VnodeOfKeyGroup(KeyGroupOfHash(HashInt64(key)));
  }
  // The half-open key-group range [first, last) that `vnode` covers.
  void KeyGroupRange(uint32_t vnode, uint32_t* first, uint32_t* last) const;

  // Vectorized forms: n keys in, n results out. No allocation, no locking;
  // callers release the GIL around them.
  void KeyGroupsInt64(const int64_t* keys, size_t n, int32_t* out) const;
  void VnodesInt64(const int64_t* keys, size_t n, int32_t* out) const;

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
