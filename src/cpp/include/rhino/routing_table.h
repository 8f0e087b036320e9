// RoutingTable: vnode -> instance, versioned by a configuration epoch (docs/design.md §1).
//
// The initial table comes from a consistent-hash ring with `tokens_per_instance`
// tokens per instance (the ring's "virtual nodes"). The ring decides *which*
// vnodes an instance takes; a fair-share bound decides *how many*, so the
// ring's variance never unbalances instances:
//   * every instance holds floor(V/p) or ceil(V/p) vnodes;
//   * the table for p+1 instances differs from the table for p only in the
//     vnodes the new instance takes, at most ceil(V/(p+1)) of them.
// After creation the table is explicit and changes only by handovers, each of
// which produces a new table with epoch + 1 (Rhino §4.1.1).
//
// Thread-safety: immutable; "mutations" return a new table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "rhino/status.h"

namespace rhino {

struct RingOptions {
  uint32_t num_vnodes = 256;
  uint32_t num_instances = 1;
  uint32_t tokens_per_instance = 64;
  uint64_t seed = 0;
};

class RoutingTable {
 public:
  RoutingTable() = default;

  static Status FromRing(const RingOptions& options, uint64_t epoch, RoutingTable* out);
  // An explicit table; every entry must be < num_instances.
  static Status FromAssignment(std::vector<int32_t> vnode_to_instance, uint32_t num_instances,
                               uint64_t epoch, RoutingTable* out);

  uint64_t epoch() const { return epoch_; }
  uint32_t num_vnodes() const { return static_cast<uint32_t>(owner_.size()); }
  uint32_t num_instances() const { return num_instances_; }
  const std::vector<int32_t>& assignment() const { return owner_; }

  // REQUIRES: vnode < num_vnodes().
  int32_t InstanceOf(uint32_t vnode) const { return owner_[vnode]; }
  // Vectorized; returns UnknownVnode (and writes nothing) on an out-of-range vnode.
  Status InstancesOf(const int32_t* vnodes, size_t n, int32_t* out) const;
  std::vector<int32_t> VnodesOf(int32_t instance) const;

  // A new table with `vnodes` reassigned to `target` and epoch + 1: the routing
  // side of a handover. `target` may be a new instance id (== num_instances()).
  Status Reassign(const std::vector<int32_t>& vnodes, int32_t target, RoutingTable* out) const;

 private:
  uint64_t epoch_ = 0;
  uint32_t num_instances_ = 0;
  std::vector<int32_t> owner_;
};

}  // namespace rhino
