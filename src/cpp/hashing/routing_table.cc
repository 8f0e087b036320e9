#include "rhino/routing_table.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <string>

namespace rhino {
namespace {

uint64_t RingPosition(uint32_t tag, uint32_t a, uint32_t b, uint64_t seed) {
  uint32_t buf[3] = {tag, a, b};
  return XXH3_64bits_withSeed(buf, sizeof(buf), seed);
}
constexpr uint32_t kVnodeTag = 0x766e6f64;     // "vnod"
constexpr uint32_t kInstanceTag = 0x696e7374;  // "inst"

}  // namespace

Status RoutingTable::FromRing(const RingOptions& o, uint64_t epoch, RoutingTable* out) {
  if (o.num_vnodes == 0) return Status::InvalidArgument("num_vnodes must be >= 1");
  if (o.num_instances == 0) return Status::InvalidArgument("num_instances must be >= 1");
  if (o.num_instances > o.num_vnodes) {
    return Status::InvalidArgument("num_instances (" + std::to_string(o.num_instances) +
                                   ") exceeds num_vnodes (" + std::to_string(o.num_vnodes) +
                                   "): an instance would hold no vnode");
  }
  if (o.tokens_per_instance == 0) return Status::InvalidArgument("tokens_per_instance must be >= 1");

  const uint32_t v_count = o.num_vnodes;
  std::vector<uint64_t> vpos(v_count);
  for (uint32_t v = 0; v < v_count; ++v) vpos[v] = RingPosition(kVnodeTag, v, 0, o.seed);

  // Build the table for p = 1, 2, ..., num_instances instances. Adding
  // instance q takes floor(V/(q+1)) vnodes, each from the currently most-loaded
  // instance, choosing that instance's vnode closest (clockwise) to one of q's
  // tokens: the vnode a plain ring would have handed to q first. The result
  // is deterministic, balanced (loads differ by at most one), and table(p+1)
  // differs from table(p) only in the vnodes the new instance took.
  std::vector<int32_t> owner(v_count, 0);
  std::vector<uint32_t> load(o.num_instances, 0);
  load[0] = v_count;
  std::vector<uint64_t> tokens(o.tokens_per_instance);
  std::vector<std::pair<uint64_t, uint32_t>> order(v_count);
  for (uint32_t q = 1; q < o.num_instances; ++q) {
    for (uint32_t t = 0; t < o.tokens_per_instance; ++t) tokens[t] = RingPosition(kInstanceTag, q, t, o.seed);
    std::sort(tokens.begin(), tokens.end());
    for (uint32_t v = 0; v < v_count; ++v) {
      auto it = std::lower_bound(tokens.begin(), tokens.end(), vpos[v]);
      uint64_t tok = it == tokens.end() ? tokens.front() : *it;
      order[v] = {tok - vpos[v] /* clockwise distance, mod 2^64 */, v};
    }
    std::sort(order.begin(), order.end());
    std::vector<std::deque<uint32_t>> candidates(q);
    for (const auto& [dist, v] : order) candidates[owner[v]].push_back(v);
    const uint32_t take = v_count / (q + 1);
    for (uint32_t n = 0; n < take; ++n) {
      uint32_t donor = 0;
      for (uint32_t i = 1; i < q; ++i)
        if (load[i] > load[donor]) donor = i;
      uint32_t v = candidates[donor].front();
      candidates[donor].pop_front();
      owner[v] = static_cast<int32_t>(q);
      --load[donor];
      ++load[q];
    }
  }
  out->epoch_ = epoch;
  out->num_instances_ = o.num_instances;
  out->owner_ = std::move(owner);
  return Status::OK();
}

Status RoutingTable::FromAssignment(std::vector<int32_t> vnode_to_instance, uint32_t num_instances,
                                    uint64_t epoch, RoutingTable* out) {
  if (vnode_to_instance.empty()) return Status::InvalidArgument("assignment is empty");
  for (size_t v = 0; v < vnode_to_instance.size(); ++v) {
    int32_t i = vnode_to_instance[v];
    if (i < 0 || static_cast<uint32_t>(i) >= num_instances) {
      return Status::InvalidArgument("vnode " + std::to_string(v) + " assigned to instance " +
                                     std::to_string(i) + ", outside [0, " +
                                     std::to_string(num_instances) + ")");
    }
  }
  out->epoch_ = epoch;
  out->num_instances_ = num_instances;
  out->owner_ = std::move(vnode_to_instance);
  return Status::OK();
}

Status RoutingTable::InstancesOf(const int32_t* vnodes, size_t n, int32_t* out) const {
  const int64_t v_count = static_cast<int64_t>(owner_.size());
  for (size_t i = 0; i < n; ++i) {
    if (vnodes[i] < 0 || vnodes[i] >= v_count) {
      return Status::UnknownVnode("vnode " + std::to_string(vnodes[i]) + " is outside [0, " +
                                  std::to_string(v_count) + ")");
    }
  }
  for (size_t i = 0; i < n; ++i) out[i] = owner_[vnodes[i]];
  return Status::OK();
}

std::vector<int32_t> RoutingTable::VnodesOf(int32_t instance) const {
  std::vector<int32_t> r;
  for (size_t v = 0; v < owner_.size(); ++v)
    if (owner_[v] == instance) r.push_back(static_cast<int32_t>(v));
  return r;
}

Status RoutingTable::Reassign(const std::vector<int32_t>& vnodes, int32_t target,
                              RoutingTable* out) const {
  if (target < 0 || static_cast<uint32_t>(target) > num_instances_) {
    return Status::InvalidArgument("target instance " + std::to_string(target) +
                                   " is neither an existing instance nor the next new one (" +
                                   std::to_string(num_instances_) + ")");
  }
  std::vector<int32_t> owner = owner_;
  for (int32_t v : vnodes) {
    if (v < 0 || static_cast<size_t>(v) >= owner.size())
      return Status::UnknownVnode("vnode " + std::to_string(v) + " is outside [0, " +
                                  std::to_string(owner.size()) + ")");
    owner[v] = target;
  }
  uint32_t n = std::max<uint32_t>(num_instances_, static_cast<uint32_t>(target) + 1);
  return FromAssignment(std::move(owner), n, epoch_ + 1, out);
}

}  // namespace rhino
