// InstanceDir: where a worker keeps the instances it hosts (docs/design.md §2
// "state service", docs/protocol.md §7.1).
//
// On disk, under <state_dir>/instances/<operator_id>/<instance>/ (the one
// place that knows this layout is this class):
//   instance.json   the configuration below, written atomically
//   placement.json  a placement a re-open deferred (HostedInstance::DeferPlacement),
//                   read over instance.json by a restarted worker while it is newer
//   db-<hex>/       the live RocksDB (a rollback builds a new one and switches)
//   CLOSED          a marker: the instance was closed (§7.1 close), so a
//                   restarted worker does not host it again; `open` reopens it
// and <state_dir>/tmp/ holds the work directories of imports and moves.
//
// Thread-safety: an InstanceDir is immutable once built, so any thread may
// use it; its owner orders the writes (HostedInstance: instance.json and
// CLOSED under mu(), placement.json under its own mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "net/service_messages.h"
#include "rhino/partitioner.h"
#include "rhino/status.h"

namespace rhino {

// What a worker persists about an instance it hosts.
struct InstanceConfig {
  std::string operator_id;
  uint32_t instance = 0;
  uint64_t epoch = 0;
  PartitionerOptions partitioner;
  std::vector<uint32_t> vnodes;     // the vnodes held (an empty state is created with these)
  std::vector<std::string> chain;   // "host:port" of the replica chain w1..wr (may be empty: r = 0)
  uint64_t chain_version = 0;
  std::string db_name;              // the live RocksDB's directory name
  // The chain may hold checkpoints after `discard_after` (none: any) that a
  // rollback or takeover dropped here; they go before the next replication.
  // Persisted: a worker restarted in between must still drop them (§7.3).
  bool discard_pending = false;
  std::optional<uint64_t> discard_after;
  // The reconfiguration applied on top of checkpoint `redo_version` (a
  // handover at the barrier after that batch). Checkpoint b itself predates
  // it, so whenever the state is rebuilt at version b (a rollback for a
  // re-executed batch b+1, a restart, a takeover) these steps run again. Kept
  // until checkpoint b+2 is complete: batch b+1 can no longer run again then.
  std::optional<uint64_t> redo_version;
  std::vector<ReconfigOp> redo;
};

// "operator/instance", as errors and logs name an instance.
inline std::string Describe(const InstanceConfig& c) { return c.operator_id + "/" + std::to_string(c.instance); }

// Parses instance.json (written by InstanceDir::SaveConfig). Corruption if
// it is malformed or names an operator or a db that is not a plain name (it
// would lead out of the state directory).
Status ParseInstanceConfig(const std::string& text, InstanceConfig* out);

class InstanceDir {
 public:
  // ---- the state directory ----
  // Creates <state_dir>/instances and empties <state_dir>/tmp (the work of
  // imports and moves a killed worker left behind).
  static Status PrepareStateDir(const std::string& state_dir);
  // <state_dir>/tmp: what PrepareStateDir empties, for others' work too.
  static std::string TmpDir(const std::string& state_dir);
  // The configurations of the instances under state_dir that were not closed:
  // a restarted worker hosts them again. `bad` gets the name ("op/instance")
  // and error of each one whose instance.json is damaged.
  static Status ListHostable(const std::string& state_dir, std::vector<InstanceConfig>* out,
                             const std::function<void(const std::string&, const Status&)>& bad);
  // The saved configuration of (operator_id, instance), if it was hosted here
  // before: NotFound if it never was. The caller has checked operator_id
  // (IsValidOperatorId): it is a directory name here.
  static Status ReadSavedConfig(const std::string& state_dir, const std::string& operator_id, uint32_t instance,
                                InstanceConfig* out);
  // A fresh name for a live RocksDB directory: a rollback, takeover or rebuild
  // builds the state beside the old one, then switches.
  static std::string NewDbName();

  // ---- one instance's directory ----
  InstanceDir(const std::string& state_dir, const std::string& operator_id, uint32_t instance);
  // <state_dir>/instances/<operator_id>/<instance>
  const std::string& path() const { return path_; }
  std::string DbDir(const std::string& db_name) const;
  // instance.json, for a caller that makes an unsynced save durable itself.
  std::string ConfigPath() const;
  // A fresh work directory (not created) under <state_dir>/tmp for an import
  // or a move (`kind`).
  std::string WorkDir(const std::string& kind) const;
  Status Create() const;
  // Writes instance.json atomically (creating the directory). sync false:
  // atomic but not yet durable (a takeover's, made durable in the background
  // with its DB directory: ConfigPath).
  Status SaveConfig(const InstanceConfig& config, bool sync = true) const;
  // placement.json, durable: a placement newer than instance.json until that
  // is saved again (ListHostable and ReadSavedConfig read it over it).
  Status SavePlacement(uint64_t epoch, const std::vector<std::string>& chain, uint64_t chain_version) const;
  // The CLOSED marker: set durably by a close, cleared by hosting again.
  Status MarkClosed() const;
  void ClearClosed() const;

 private:
  std::string state_dir_;
  std::string path_;
};

}  // namespace rhino
