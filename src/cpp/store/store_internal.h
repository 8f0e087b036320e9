// What the replica store's files share (replica_store.cc, store_restore.cc,
// store_gc.cc). Internal to the store folder.
#pragma once

#include <cstdint>
#include <string>

namespace rhino::store_internal {

// "<20-digit id>.manifest": a committed checkpoint's manifest in its
// instance's directory.
std::string ManifestName(uint64_t checkpoint_id);

// "<kind>-<pid>-<nonce>" after `prefix`: true if the pid that made it no
// longer runs (its staging directory or file is left over from a crash).
bool StagingOwnerDead(const std::string& name, const std::string& prefix);

}  // namespace rhino::store_internal
